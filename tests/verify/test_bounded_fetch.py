"""Bounded model fetches for committees (issue 24, finding 4), on real libp2p hosts with real block servers and the
tiny model: a member fetches only models that enough bonded servers announce (nothing is asked or written
otherwise; a peer named only by the receipt does not count), each model and all of them stay within byte caps
(least recently used fetched model evicted first, never a kept one), fetches of two models do not wait for each
other, and a fetch past its deadline gives up."""

from __future__ import annotations

import os

import pytest
import trio

from node.compute.model import block_file, load_manifest, make_tiny
from node.ledger.core.genesis import GenesisError, Params
from node.ledger.genesis import load_genesis, parse_genesis
from node.verify.blockfetch import BLOCK_PROTOCOL, REQUEST_MAX, BlockFetcher, FetchRefused, HeldModels, bonded_peers
from node.verify.fetchstore import USED_FILE, FetchedModels
from tests.p2p.util import running_hosts


@pytest.fixture(scope="module")
def tiny3(tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    return [make_tiny(cache, seed=s) for s in (0, 1, 2)]


def files_under(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def serve(host, dirs, tmp, calls: list, stall: bytes | None = None):
    """``host`` serves the model dirs ``dirs`` over BLOCK_PROTOCOL, recording ``(type, model id)`` per request;
    requests for model ``stall`` are never answered."""
    held = HeldModels(dirs[0], tmp / f"held-{host.peer_id[-6:]}")
    for d in dirs[1:]:
        held.add(d)

    async def handle(msg: dict, peer: str) -> dict:
        calls.append((msg.get("type"), msg.get("model_id")))
        if stall is not None and msg.get("model_id") == stall:
            await trio.sleep_forever()
        return await held.handle(msg, peer)

    host.set_request_handler(BLOCK_PROTOCOL, handle, max_message=REQUEST_MAX)


def test_nothing_is_fetched_for_a_model_too_few_bonded_servers_announce(tmp_path, tiny3):
    a_dir = tiny3[0]
    a = load_manifest(a_dir)

    async def main():
        with trio.fail_after(90):
            async with running_hosts(3) as (s1, s2, member):
                calls: list = []
                for s in (s1, s2):
                    serve(s, [a_dir], tmp_path, calls)
                assert await member.connect(s1.addrs + s2.addrs) == 2
                announced: dict[bytes, list[str]] = {}
                bonded_set = {s1.peer_id}
                root = tmp_path / "fetched"

                def fetcher(n: int) -> BlockFetcher:
                    return BlockFetcher(member, root, lambda mid, i: announced.get(mid, []), timeout=20,
                                        bonded=lambda p: p in bonded_set, min_servers=n)

                out = {}
                # nobody announces the model: refused before any request, even with the receipt's worker named
                with pytest.raises(FetchRefused, match="announced by 0 bonded"):
                    await fetcher(1).ensure(a.model_id, 0, 3, [s1.peer_id])
                # announced by an unbonded peer only
                announced[a.model_id] = [s2.peer_id]
                with pytest.raises(FetchRefused, match="announced by 0 bonded"):
                    await fetcher(1).ensure_model(a.model_id, [s1.peer_id])
                out["calls_refused"], out["files_refused"] = list(calls), files_under(root)
                # one bonded server, two required
                announced[a.model_id] = [s1.peer_id, s2.peer_id, member.peer_id]  # this node never counts
                with pytest.raises(FetchRefused, match=r"announced by 1 bonded server.*fewer than the 2"):
                    await fetcher(2).ensure(a.model_id, 0, 3)
                out["calls_refused2"] = list(calls)
                # two bonded servers: fetched and checked
                bonded_set.add(s2.peer_id)
                out["dir"] = await fetcher(2).ensure(a.model_id, 0, 3)
                out["calls_ok"] = list(calls)
                # fetched blocks are used without asking, announced or not
                announced.clear()
                calls.clear()
                assert await fetcher(2).ensure(a.model_id, 1, 3) == out["dir"]
                out["calls_again"] = list(calls)
                return out

    out = trio.run(main)
    assert out["calls_refused"] == [] and out["files_refused"] == [] and out["calls_refused2"] == []
    d = out["dir"]
    kinds = [t for t, _ in out["calls_ok"]]  # each block in checked chunks: its index, then its ranges
    assert kinds.count("index") == 3 and kinds.count("range") >= 3 and "block" not in kinds
    assert {m for _, m in out["calls_ok"]} == {a.model_id}
    for i in range(3):
        assert (d / block_file(i)).read_bytes() == (a_dir / block_file(i)).read_bytes()
    assert out["calls_again"] == []


def test_bonded_peers_reads_the_ledger_state():
    from node.identity import Identity, account_to_str
    from node.ledger.core.state import genesis_state
    from tests.e2e.swarm import tiny_genesis

    g = tiny_genesis(2)
    s = genesis_state(g)
    bonded = bonded_peers(lambda: s)
    server, client = g.balances[1][0], g.balances[0][0]  # node 1 is bonded, node 0 (client) is not
    assert bonded(account_to_str(server)) and not bonded(account_to_str(client))
    assert not bonded(Identity.generate().peer_id) and not bonded("not-a-peer-id")


def test_byte_caps_and_least_recently_used_eviction(tmp_path, tiny3):
    ms = [load_manifest(d) for d in tiny3]
    model_bytes = sum(os.path.getsize(d / block_file(i)) for d in tiny3[:1] for i in range(6))

    async def main():
        with trio.fail_after(120):
            async with running_hosts(2) as (server, member):
                calls: list = []
                serve(server, tiny3, tmp_path, calls)
                assert await member.connect(server.addrs) == 1
                out = {}

                def fetcher(root, **kw) -> BlockFetcher:
                    return BlockFetcher(member, tmp_path / root, lambda mid, i: [server.peer_id], timeout=20, **kw)

                # a model over its own cap: refused part way, never more than the cap on disk
                small = fetcher("small", max_model_bytes=model_bytes // 2, max_total_bytes=1 << 30)
                with pytest.raises(FetchRefused, match="cap"):
                    await small.ensure(ms[0].model_id, 0, 6)
                out["small_bytes"] = sum(p.stat().st_size for p in (tmp_path / "small").rglob("*") if p.is_file())
                # three models, room for two: the least recently used goes
                cap = int(model_bytes * 1.4)
                lru = fetcher("lru", max_model_bytes=cap, max_total_bytes=int(model_bytes * 2.9))
                await lru.ensure(ms[0].model_id, 0, 6)
                await trio.sleep(0.05)
                await lru.ensure(ms[1].model_id, 0, 6)
                await trio.sleep(0.05)
                await lru.ensure(ms[0].model_id, 0, 6)  # A used again: B is now the oldest
                await lru.ensure(ms[2].model_id, 0, 6)
                out["lru_dirs"] = sorted(p.name for p in (tmp_path / "lru").iterdir())
                out["evicted"] = list(lru.store.evicted)
                out["lru_used"] = lru.store.used()
                # a kept model is never evicted: with A and B kept, C cannot be had
                kept = fetcher("kept", max_model_bytes=cap, max_total_bytes=int(model_bytes * 2.9),
                               keep=[ms[0].model_id, ms[1].model_id])
                await kept.ensure(ms[0].model_id, 0, 6)
                await kept.ensure(ms[1].model_id, 0, 6)
                with pytest.raises(FetchRefused, match="nothing more can be evicted"):
                    await kept.ensure(ms[2].model_id, 0, 6)
                out["kept_dirs"] = sorted(p.name for p in (tmp_path / "kept").iterdir())
                return out

    out = trio.run(main)
    assert 0 < out["small_bytes"] <= model_bytes // 2
    assert out["evicted"] == [ms[1].model_id.hex()]
    assert out["lru_dirs"] == sorted([ms[0].model_id.hex(), ms[2].model_id.hex()])
    assert out["lru_used"] <= int(model_bytes * 2.9)
    assert out["kept_dirs"] == sorted([ms[0].model_id.hex(), ms[1].model_id.hex()])


def test_a_restart_counts_what_is_on_disk_and_drops_part_files(tmp_path, tiny3):
    """The caps hold across restarts: sizes are scanned from disk, LRU order is the ``.used`` file's mtime (not
    the order of the dirs), and part files of fetches that never finished are removed."""
    import shutil

    ms = [load_manifest(d) for d in tiny3]
    root = tmp_path / "fetched"
    for d, m, age in zip(tiny3, ms, (300, 100, 200), strict=True):
        shutil.copytree(d, root / m.model_id.hex())
        (root / m.model_id.hex() / USED_FILE).touch()
        t = os.path.getmtime(root / m.model_id.hex() / USED_FILE) - age
        os.utime(root / m.model_id.hex() / USED_FILE, (t, t))
    (root / ms[0].model_id.hex() / f"{block_file(3)}.part123").write_bytes(b"x" * 1000)
    (root / ".abc.tmp-xyz").mkdir()
    sizes_on_disk = {m.model_id.hex(): sum(p.stat().st_size for p in d.iterdir())
                     for d, m in zip(tiny3, ms, strict=True)}
    size = max(sizes_on_disk.values())
    new_model = b"\x09" * 32

    async def main():
        store = FetchedModels(root, max_model_bytes=2 * size, max_total_bytes=int(3.5 * size),
                              keep=[ms[0].model_id])
        sizes = dict(await store.scan())
        async with store.reserve(new_model, size) as got:  # room for one more: the oldest not kept goes
            held = store.used()
        return sizes, got, held, list(store.evicted), store.used()

    sizes, got, held, evicted, after = trio.run(main)
    assert sizes == sizes_on_disk  # the part file is gone, not counted
    assert not (root / ms[0].model_id.hex() / f"{block_file(3)}.part123").exists()
    assert not (root / ".abc.tmp-xyz").exists()
    assert got == size and held <= int(3.5 * size) and after == held - size
    assert evicted == [ms[2].model_id.hex()]  # used 200 s ago; model 0 (300 s) is kept, model 1 is newer
    assert sorted(p.name for p in root.iterdir()) == sorted([ms[0].model_id.hex(), ms[1].model_id.hex()])


def test_one_lock_per_model_and_a_deadline_per_fetch(tmp_path, tiny3):
    """Model A's server never answers: its fetch gives up at the fetcher's deadline, well before the request
    timeout, while model B's fetch, started after it, completes meanwhile (one global lock serialised them)."""
    a, b = load_manifest(tiny3[0]), load_manifest(tiny3[1])

    async def main():
        with trio.fail_after(120):
            async with running_hosts(2) as (server, member):
                calls: list = []
                serve(server, tiny3[:2], tmp_path, calls, stall=a.model_id)
                assert await member.connect(server.addrs) == 1
                f = BlockFetcher(member, tmp_path / "fetched", lambda mid, i: [server.peer_id], timeout=60,
                                 deadline=8)
                order: list[str] = []
                out: dict = {}

                async def fetch_a():
                    t0 = trio.current_time()
                    try:
                        await f.ensure(a.model_id, 0, 6)
                    except FetchRefused as e:
                        out["a_error"] = str(e)
                    out["a_s"] = trio.current_time() - t0
                    order.append("a")

                async def fetch_b():
                    await f.ensure(b.model_id, 0, 6)
                    order.append("b")

                async with trio.open_nursery() as n:
                    n.start_soon(fetch_a)
                    await trio.sleep(0.5)
                    n.start_soon(fetch_b)
                out["order"] = order
                out["locks_left"] = dict(f.store._locks)
                return out

    out = trio.run(main)
    assert out["order"] == ["b", "a"]
    assert "deadline" in out["a_error"] and out["a_s"] < 60 / 2  # the deadline, not the request timeout
    assert out["locks_left"] == {}
    assert not (tmp_path / "fetched" / a.model_id.hex()).exists()


def test_min_model_servers_parameter_keeps_old_genesis_hashes():
    from tests.ledger.test_idle import DEVNET_HASH_BEFORE_HEARTBEAT

    devnet = load_genesis()
    assert devnet.params.min_model_servers == 0 and devnet.params.model_servers() == 1
    assert devnet.hash.hex() == DEVNET_HASH_BEFORE_HEARTBEAT
    doc = devnet.to_doc()
    assert "min_model_servers" not in doc["params"]
    two = parse_genesis({**doc, "params": {**doc["params"], "min_model_servers": 2}})
    assert two.params.model_servers() == 2 and two.hash != devnet.hash
    assert parse_genesis(two.to_doc()).hash == two.hash
    for bad in (1001, -1, True):
        with pytest.raises(GenesisError, match="min_model_servers"):
            Params(min_model_servers=bad).check()


def committed_copy(src, dst, tokenizer: dict[str, bytes]):
    """A copy of model dir ``src`` with ``tokenizer`` files whose hashes its config commits to (``tally_tokenizer``):
    a new config hash, hence a new model id. Returns the new manifest."""
    import json
    import shutil
    from dataclasses import replace

    from node.compute.model import MANIFEST, compute_model_id, config_dict, config_hash
    from node.encoding import H
    from node.verify.tokfetch import COMMIT_KEY

    shutil.copytree(src, dst)
    for name, data in tokenizer.items():
        (dst / name).write_bytes(data)
    cfg = config_dict(dst)
    cfg[COMMIT_KEY] = {name: H(data).hex() for name, data in tokenizer.items()}
    (dst / "config.json").write_text(json.dumps(cfg))
    m = load_manifest(src)
    ch = config_hash(cfg)
    m = replace(m, config_hash=ch, model_id=compute_model_id(m.head_hash, list(m.block_hashes), ch))
    (dst / MANIFEST).write_text(json.dumps(m.to_json()))
    return load_manifest(dst)


def test_a_committed_tokenizer_is_checked_by_hash_and_an_uncommitted_one_stays_untrusted(tmp_path, tiny3):
    """Content-addressed tokenizers: a model whose config (covered by its model id) commits to its tokenizer
    files gets exactly those bytes (a peer sending other bytes is refused, the next asked) and is trusted; without
    a good copy, or for a model without the commitment, the dir stays marked as a peer's. Every fetched dir is
    born marked, even one holding only a span."""
    from node.verify.blockfetch import UNVERIFIED_TOKENIZER, tokenizer_trusted

    tok = {"tokenizer.json": b'{"model": "good"}', "tokenizer_config.json": b'{"x": 1}'}
    m = committed_copy(tiny3[0], tmp_path / "good", tok)
    bad_dir = tmp_path / "bad"
    import shutil

    shutil.copytree(tmp_path / "good", bad_dir)
    (bad_dir / "tokenizer.json").write_bytes(b'{"model": "evil"}')
    plain = load_manifest(tiny3[1])
    shutil.copytree(tiny3[1], tmp_path / "plain")
    (tmp_path / "plain" / "tokenizer.json").write_bytes(b'{"model": "plain"}')

    async def main():
        with trio.fail_after(120):
            async with running_hosts(3) as (bad, good, member):
                calls: list = []
                serve(bad, [bad_dir, tmp_path / "plain"], tmp_path, calls)
                serve(good, [tmp_path / "good"], tmp_path, calls)
                assert await member.connect(bad.addrs + good.addrs) == 2
                out = {}
                f = BlockFetcher(member, tmp_path / "f1", lambda mid, i: [bad.peer_id, good.peer_id], timeout=20)
                span = await f.ensure(m.model_id, 0, 2)
                out["span_trusted"] = tokenizer_trusted(span)
                out["d"] = await f.ensure_model(m.model_id)
                out["refused"] = list(f.refused)
                lone = BlockFetcher(member, tmp_path / "f2", lambda mid, i: [bad.peer_id], timeout=20)
                out["lone"] = await lone.ensure_model(m.model_id)
                out["plain"] = await lone.ensure_model(plain.model_id)
                return out

    out = trio.run(main)
    d, lone, plain_d = out["d"], out["lone"], out["plain"]
    assert out["span_trusted"] is False
    assert tokenizer_trusted(d) and all((d / n).read_bytes() == b for n, b in tok.items())
    assert [why for _, why in out["refused"]] and all("tokenizer" in why for _, why in out["refused"])
    assert not tokenizer_trusted(lone) and not (lone / "tokenizer.json").exists()  # the liar's copy is not kept
    assert not tokenizer_trusted(plain_d) and (plain_d / UNVERIFIED_TOKENIZER).is_file()
    assert (plain_d / "tokenizer.json").read_bytes() == b'{"model": "plain"}'  # kept, as a peer's


def test_node_start_sets_the_fetch_caps():
    from node.cli import build_parser
    from node.verify.fetchstore import MAX_MODEL_BYTES, MAX_TOTAL_BYTES

    assert build_parser().parse_args(["start", "--fetch-caps", "10", "20"]).fetch_caps == [10, 20]
    default = build_parser().parse_args(["start"]).fetch_caps
    assert [default[0] << 20, default[1] << 20] == [MAX_MODEL_BYTES, MAX_TOTAL_BYTES]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--fetch-caps", "0", "20"])
    with pytest.raises(ValueError, match="max_model_bytes <= max_total_bytes"):
        FetchedModels("/nonexistent", max_model_bytes=2, max_total_bytes=1)
