"""Check 3 of issue 16: a flood of 1,000 unpayable and far-future transactions from one key, and of 1,000 from five
keys at once (200 each), over gossip and the direct-submit protocol from real libp2p peers in another process (and
unpayable transfers through the wallet API), while a devnet node produces blocks (``blocks``) — and, marked slow,
while a tiny-model swarm also generates and verifies (``swarm``: the validator in this process, its three span
servers ``node start`` processes).

Three phases side by side in one test, each with the same real work (one API transfer; with the swarm also one
generation through 3 spans, its 3 receipts and 6 committee votes): idle, flood from one key, flood from five
keys. Checked: all the real work lands within 2 blocks of entering the validator's mempool and every receipt
settles valid; the median block interval of each flood phase is within 10 % of the idle phase's (a ratio); only
the payable transactions inside the nonce window are queued, everything else the validator received is refused
with a reason and logged at debug level (past a peer's refusal budget, unread), the direct submitters get the
reasons; the mempool stays bounded.

Run as ``python -m tests.e2e.test_flood '<json>'`` this module is the flooder process (see :func:`flooder`).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import statistics
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import trio

from node.compute.model import make_tiny
from node.identity import Identity, dev_seed
from node.ledger.core.state import VALID_S
from node.ledger.mempool_policy import Limits

from .swarm import C, swarm, tiny_genesis, wait_final

ROOT = Path(__file__).resolve().parents[2]
SPANS = [(0, 2), (2, 4), (4, 6)]
FLOOD = 1000  # transactions of each flood: from one key, and from five keys at once (a fifth each)
WINDOW_OK = 10  # per funded flooding key: payable transactions inside the nonce window (these are queued)
DIRECT = 10  # per flooding key: transactions sent with the direct-submit protocol, whose replies are kept
ONE_KEY = 70  # dev_seed of the unfunded key of the one-key flood
FIVE_KEYS = list(range(71, 76))  # dev_seeds of the five keys (1 credit each) of the five-key flood
REASONS = re.compile(r"insufficient balance|too far ahead|ignored for now|transactions queued")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


# ------------------------------------------------------------------ the flooder process

def flood_txs(chain: str, seed: int, funded: bool, n: int) -> list:
    """``n`` signed transfers from ``dev_seed(seed)``: every other one unpayable at the next nonce (0), the
    rest far ahead of it; a funded key's ``DIRECT`` + 1st to ``DIRECT + WINDOW_OK``-th are payable ones just ahead
    of its next nonce (inside the window: these are queued)."""
    from node.ledger.core.tx import Transfer

    me, to = Identity.from_seed(dev_seed(seed)), Identity.from_seed(dev_seed(1)).account
    bad = [Transfer(chain, me.account, to, 10 * C + i, 0) if i % 2 else  # more than the key holds
           Transfer(chain, me.account, to, 1, 1000 + i)  # far beyond the nonce window
           for i in range(n - (WINDOW_OK if funded else 0))]
    ok = [Transfer(chain, me.account, to, 1, n) for n in range(1, WINDOW_OK + 1)] if funded else []
    return [t.signed(me) for t in bad[:DIRECT] + ok + bad[DIRECT:]]


async def _flood_one(host, target: str, txs: list) -> dict:
    from node.encoding import pack
    from node.ledger.service import SUBMIT_PROTOCOL
    from node.p2p.framing import RemoteError

    replies = []
    for t in txs[:DIRECT]:
        try:
            await host.request(target, SUBMIT_PROTOCOL, {"tx": t.to_wire()}, timeout=10)
            replies.append("ok")
        except RemoteError as e:
            replies.append(e.message)
    for t in txs[DIRECT:]:
        await host.publish(host.topic("tx"), pack(t.to_wire()))
    await trio.sleep(1.0)  # let pubsub's outbound queue drain
    return {"peer": host.peer_id, "published": len(txs) - DIRECT, "direct": replies}


async def _flooder(cfg: dict) -> None:
    from contextlib import AsyncExitStack

    from node.net.service import NetworkService, RelayMode
    from node.p2p.host import P2PHost

    chain, target, genesis_hash = cfg["chain"], cfg["target"], bytes.fromhex(cfg["genesis"])
    groups = {"one": [(ONE_KEY, False)], "five": [(s, True) for s in FIVE_KEYS]}
    txs = {name: [flood_txs(cfg["domain"], s, f, FLOOD // len(keys)) for s, f in keys] for name, keys in groups.items()}
    async with AsyncExitStack() as stack:
        hosts = {}
        for name, keys in groups.items():
            hosts[name] = []
            for seed, _ in keys:  # a peer as a node builds it (node.runtime): host, genesis handshake, topics
                h = P2PHost(Identity.from_seed(dev_seed(seed)), chain_id=chain, genesis_hash=genesis_hash)
                net = NetworkService(h, genesis_hash, [], None, RelayMode.OFF, dcutr=False)
                await stack.enter_async_context(h.running())
                await h.start_service(net.run)
                await h.connect(cfg["addrs"])
                hosts[name].append(h)
        for h in hosts["one"] + hosts["five"]:
            await h.wait_for_topic_peers(h.topic("tx"), 1, timeout=20, mesh=False)
        print(json.dumps({"ready": True}), flush=True)
        while True:
            line = (await trio.to_thread.run_sync(sys.stdin.readline)).strip()
            if line not in groups:
                break
            results = []

            async def one(h, t):
                results.append(await _flood_one(h, target, t))  # noqa: B023 - one() runs in this iteration's nursery

            async with trio.open_nursery() as n:
                for h, t in zip(hosts[line], txs[line], strict=False):
                    n.start_soon(one, h, t)
            print(json.dumps({"phase": line, "results": results}), flush=True)


def flooder(cfg: dict) -> None:
    """The flooder process: one real libp2p host per flooding key, connected to ``cfg["addrs"]``. Prints
    ``{"ready": true}``, then for each line ``one`` / ``five`` on stdin floods from that group of keys at once
    (``DIRECT`` transactions per key by the direct-submit protocol, the rest over gossip) and prints the replies;
    any other line ends it."""
    logging.basicConfig(level=logging.WARNING)
    trio.run(_flooder, cfg)


# ------------------------------------------------------------------ the test

class _Refusals(logging.Handler):
    """Counts the ledger's debug lines "refused ... from <peer>: <reason>" by peer (cheaper than caplog)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.by_peer: dict[str, list[str]] = {}

    def emit(self, record):
        if record.msg.startswith("refused ") and len(record.args) == 3:
            self.by_peer.setdefault(str(record.args[1]), []).append(str(record.args[2]))


# ``swarm`` runs the three span servers as ``node start`` processes. With all four nodes in this one process (as
# before) 1 of 6 runs passed: new streams to the validator were not negotiated within 5-10 s ("multiselect
# handshake read failed") while its event loop lagged < 1 s, in the idle phase too, before any flood - several
# nodes sharing one trio loop, the py-libp2p symptom of the notes; not the flood. The validator stays in this
# process because the test watches its mempool and blocks from inside.
# both slow: [blocks] (~30 s) left the default suite for its time (it was 18 min on this machine); CI runs both
# alone: its claims are timings (block intervals within 1.10x of idle, refusals counted within the flood's time);
# beside two other xdist workers [swarm] measured 111 refusals of 138 (CI at 9a3782f), alone it passes (~60 s)
@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.parametrize("spans", [[], SPANS], ids=["blocks", "swarm"])
def test_flood_is_refused_while_real_work_lands_on_time(tmp_path, tiny, spans):
    """``blocks``: a devnet node producing blocks, with API transfers as the real work. ``swarm``: the same node
    with 3 span servers, generating and verifying as well."""
    g = tiny_genesis(len(spans), block_time_ms=250)
    g = replace(g, balances=g.balances + tuple((Identity.from_seed(dev_seed(s)).account, C, 0) for s in FIVE_KEYS))
    flood_peers = {Identity.from_seed(dev_seed(s)).peer_id for s in [ONE_KEY, *FIVE_KEYS]}
    flood_log = tmp_path / "flooder.log"
    log = logging.getLogger("tally.ledger")
    handler, old_level = _Refusals(), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)

    async def http_post(url, body, token):
        return await trio.to_thread.run_sync(lambda: httpx.post(url, json=body, timeout=30,
                                                                headers={"Authorization": f"Bearer {token}"}))

    async def main():
        async with swarm(tmp_path, tiny, [], genesis=g) as nodes, span_servers(tmp_path, tiny, g, nodes[0], spans):
            v = nodes[0]  # the validator, also the client
            pool = v.ledger.mempool
            admitted: dict[bytes, int] = {}  # tx id -> validator height when it entered its mempool
            queued_from: dict[str, int] = {}  # flood peer -> transactions of it the validator queued
            refusals: dict[str, list[str]] = {}  # flood peer -> the reasons the validator recorded
            blocks: list[tuple[float, int, int, int]] = []  # (monotonic s, height, mempool txs, mempool bytes)
            included: dict[bytes, int] = {}
            real_add, real_note = pool.add, pool.note_refusal

            def add(tx, peer=None):
                new = tx.id not in pool
                tid = real_add(tx, peer)
                admitted.setdefault(tid, v.ledger.state.height)
                if new and peer in flood_peers:
                    queued_from[peer] = queued_from.get(peer, 0) + 1
                return tid

            def note(peer, tid=None, reason=""):
                if peer in flood_peers:
                    refusals.setdefault(peer, []).append(reason)
                real_note(peer, tid, reason)

            pool.add, pool.note_refusal = add, note

            def on_block(block, state):
                blocks.append((time.monotonic(), block.height, len(pool), pool.size_bytes))
                for t in block.txs:
                    included[t.id] = block.height

            v.ledger.on_block(on_block)
            cfg = {"chain": g.chain_id, "domain": g.domain, "genesis": g.hash.hex(), "target": v.ident.peer_id,
                   "addrs": v.host.addrs}  # the hosts' chain id (hello, topics); the transactions' signing domain
            proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.test_flood", json.dumps(cfg)], cwd=ROOT,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=flood_log.open("w"),
                                    text=True)
            try:
                line = await trio.to_thread.run_sync(proc.stdout.readline)
                assert line.startswith("{"), flood_log.read_text()[-3000:]
                assert json.loads(line) == {"ready": True}, line
                phases = {}
                for name in ("idle", "one", "five"):
                    phases[name] = await phase(v, name, proc, blocks, admitted, included, refusals, http_post)
                proc.stdin.write("quit\n")
                proc.stdin.flush()
                return phases, refusals, queued_from
            finally:
                if proc.poll() is None:
                    try:
                        await trio.to_thread.run_sync(lambda: proc.wait(timeout=10))
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()

    try:
        phases, refusals, queued_from = trio.run(main)
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)

    idle = phases["idle"]
    print("phases:", {k: {"median_interval": round(p["median_interval"], 3), "drain_s": p["drain_s"] and
                          round(p["drain_s"], 1), "blocks": p["blocks"]} for k, p in phases.items()})
    for name, p in phases.items():
        # the real work landed within its usual blocks, and settled
        assert all(r.status == VALID_S and len(r.votes) == 2 for r in p["receipts"]), name
        assert len(p["receipts"]) == (3 if spans else 0)
        assert len(p["lags"]) == (3 + 6 + 1 if spans else 1) and max(p["lags"]) <= 2, (name, p["lags"])
        assert p["api_refused"] == [(400, "invalid_tx", True)] * 5, (name, p["api_refused"])
    for name in ("one", "five"):
        p = phases[name]
        ratio = p["median_interval"] / idle["median_interval"]
        assert ratio <= 1.10, (name, ratio, p["median_interval"], idle["median_interval"])
        keys = [ONE_KEY] if name == "one" else FIVE_KEYS
        for res in p["flood"]:
            peer, seen = res["peer"], refusals.get(res["peer"], [])
            # the direct submitter got the reasons; only the payable ones inside the nonce window were queued;
            # everything else the validator received was refused with its reason and logged at debug level
            assert len(res["direct"]) == DIRECT and all(REASONS.search(r) for r in res["direct"]), res["direct"]
            assert queued_from.get(peer, 0) == (WINDOW_OK if name == "five" else 0), (name, queued_from)
            assert all(REASONS.search(r) for r in seen), {r for r in seen if not REASONS.search(r)}
            assert len(seen) >= DIRECT + Limits().max_refusals_per_peer, (name, len(seen))
            assert len(handler.by_peer.get(peer, [])) >= len(seen)
        assert len(p["flood"]) == len(keys)
        # memory stayed bounded: at most the window's payable transactions of each key above the idle level
        assert p["max_pool"] <= idle["max_pool"] + WINDOW_OK * len(keys), (name, p["max_pool"], idle["max_pool"])
        # (a queued transfer is 233 B of wire form, 167 B before its chain id became the 77-character signing domain)
        assert p["max_pool_bytes"] <= idle["max_pool_bytes"] + 270 * WINDOW_OK * len(keys)
    # the devnet produced blocks all along
    assert all(p["blocks"] >= 12 for p in phases.values()), {k: p["blocks"] for k, p in phases.items()}


@asynccontextmanager
async def span_servers(tmp: Path, tiny: Path, g, v, spans):
    """One ``node start`` process per span (dev keys 1, 2, ...: the genesis's bonded servers), bootstrapped to the
    in-process validator ``v``; until ``v`` has heard every span's announcement. Stops them (SIGKILL) after."""
    from tests.inference.procs import spawn, stop_all, tail, wait_info

    gfile = tmp / "genesis.json"
    gfile.write_text(json.dumps(g.to_doc()))
    procs = {k: spawn(tmp, k, gfile, tiny.parent, "--span", f"{s}:{e}", "--bootstrap", v.host.addrs[0],
                      "--step-timeout", "10") for k, (s, e) in enumerate(spans, start=1)}
    try:
        for k, p in procs.items():
            await trio.to_thread.run_sync(lambda: wait_info(tmp, k, p, 300))  # noqa: B023 - awaited at once
        with trio.fail_after(120):
            while len(v.swarm.live(v.manifest.model_id)) < len(spans):
                await trio.sleep(0.2)
        yield procs
    except BaseException:
        for k in procs:
            print(f"--- server {k} ---", tail(tmp, k), sep="\n")
        raise
    finally:
        await trio.to_thread.run_sync(lambda: stop_all(procs.values()))


async def phase(v, name: str, proc, blocks, admitted, included, refusals, http_post) -> dict:
    """One phase: the real work, and the flood ``name`` (none for "idle") at the same time."""
    start, h0 = time.monotonic(), v.ledger.state.height
    out: dict = {}

    async def flood():
        proc.stdin.write(name + "\n")
        proc.stdin.flush()
        reply = json.loads(await trio.to_thread.run_sync(proc.stdout.readline))
        assert reply["phase"] == name
        out["flood"] = reply["results"]
        # until the validator has handled everything it was sent. With the swarm, all four nodes of this one
        # process receive and relay the 1,000 gossip messages on one trio loop (py-libp2p parses and checks each),
        # so draining took longer than the 30 s this wait first had in 2 of 3 runs at load 1.5-2
        with trio.fail_after(120):
            last = -1
            while True:
                seen = sum(len(r) for r in refusals.values())
                if seen == last:
                    break
                last = seen
                await trio.sleep(2.0)
        out["drain_s"] = time.monotonic() - start

    async def api():
        url = f"{v.api_url}/v1/transfer"
        me_to = Identity.from_seed(dev_seed(1)).peer_id
        ok = await http_post(url, {"to": me_to, "amount": "1"}, v.api_token)
        assert ok.status_code == 200, ok.text
        out["transfer"] = bytes.fromhex(ok.json()["id"])
        refused = []
        for _ in range(5):  # more than the node holds: refused with the reason, nothing queued
            r = await http_post(url, {"to": me_to, "amount": "1000000"}, v.api_token)
            refused.append((r.status_code, r.json()["code"], "insufficient balance" in r.json()["message"]))
        out["api_refused"] = refused

    async with trio.open_nursery() as n:
        if name != "idle":
            n.start_soon(flood)
        n.start_soon(api)
        out["receipts"] = []
        if len(v.swarm.live(v.manifest.model_id)):  # a swarm: generate, and wait for the verdicts
            gen = await v.generate([5, 17, 42, 99, 3], 8)
            try:
                out["receipts"] = list((await wait_final(v, [r.id for r in gen.receipts], timeout=60)).values())
            except trio.TooSlowError:
                raise AssertionError(f"phase {name}: receipts not final within 60 s: " + repr(
                    [(r.status, r.round, r.votes) for r in (v.ledger.state.receipts.get(g.id) for g in gen.receipts)
                     if r is not None])) from None
    await v.ledger.wait_for_height(max(v.ledger.state.height, h0 + 12) + 1, timeout=30)
    end = time.monotonic()
    real = [r.receipt.id for r in out["receipts"]] + [out["transfer"]]
    real += [vid for r in out["receipts"] for vid in _vote_ids(v, r)]
    times = [(t, n, b) for t, _, n, b in blocks if start <= t <= end]
    intervals = [b[0] - a[0] for a, b in itertools.pairwise(times)]
    return {"receipts": out["receipts"], "lags": [included[t] - admitted[t] for t in real],
            "api_refused": out["api_refused"], "median_interval": statistics.median(intervals),
            "blocks": len(times), "max_pool": max(n for _, n, _ in times), "max_pool_bytes": max(b for *_, b in times),
            "flood": out.get("flood", []), "drain_s": out.get("drain_s")}


def _vote_ids(v, rec) -> list[bytes]:
    """Ids of the votes on ``rec`` that are on the ledger (rebuilt from its record: voter, round, verdict, ppm;
    an id does not cover the signature)."""
    from node.ledger.core.tx import Vote

    return [Vote(v.ledger.chain_id, rec.receipt.id, voter, round_, verdict, ppm).id
            for voter, round_, verdict, ppm in rec.votes]


if __name__ == "__main__":
    flooder(json.loads(sys.argv[1]))
