"""TorchExecutor keeps torch off the trio loop and serializes calls."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import trio

from node.compute.executor import TorchExecutor


def test_runs_off_loop_serialized_and_propagates():
    ex = TorchExecutor(threads=torch.get_num_threads())
    loop_thread = threading.get_ident()
    active, peak, seen = [0], [0], []

    def work(i):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        seen.append(threading.get_ident())
        time.sleep(0.02)
        r = float(torch.ones(4).sum()) + i
        active[0] -= 1
        return r

    def boom():
        raise KeyError("x")

    async def main():
        results = {}

        async def one(i):
            results[i] = await ex.run(work, i)

        ticks = [0]

        async def ticker():  # the loop stays responsive while torch work runs
            for _ in range(5):
                ticks[0] += 1
                await trio.sleep(0.005)

        async with trio.open_nursery() as n:
            n.start_soon(ticker)
            for i in range(4):
                n.start_soon(one, i)
        assert results == {i: 4.0 + i for i in range(4)}
        assert ticks[0] == 5
        with pytest.raises(KeyError):
            await ex.run(boom)

    trio.run(main)
    assert peak[0] == 1
    assert loop_thread not in seen


def test_threads_validated():
    with pytest.raises(ValueError):
        TorchExecutor(0)
