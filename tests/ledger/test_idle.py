"""Quiet when idle: validators make an empty block only every ``heartbeat_ms`` unless a transaction waits or the
state needs a height (node.ledger.core.liveness), and an empty block is stored small (node.ledger.core.blockcodec).

Chains run real validators (:class:`LedgerService` with its consensus driver over real libp2p hosts on
127.0.0.1, LevelDB in a tmp dir). Counts of blocks are bounded, never wall times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from node.encoding import pack, unpack
from node.genesis_cli import DEFAULT_HEARTBEAT_MS, FlagError, apply_heartbeat, parse_duration_ms
from node.identity import Identity, dev_seed
from node.ledger.core import blockcodec
from node.ledger.core.block import Block, Header, sign_commit, tx_root
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.jobstate import jobs_of
from node.ledger.core.jobtx import JobCancel
from node.ledger.core.liveness import block_due, height_need, needs_height, needs_proof
from node.ledger.core.state import FINAL, SAMPLED, VALID, apply_block_body, genesis_state
from node.ledger.core.tx import Transfer
from node.ledger.genesis import Genesis, GenesisError, Params, load_genesis, parse_genesis
from node.ledger.service import LedgerService
from node.ledger.store import LedgerStore
from node.p2p.host import P2PHost

from .helpers import CLIENT, KEYS, VALIDATOR, W1, C, make_genesis, make_receipt, vote
from .test_job_liveness import G as JG, block, post

ROOT = Path(__file__).resolve().parents[2]
# p·S = 0.01 × 100 C = 1 C > (1 − p)·G = 0.99 C: a receipt is sampled with probability 1 %
LOW_SAMPLING = dict(sample_base_ppm=10_000, sample_floor_ppm=10_000)


def quiet_genesis(n_validators: int = 1, **params) -> Genesis:
    g = make_genesis(**{"block_time_ms": 200, "heartbeat_ms": 60_000, **params})
    return replace(g, validators=tuple(k.account for k in KEYS[:n_validators]))


@asynccontextmanager
async def validators(tmp, g: Genesis):
    """Every genesis validator as a :class:`LedgerService` on its own libp2p host, all connected, running."""
    keys = [k for k in KEYS if k.account in g.validators]
    async with AsyncExitStack() as stack:
        nodes = []
        for i, k in enumerate(keys):
            store = LedgerStore(tmp / f"v{i}", g)
            stack.callback(store.close)
            host = await stack.enter_async_context(P2PHost(k, 0, g.chain_id, genesis_hash=g.hash).running())
            if nodes:
                assert await host.connect([a for x in nodes for a in x.host.addrs[:1]]) == len(nodes)
            nodes.append(LedgerService(store, g, k, host))
        async with trio.open_nursery() as n:
            for svc in nodes:
                n.start_soon(svc.run)
            try:
                yield nodes
            finally:
                n.cancel_scope.cancel()


async def wait_height(nodes, h: int, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while min(x.state.height for x in nodes) < h:
            await trio.sleep(0.02)


def assert_one_chain(nodes) -> None:
    top = min(x.store.head for x in nodes)
    for h in range(1, top + 1):
        assert len({x.store.get_block(h)[0].hash for x in nodes}) == 1, f"fork at height {h}"


async def idle_blocks(nodes, seconds: float) -> tuple[int, float]:
    """Blocks made by an untouched chain over about ``seconds``: (count, seconds actually watched)."""
    h0, t0 = nodes[0].state.height, trio.current_time()
    await trio.sleep(seconds)
    return nodes[0].state.height - h0, trio.current_time() - t0


# ------------------------------------------------------------------ a running chain


def test_an_idle_chain_makes_about_one_block_per_heartbeat(tmp_path):
    async def main():
        out = {}
        for name, hb in (("quiet", 2000), ("every block time", 0)):
            g = quiet_genesis(heartbeat_ms=hb)
            async with validators(tmp_path / name, g) as nodes:
                await wait_height(nodes, 1)  # the first block comes at once (Tendermint's initial proof block)
                out[name] = (*await idle_blocks(nodes, 5.0), nodes[0].driver)
        return out

    out = trio.run(main)
    n, watched, driver = out["quiet"]
    assert 1 <= n <= watched / 2.0 + 1, (n, watched)  # one per 2 s heartbeat, not one per 0.2 s block time
    assert all(why == "heartbeat" for _, why in driver.woken[-n:]), driver.woken
    assert driver.timeouts_acted == {}  # nobody's timeouts fired while the chain waited
    legacy, _watched_legacy, _ = out["every block time"]
    assert legacy >= 3 * (n + 1), (legacy, n)  # heartbeat_ms 0 keeps today's block every block time


def test_a_transfer_is_included_in_the_next_block_then_the_chain_is_quiet(tmp_path):
    g = quiet_genesis()  # heartbeat 60 s: any block within this test comes from a transaction or the state

    async def main():
        async with validators(tmp_path, g) as nodes:
            svc = nodes[0]
            await wait_height(nodes, 1)
            await trio.sleep(0.5)
            h0 = svc.state.height
            assert h0 == 1  # quiet after the first block
            tx = Transfer(g.domain, CLIENT.account, W1.account, 3 * C, svc.next_nonce(CLIENT.account)).signed(CLIENT)
            await svc.submit(tx)
            await wait_height(nodes, h0 + 2, timeout=10)
            loc = svc.store.tx_location(tx.id)
            await trio.sleep(1.0)  # five block times: nothing more is due
            return h0, loc, svc.state.height, list(svc.driver.woken)

    h0, loc, head, woken = trio.run(main)
    assert loc is not None and loc[0] == h0 + 1  # the very next block carries it
    assert head == h0 + 2  # then one proof block (the new balances' root in a header), then nothing
    assert woken[-2:] == [(h0 + 1, "txs"), (h0 + 2, "state")]


def test_a_receipt_gets_its_beacon_block_and_settles_without_waiting_for_heartbeats(tmp_path):
    g = quiet_genesis(challenge_window=4, **LOW_SAMPLING)  # heartbeat 60 s

    async def main():
        async with validators(tmp_path, g) as nodes:
            svc = nodes[0]
            await wait_height(nodes, 1)
            rec = make_receipt(g, W1, height=svc.state.height)
            await svc.submit(rec)
            with trio.fail_after(20):
                while rec.id not in svc.state.receipts or not svc.state.receipts[rec.id].p_ppm:
                    await trio.sleep(0.02)
                included = svc.state.receipts[rec.id].height
                beacon_height = svc.state.height
                if svc.state.receipts[rec.id].status == SAMPLED:  # 1 %: its committee votes valid
                    for k in KEYS:
                        if k.account in svc.state.receipts[rec.id].committee:
                            await svc.submit(vote(g, rec.id, k, VALID))
                while svc.state.receipts[rec.id].status not in FINAL:
                    await trio.sleep(0.02)
            final = svc.state.receipts[rec.id]
            await trio.sleep(1.0)
            return included, beacon_height, final, svc.state.height

    included, beacon_height, final, head = trio.run(main)
    assert beacon_height == included + 1  # the beacon block came right after the receipt's block
    if final.status == "settled":
        assert final.final_height == included + g.params.challenge_window
    assert head <= final.final_height + 1  # settled (and its proof block): quiet again


def test_four_validators_agree_and_stay_quiet_when_idle(tmp_path):
    g = quiet_genesis(n_validators=4, heartbeat_ms=2000)

    async def main():
        async with validators(tmp_path, g) as nodes:
            await wait_height(nodes, 1, timeout=30)
            n, watched = await idle_blocks(nodes, 5.0)
            sender = nodes[2]  # not necessarily the next proposer: its transaction must still get in
            h0 = max(x.state.height for x in nodes)
            tx = Transfer(g.domain, CLIENT.account, W1.account, C, sender.next_nonce(CLIENT.account)).signed(CLIENT)
            await sender.submit(tx)
            with trio.fail_after(15):
                while any(x.store.tx_location(tx.id) is None for x in nodes):
                    await trio.sleep(0.02)
            loc = nodes[0].store.tx_location(tx.id)
            await wait_height(nodes, max(x.state.height for x in nodes))
            assert_one_chain(nodes)
            return n, watched, h0, loc, [dict(x.driver.timeouts_acted) for x in nodes]

    n, watched, h0, loc, timeouts = trio.run(main)
    assert 1 <= n <= watched / 2.0 + 1, (n, watched)
    assert loc[0] <= h0 + 2, (loc, h0)  # within a block or two of the submission, not a heartbeat later
    assert all(t.get("propose", 0) <= 1 for t in timeouts), timeouts  # no propose timeouts while idle


# ------------------------------------------------------------------ the predicate (pure)


def test_needs_height_is_what_moves_only_with_heights():
    g = make_genesis(challenge_window=3, **LOW_SAMPLING)
    s = genesis_state(g)
    assert not needs_height(s) and height_need(s) is None
    s = apply_block_body(s, 1, b"\x01" * 32, [])
    assert not needs_height(s)
    rec = make_receipt(g, W1, height=1)
    s = apply_block_body(s, 2, b"\x02" * 32, [rec])
    assert height_need(s) == "beacon"  # its sample is drawn from block 3's hash
    for h in range(3, 40):
        s = apply_block_body(s, h, bytes([h]) * 32, [])
        r = s.receipts[rec.id]
        if r.status in FINAL:
            break
        if r.status == SAMPLED:
            assert height_need(s) == "verdict_timeout"
            votes = [vote(g, rec.id, k, VALID) for k in KEYS if k.account in r.committee]
            s = apply_block_body(s, h + 1, bytes([h + 1]) * 32, votes)
            break
        assert height_need(s) == "challenge_window"
    assert s.receipts[rec.id].status in FINAL
    assert not needs_height(s)  # settled: nothing left that heights move


def test_an_open_job_needs_heights_until_it_is_cancelled():
    s = genesis_state(JG)
    p = post(s)
    s = block(s, p)
    assert height_need(s) == "job"  # its deadline (and a worker's start window) count in blocks
    s = block(s, JobCancel(JG.domain, CLIENT.account, p.job_id, s.account(CLIENT.account).nonce).signed(CLIENT))
    assert jobs_of(s)[p.job_id].status == "cancelled" and not needs_height(s)


def test_block_due_rules():
    p = Params(block_time_ms=200, heartbeat_ms=2000)
    assert not block_due(p, 1_100, 1_000, txs_ready=True, need=True)  # block time not yet passed
    assert block_due(p, 1_200, 1_000, txs_ready=True, need=False)
    assert block_due(p, 1_200, 1_000, txs_ready=False, need=True)
    assert not block_due(p, 2_999, 1_000, txs_ready=False, need=False)
    assert block_due(p, 3_000, 1_000, txs_ready=False, need=False)  # the heartbeat
    legacy = Params(block_time_ms=200)
    assert block_due(legacy, 1_200, 1_000, txs_ready=False, need=False)  # heartbeat 0: every block time
    s = genesis_state(make_genesis())
    assert needs_proof(s, None) and not needs_proof(s, s.state_root()) and needs_proof(s, b"\x00" * 32)


# ------------------------------------------------------------------ genesis and CLI


def test_heartbeat_parameter_is_validated_and_old_genesis_files_keep_their_hash():
    devnet = load_genesis()
    assert devnet.params.heartbeat_ms == 0 and devnet.params.heartbeat() == devnet.params.block_time_ms
    # the embedded devnet's hash before heartbeat_ms existed (computed with the code of commit 0eaf967)
    assert devnet.hash.hex() == DEVNET_HASH_BEFORE_HEARTBEAT
    assert "heartbeat_ms" not in devnet.to_doc()["params"]
    doc = devnet.to_doc()
    quiet = parse_genesis({**doc, "params": {**doc["params"], "heartbeat_ms": 30_000}})
    assert quiet.params.heartbeat() == 30_000 and quiet.hash != devnet.hash
    assert parse_genesis(quiet.to_doc()).hash == quiet.hash
    for bad in (100, 3_600_001, True):  # below block_time_ms (500), above one hour, not an integer
        with pytest.raises(GenesisError, match="heartbeat_ms"):
            parse_genesis({**doc, "params": {**doc["params"], "heartbeat_ms": bad}})


DEVNET_HASH_BEFORE_HEARTBEAT = "fbf7fe9a3f9a71a5af0c698e0c063406817762ea1bf51d2b7d736dcc336b978c"


def test_genesis_new_heartbeat_flag():
    assert parse_duration_ms("30s") == 30_000 and parse_duration_ms("1500ms") == 1500
    assert parse_duration_ms("2m") == 120_000 and parse_duration_ms("1h") == 3_600_000
    assert parse_duration_ms("45") == 45_000 and parse_duration_ms("0") == 0
    for bad in ("", "1.5s", "-3s", "10 minutes"):
        with pytest.raises(FlagError, match="--heartbeat"):
            parse_duration_ms(bad)
    assert apply_heartbeat({"block_time_ms": 500}, None)["heartbeat_ms"] == DEFAULT_HEARTBEAT_MS
    assert apply_heartbeat({"block_time_ms": 60_000}, None)["heartbeat_ms"] == 60_000  # never below block time
    assert apply_heartbeat({"heartbeat_ms": 5000}, None)["heartbeat_ms"] == 5000  # the params' own
    assert apply_heartbeat({"block_time_ms": 500}, "10s")["heartbeat_ms"] == 10_000
    assert "heartbeat_ms" not in apply_heartbeat({"block_time_ms": 500}, None, default_ms=0)  # devnet: as before
    with pytest.raises(FlagError, match="give it once"):
        apply_heartbeat({"heartbeat_ms": 5000}, "10s")


def test_node_genesis_new_writes_the_heartbeat(tmp_path):
    peer = KEYS[0].peer_id

    def new(name: str, *extra: str) -> dict:
        out = tmp_path / f"{name}.json"
        r = subprocess.run([sys.executable, "-m", "node.cli", "genesis", "new", "--chain-id", "tally-test-idle",
                            "--validator", f"{peer}=200", "--account", f"{peer}=1000", "--out", str(out), *extra],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        return json.loads(out.read_text())["params"]

    assert new("production")["heartbeat_ms"] == DEFAULT_HEARTBEAT_MS
    assert new("flag", "--heartbeat", "45s")["heartbeat_ms"] == 45_000
    assert "heartbeat_ms" not in new("devnet", "--params", "devnet")  # the devnet's own: a block every block time
    r = subprocess.run([sys.executable, "-m", "node.cli", "genesis", "new", "--chain-id", "tally-test-idle",
                        "--validator", peer, "--out", str(tmp_path / "bad.json"), "--heartbeat", "10ms"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "heartbeat_ms" in r.stderr and not (tmp_path / "bad.json").exists()


# ------------------------------------------------------------------ stored bytes


def _live_bytes(store: LedgerStore) -> int:
    return sum(len(k) + len(v) for k, v in store.db.iterator())


def test_an_empty_block_stores_at_most_250_bytes_and_reads_back_as_its_wire(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = store.replay()
    grown, wires = [], []
    for i in range(6):
        block, new, _ = propose(state, [], VALIDATOR, 1000 + i, store.last_commit())
        commit = commit_block(VALIDATOR, block)
        before = _live_bytes(store)
        store.append(block, commit, state, new)
        grown.append(_live_bytes(store) - before)
        wires.append(pack({"b": block.to_wire(), "c": [list(x) for x in commit]}))
        state = new
    # every key and value a block adds or changes, explorer index and state keys included (the first block
    # also writes state keys once)
    assert max(grown[1:]) <= 250, grown
    legacy = len(wires[-1]) + 9
    assert legacy > 300  # what the same block stored before (the whole wire form)
    for h, wire in enumerate(wires, 1):
        assert pack(store.get_block_raw(h)) == wire  # every reader sees exactly the wire form
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    assert store.verify() == [] and store.replay().last_hash == state.last_hash
    store.close()


def test_a_store_with_legacy_records_reads_and_verifies(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = store.replay()
    t = Transfer(g.domain, CLIENT.account, W1.account, C, 0).signed(CLIENT)
    for i, txs in enumerate([[t], [], []]):
        block, new, _ = propose(state, txs, VALIDATOR, 1000 + i, store.last_commit())
        commit = commit_block(VALIDATOR, block)
        store.append(block, commit, state, new)
        if i == 0:  # block 1 as an older version wrote it
            store.db.put(b"B" + (1).to_bytes(8, "big"), pack({"b": block.to_wire(), "c": [list(x) for x in commit]}))
        state = new
    assert store.get_block(1)[0].txs[0].id == t.id and store.tx_location(t.id)[0] == 1
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    assert store.verify() == []
    store.close()


def test_compact_record_of_a_four_validator_block_is_lossless():
    keys = [Identity.from_seed(dev_seed(i)) for i in range(4)]
    vals = tuple(k.account for k in keys)
    g = replace(make_genesis(), validators=vals)
    parent = [list(sign_commit(k, g.domain, 1, b"\x07" * 32, 1)) for k in keys[:3]]
    lc = tuple(tuple(x) for x in parent[:2] + [list(sign_commit(keys[3], g.domain, 1, b"\x07" * 32, 1))])
    header = Header(g.domain, 2, b"\x07" * 32, 5000, keys[2].account, tx_root([]), genesis_state(g).state_root())
    block = Block(header, (), lc)
    commit = [sign_commit(k, g.domain, 2, block.hash, 0) for k in keys] + [(b"\x09" * 32, 0, b"junk")]
    wire = {"b": block.to_wire(), "c": [list(x) for x in commit]}
    raw = blockcodec.encode_record(block.to_wire(), commit, parent, g.domain, vals)
    assert isinstance(unpack(raw), list) and len(raw) < len(pack(wire))
    assert pack(blockcodec.decode_record(raw, g.domain, vals, lambda: parent)) == pack(wire)
    same = blockcodec.encode_record(block.to_wire(), commit, [list(x) for x in lc], g.domain, vals)
    assert len(same) < len(raw)  # last_commit equal to the parent's: not stored again
    assert pack(blockcodec.decode_record(same, g.domain, vals, lambda: [list(x) for x in lc])) == pack(wire)
    with pytest.raises(blockcodec.RecordError):
        blockcodec.decode_record(pack([2, [1]]), g.domain, vals, lambda: [])
