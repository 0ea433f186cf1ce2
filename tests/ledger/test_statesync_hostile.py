"""State sync against hostile peers (issue 23, findings 3 and 4), over real libp2p hosts on 127.0.0.1 and real
LevelDB: a crashing offer of every shape never escapes state sync, a lying manifest is refused before any of its
chunks is fetched, a chunk dripped just under the request timeout cannot stall the sync, a manifest of invented
chunks under a real header costs at most its fetch and is then refused, and the chunks of a sync go to a spool
on disk that is removed afterwards."""

from __future__ import annotations

import os

import pytest
import trio

from node.encoding import pack
from node.ledger import snapshot as snap, statesync as ss
from node.ledger.core.block import Header, sign_commit
from node.ledger.core.chain import commit_block, propose
from node.ledger.store import LedgerStore
from node.p2p.framing import read_msg, write_msg
from tests.p2p.util import run, running_hosts

from .helpers import KEYS, VALIDATOR, make_genesis
from .test_store import grow

SNAP_HEIGHT = 12


class Scripted:
    """A peer that answers the snapshot protocol with ``script(msg)``: a reply map, or a coroutine function
    ``(stream) -> None`` that does something else with the stream. Records every op it is asked."""

    def __init__(self, script):
        self.script, self.ops = script, []

    async def handle(self, stream, peer):
        msg = await read_msg(stream, timeout=10)
        self.ops.append(msg.get("op"))
        got = self.script(msg)
        if callable(got):
            await got(stream)
        else:
            await write_msg(stream, got)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A ledger of 13 blocks whose state after block 12 is snapshotted on disk in several chunks."""
    tmp = tmp_path_factory.mktemp("src")
    g = make_genesis()
    src = LedgerStore(tmp / "ledger", g)
    state = grow(src, src.replay(), g, SNAP_HEIGHT)
    server = ss.SnapshotServer(src, every=SNAP_HEIGHT, chunk_bytes=700, directory=tmp / "snapshots")
    trio.run(server.on_block, SNAP_HEIGHT)
    block, new, _ = propose(state, [], VALIDATOR, 9000, src.last_commit())  # block 13 certifies state 12
    src.append(block, commit_block(VALIDATOR, block), state, new)
    assert len(server.manifest.chunks) > 2
    yield g, src, server
    src.close()


def honest_offer(src, m: snap.Manifest) -> dict:
    raw = src.get_block_raw(m.height + 1)
    return {"status": "ok", "manifest": m.to_wire(), "block": {"b": {"h": raw["b"]["h"]}, "c": raw["c"]}}


def forged(m: snap.Manifest, header: Header) -> tuple[snap.Manifest, list, list]:
    """A manifest of height 10**12 and a header after it that commits to it, signed by a non-validator."""
    big = snap.Manifest(m.chain_id, 10**12, os.urandom(32), m.seq, m.counts, m.root, m.chunks)
    h = Header(header.chain_id, 10**12 + 1, big.last_hash, header.time_ms, header.proposer, header.tx_root,
               header.state_root)
    commit = [list(sign_commit(KEYS[6], h.chain_id, h.height, h.hash))]
    return big, [h.chain_id, *h.fields()], commit


def hostile_offers(src, m: snap.Manifest) -> dict[str, object]:
    """Offers that must each be refused before any chunk is asked for: name -> reply (or stream action)."""
    good = honest_offer(src, m)
    h, c = good["block"]["b"]["h"], good["block"]["c"]
    header = Header(*h)
    big, big_h, big_c = forged(m, header)
    wire = m.to_wire()

    def with_manifest(w):
        return {**good, "manifest": w}

    def with_block(b):
        return {**good, "block": b}

    async def never(stream):
        await trio.sleep(60)

    async def not_a_map(stream):
        await write_msg(stream, [1, 2, 3])  # framing: a reply must be a map

    return {
        "commit is 5": with_block({"b": {"h": h}, "c": 5}),  # finding 3: TypeError in check_commit
        "commit of ints": with_block({"b": {"h": h}, "c": [5, 6]}),
        "commit entry of wrong types": with_block({"b": {"h": h}, "c": [[[1], "r", {}]]}),
        "commit as a map": with_block({"b": {"h": h}, "c": {b"k": 1}}),
        "commit of 5,000 bad signatures by the validator": with_block({"b": {"h": h}, "c": [[c[0][0], 0, bytes(64)]]
                                                                                         * 5000}),
        "no commit": with_block({"b": {"h": h}}),
        "manifest garbage": with_manifest("garbage"),
        "manifest of ints": with_manifest([1, 2, 3, 4, 5, 6, 7]),
        "manifest unhashable": with_manifest([[1], [2], [3], [4], [5], [6], [7]]),
        "manifest with a map": with_manifest({"a": 1}),
        "block 5": with_block(5),
        "block b 5": with_block({"b": 5, "c": c}),
        "header short": with_block({"b": {"h": [1, 2]}, "c": c}),
        "header of maps": with_block({"b": {"h": [{}] * 7}, "c": c}),
        "header time a string": with_block({"b": {"h": [h[0], h[1], h[2], "t", *h[4:]]}, "c": c}),
        "empty ok": {"status": "ok"},
        "error reply": {"status": "error", "code": "internal", "message": "boom"},
        "not a map": not_a_map,
        "height 10^12, honest header": with_manifest(big.to_wire()),
        "height 10^12, forged header": {**good, "manifest": big.to_wire(), "block": {"b": {"h": big_h}, "c": big_c}},
        "65,535 chunks": with_manifest([*wire[:6], [os.urandom(32) for _ in range(65_535)]]),
        "another state root": with_manifest([*wire[:5], os.urandom(40), wire[6]]),
        "another chain": with_manifest(["other-chain", *wire[1:]]),
        "a chunk listed twice": with_manifest([*wire[:6], [wire[6][0]] * 2]),
        "never answers": never,
    }


def recorder(host):
    """Replace ``host.penalize`` by a list of ``(peer, weight)`` (so repeated runs are not cut by a ban)."""
    got: list[tuple[str, float]] = []
    host.penalize = lambda p, w, ban_s=None: got.append((p, w)) or False
    return got


def test_no_offer_shape_escapes_and_none_is_fetched(source, tmp_path):
    """Finding 3: each hostile offer, next to the honest one, is refused (its peer penalised, none of its chunks
    asked for) and the node syncs from the honest peer."""
    g, src, server = source
    offers = hostile_offers(src, server.manifest)
    current: dict = {}
    bad = Scripted(lambda msg: current["reply"] if msg.get("op") == "offer" else {"status": "ok", "data": b"x"})

    async def main():
        async with running_hosts(3) as (h_src, h_bad, h_dst):
            server.install(h_src)
            h_bad.set_handler(ss.SNAPSHOT_PROTOCOL, bad.handle)
            for h in (h_src, h_bad):
                assert await h_dst.connect(h.addrs) == 1
            penalties = recorder(h_dst)
            done = []
            for i, (name, reply) in enumerate(offers.items()):
                current["reply"] = reply
                penalties.clear()
                dst = LedgerStore(tmp_path / f"dst{i}", g)
                try:
                    synced = await ss.state_sync(dst, h_dst, [h_bad.peer_id, h_src.peer_id], timeout=3)
                    assert synced is not None and dst.base == SNAP_HEIGHT, name
                    assert [p for p, _ in penalties] == [h_bad.peer_id], (name, penalties)
                finally:
                    dst.close()
                done.append(name)
            return done

    done = run(main, timeout=240)
    assert done == list(offers)
    assert "chunk" not in bad.ops and bad.ops.count("offer") == len(offers)


def dripping(src, server) -> Scripted:
    """A peer that offers the honest manifest but sends each chunk 29 s late (just under the 30 s request
    timeout): one chunk a request would stall a sync of n chunks for n x 29 s."""
    offer = honest_offer(src, server.manifest)

    def script(msg):
        if msg.get("op") == "offer":
            return offer

        async def drip(stream):
            await trio.sleep(29)
            await write_msg(stream, {"status": "ok", "data": server.chunks[server.manifest.chunks[msg["index"]]]})
        return drip

    return Scripted(script)


def test_a_dripping_source_delays_nothing_an_honest_one_can_fetch(source, tmp_path):
    """Finding 4: beside the dripper, the honest source fetches every chunk (the dripper's one chunk too, in the
    endgame), so the sync ends long before a single dripped chunk would have arrived."""
    g, src, server = source
    dripper = dripping(src, server)

    async def main():
        async with running_hosts(3) as (h_src, h_drip, h_dst):
            server.install(h_src)
            h_drip.set_handler(ss.SNAPSHOT_PROTOCOL, dripper.handle)
            for h in (h_src, h_drip):
                assert await h_dst.connect(h.addrs) == 1
            recorder(h_dst)
            dst = LedgerStore(tmp_path / "dst", g)
            try:
                synced = await ss.state_sync(dst, h_dst, [h_drip.peer_id, h_src.peer_id], timeout=30)
                assert synced is not None and dst.base == SNAP_HEIGHT
            finally:
                dst.close()

    run(main, timeout=20)  # less than one dripped chunk
    assert dripper.ops.count("chunk") == 1  # it was asked once, then the honest source had done everything


def test_a_dripping_source_alone_runs_out_of_time(source, tmp_path):
    """Finding 4: with no one else to fetch from, the dripper gets its grace, is dropped and penalised, and state
    sync gives up (the node then follows the chain from genesis) instead of waiting n x 29 s."""
    g, src, server = source
    dripper = dripping(src, server)

    async def main():
        async with running_hosts(2) as (h_drip, h_dst):
            h_drip.set_handler(ss.SNAPSHOT_PROTOCOL, dripper.handle)
            assert await h_dst.connect(h_drip.addrs) == 1
            penalties = recorder(h_dst)
            dst = LedgerStore(tmp_path / "dst", g)
            try:
                synced = await ss.state_sync(dst, h_dst, [h_drip.peer_id], timeout=30,
                                             limits=ss.SyncLimits(grace_s=2.0))
                assert synced is None and dst.base == 0 and dst.head == 0
            finally:
                dst.close()
            return penalties, h_drip.peer_id

    penalties, drip_id = run(main, timeout=20)  # less than one dripped chunk
    assert penalties == [(drip_id, ss.SLOW)] and dripper.ops.count("chunk") == 1


def invented(src, m: snap.Manifest, n: int, size: int) -> tuple[snap.Manifest, dict[bytes, bytes]]:
    """A manifest under the real header (height, parent, root all right) listing ``n`` chunks of invented
    entries of about ``size`` bytes each: it passes every check before download."""
    chunks = {}
    for i in range(n):
        data = pack([[0, bytes([i]) + os.urandom(31), os.urandom(size)]])
        chunks[snap.chunk_id(data)] = data
    fake = snap.Manifest(m.chain_id, m.height, m.last_hash, m.seq, m.counts, m.root, tuple(chunks))
    return fake, chunks


@pytest.mark.parametrize("fewer", [True, False])
def test_invented_chunks_under_a_real_header_cost_at_most_their_fetch(source, tmp_path, fewer):
    """What no header binds (the chunk ids): a manifest with fewer chunks than the honest one is tried first,
    fetched to the spool, refused by the state root and its peer penalised; one with more is never fetched."""
    g, src, server = source
    n = len(server.manifest.chunks) - 1 if fewer else len(server.manifest.chunks) + 3
    fake, chunks = invented(src, server.manifest, n, 600)
    liar_offer = {**honest_offer(src, server.manifest), "manifest": fake.to_wire()}

    def script(msg):
        if msg.get("op") == "offer":
            return liar_offer
        return {"status": "ok", "data": chunks[fake.chunks[msg["index"]]]}

    liar = Scripted(script)
    spool = tmp_path / "spool"

    async def main():
        async with running_hosts(3) as (h_src, h_liar, h_dst):
            server.install(h_src)
            h_liar.set_handler(ss.SNAPSHOT_PROTOCOL, liar.handle)
            for h in (h_src, h_liar):
                assert await h_dst.connect(h.addrs) == 1
            penalties = recorder(h_dst)
            dst = LedgerStore(tmp_path / "dst", g)
            try:
                synced = await ss.state_sync(dst, h_dst, [h_liar.peer_id, h_src.peer_id], timeout=10,
                                             spool_dir=spool)
                assert synced is not None and dst.base == SNAP_HEIGHT
            finally:
                dst.close()
            return penalties, h_liar.peer_id

    penalties, liar_id = run(main, timeout=60)
    if fewer:
        assert liar.ops.count("chunk") == n and penalties == [(liar_id, ss.LYING)]
    else:
        assert liar.ops == ["offer"] and penalties == []
    assert spool.is_dir() and not list(spool.iterdir())  # the spools were removed


def test_the_bytes_of_one_snapshot_are_bounded(source, tmp_path):
    """A manifest whose chunks pass ``SyncLimits.max_bytes`` is not fetched past it."""
    g, src, server = source
    fake, chunks = invented(src, server.manifest, 1, 20_000)
    liar = Scripted(lambda msg: {**honest_offer(src, server.manifest), "manifest": fake.to_wire()}
                    if msg.get("op") == "offer" else {"status": "ok", "data": chunks[fake.chunks[0]]})
    honest_bytes = sum(len(server.chunks[c]) for c in server.manifest.chunks)

    async def main():
        async with running_hosts(3) as (h_src, h_liar, h_dst):
            server.install(h_src)
            h_liar.set_handler(ss.SNAPSHOT_PROTOCOL, liar.handle)
            for h in (h_src, h_liar):
                assert await h_dst.connect(h.addrs) == 1
            recorder(h_dst)
            dst = LedgerStore(tmp_path / "dst", g)
            try:
                limits = ss.SyncLimits(max_bytes=max(honest_bytes, 10_000))
                synced = await ss.state_sync(dst, h_dst, [h_liar.peer_id, h_src.peer_id], timeout=10,
                                             limits=limits)
                return synced is not None and dst.base == SNAP_HEIGHT
            finally:
                dst.close()

    assert run(main, timeout=60)
    assert liar.ops == ["offer", "chunk"]  # its one chunk passed the bound: nothing was restored from it


def test_check_manifest_binds_the_manifest_to_its_header(source):
    g, src, server = source
    m = server.manifest
    header = Header(*src.get_block_raw(m.height + 1)["b"]["h"])
    snap.check_manifest(m, header, g.domain)
    with pytest.raises(snap.SnapshotError, match=r"snapshot for chain 'test-chain'.*this is chain 'other'"):
        snap.check_manifest(m, header, "other")
    with pytest.raises(snap.SnapshotError, match="does not commit"):
        snap.check_manifest(snap.Manifest(*[*m.to_wire()[:1], m.height + 1, *m.to_wire()[2:4], m.counts,
                                            m.root, m.chunks]), header, g.domain)
    with pytest.raises(snap.SnapshotError, match="chunks \\(1 to 2 accepted\\)"):
        snap.check_manifest(m, header, g.domain, max_chunks=2)
    with pytest.raises(snap.SnapshotError, match="entries"):
        snap.check_manifest(snap.Manifest(m.chain_id, m.height, m.last_hash, m.seq, (1,) + (0,) * (len(m.counts) - 1),
                                          m.root, m.chunks), header, g.domain)


def test_a_source_that_is_always_busy_runs_out_of_time(source, tmp_path):
    """A peer that offers the honest manifest and answers every chunk request ``busy`` at once is asked again
    after a pause that counts against its time: it is dropped and penalised, and the sync ends."""
    g, src, server = source
    offer = honest_offer(src, server.manifest)
    busy = Scripted(lambda msg: offer if msg.get("op") == "offer"
                    else {"status": "error", "code": "busy", "message": "try again later"})

    async def main():
        async with running_hosts(2) as (h_busy, h_dst):
            h_busy.set_handler(ss.SNAPSHOT_PROTOCOL, busy.handle)
            assert await h_dst.connect(h_busy.addrs) == 1
            penalties = recorder(h_dst)
            dst = LedgerStore(tmp_path / "dst", g)
            try:
                synced = await ss.state_sync(dst, h_dst, [h_busy.peer_id], timeout=30,
                                             limits=ss.SyncLimits(grace_s=3.0))
                assert synced is None and dst.base == 0
            finally:
                dst.close()
            return penalties, h_busy.peer_id

    penalties, busy_id = run(main, timeout=30)
    assert penalties == [(busy_id, ss.SLOW)] and 1 <= busy.ops.count("chunk") <= 4
