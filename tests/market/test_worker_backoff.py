"""A job the worker cannot train (every attempt raises) is retried with exponential backoff, not at every block."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import trio
import trio.testing

from node.identity import Identity
from node.ledger.core.jobstate import ACCEPTED
from node.market.worker import JobWorker


def worker_holding(jid: bytes):
    """A JobWorker whose ledger shows job ``jid`` accepted by it; returns (worker, state, block hooks)."""
    ident = Identity.generate()
    # a started job (a segment is on the ledger): it cannot be released, so the worker retries it
    job = SimpleNamespace(status=ACCEPTED, worker=ident.account, segments=(b"r" * 32,))
    tables = {"jobs": {jid: job}, "open_jobs": {jid: None}}  # the jobs module's tables (node.ledger.core.jobstate)
    state = SimpleNamespace(tables=tables, ordered=tables.__getitem__, height=1,
                            account=lambda a: SimpleNamespace(bond=100))
    hooks = []
    ledger = SimpleNamespace(state=state, genesis=SimpleNamespace(params=SimpleNamespace(min_bond=10)),
                             on_block=hooks.append)
    return JobWorker(ident, ledger, None, None, None, None, b"m" * 32), state, hooks


def test_failing_job_is_retried_with_backoff_not_every_block():
    jid = b"j" * 16
    w, state, hooks = worker_holding(jid)
    attempts = []

    async def train(j):
        attempts.append(trio.current_time())
        raise RuntimeError("peft: target modules not found")

    w.train = train

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(w.run)
            for _ in range(120):  # a block every 0.5 s for 60 s
                hooks[0](None, state)
                await trio.sleep(0.5)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert 4 <= len(attempts) <= 6, attempts  # 0, 2, 6, 14, 30 s (+ block granularity), not 120 tries
    assert all(g2 > g1 for g1, g2 in itertools.pairwise(gaps)), gaps  # the wait doubles
    assert not w.training and w.failures[jid][0] == len(attempts)


def test_backoff_is_capped_and_never_overflows():
    """2 ** n for n past 1023 would overflow a float; the wait stays at 5 minutes however often a job fails."""
    jid = b"k" * 16
    w, state, hooks = worker_holding(jid)
    w.failures[jid] = (5000, 0.0)

    async def train(j):
        raise RuntimeError("dataset unavailable")

    w.train = train

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(w.run)
            hooks[0](None, state)
            await trio.sleep(1)
            assert w.failures[jid][0] == 5001 and w.failures[jid][1] - trio.current_time() > 290
            state.tables["open_jobs"].clear()  # the job expired: its failure record goes at the next block
            hooks[0](None, state)
            await trio.sleep(1)
            assert jid not in w.failures
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
