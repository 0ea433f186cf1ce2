"""Blobs served from disk in frames under the reply budget (node.blobs.serve_blob), real libp2p on 127.0.0.1: a
fetched blob checks against its root and equals what the old in-memory handler sent; a reader that never reads is
cut at the write deadline and its budget comes back; errors are replies."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import trio

from node.blobs import BLOB_PROTOCOL, BlobStore, fetch_blob, serve_blob
from node.encoding import pack, tensor_to_wire
from node.p2p.budget import ReplyBudget
from node.p2p.filesend import STREAM_HOLD
from node.p2p.framing import RemoteError, StreamClosed, check_reply, read_msg, write_msg

from .util import run, running_hosts


def tensors(n: int, size: int) -> list:
    rng = np.random.default_rng(n)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(n)]


def test_blob_streamed_fetched_and_checked(tmp_path):
    store = BlobStore(tmp_path / "server")
    ts = tensors(6, 1 << 20)  # 6 tensors of 4 MiB: a 24 MiB blob file
    root = store.put(ts)
    budget = ReplyBudget()

    async def main():
        async with running_hosts(2) as (srv, cli):
            srv.set_handler(BLOB_PROTOCOL, partial(serve_blob, store, budget))
            assert await cli.connect(srv.addrs) == 1
            got = await fetch_blob(cli, BlobStore(tmp_path / "client"), root, [srv.identity.account], timeout=60)
            raw = await cli.request(srv.peer_id, BLOB_PROTOCOL, {"type": "get", "root": root}, timeout=60)
            codes = []
            for msg in ({"type": "get", "root": b"\x00" * 32}, {"type": "get", "root": 5}):
                with pytest.raises(RemoteError) as e:
                    await cli.request(srv.peer_id, BLOB_PROTOCOL, msg, timeout=10)
                codes.append(e.value.code)
            return got, raw, codes

    got, raw, codes = run(main, timeout=120)
    assert all(np.array_equal(a, b) for a, b in zip(got, ts, strict=True))
    # the streamed file is the very encoding the old handler packed from the unpacked file
    assert pack(raw["tensors"]) == pack([tensor_to_wire(t) for t in ts])
    assert codes == ["not_found", "bad_request"]
    assert budget.whole()


def test_blob_reader_that_never_reads_is_cut(tmp_path):
    store = BlobStore(tmp_path / "server")
    root = store.put(tensors(4, 1 << 20))
    budget = ReplyBudget(per_peer=STREAM_HOLD, node_wide=STREAM_HOLD, wait=0.2)

    async def main():
        async with running_hosts(2) as (srv, cli):
            srv.set_handler(BLOB_PROTOCOL, partial(serve_blob, store, budget, stall=1.0))
            assert await cli.connect(srv.addrs) == 1
            streams = []
            for _ in range(2):
                s = await cli.open_stream(srv.peer_id, BLOB_PROTOCOL)
                await write_msg(s, {"type": "get", "root": root}, timeout=5)
                streams.append(s)
            await trio.sleep(0.5)
            during = budget.in_flight
            with trio.fail_after(15):
                while not budget.whole():
                    await trio.sleep(0.05)
            out = []
            for s in streams:
                try:
                    check_reply(await read_msg(s, timeout=5, max_message=64 << 20))
                    out.append("whole")
                except RemoteError as e:
                    out.append(e.code)
                except StreamClosed:
                    out.append("cut")
            return during, sorted(out)

    during, out = run(main, timeout=60)
    assert during == STREAM_HOLD
    assert out == ["busy", "cut"]
    assert budget.whole()
