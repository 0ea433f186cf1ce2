"""Issue 13, check 4: a fifth validator joins a running four-validator chain by bonding, then signs blocks; one
of the five is stopped and blocks keep finalising; a light client follows the change from genesis.

Five separate `node start` processes on 127.0.0.1 (five in-process validators in one trio thread starve on two
cores). The fifth node bonds and joins with the wallet CLI (`node wallet bond`, `node wallet validator join`),
as a user would. Voting power is the bond: four of 200 credits and the newcomer's 300 make 1,100, so after
stopping one of the old four, the remaining 600 + 300 = 900 is more than 2/3 (733.4) only with the newcomer's
precommits: blocks that keep finalising prove it signs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from node.compute.model import make_tiny
from node.encoding import unpack
from node.identity import Identity, dev_seed
from node.ledger.genesis import parse_genesis
from node.ledger.proofs import LightClient, parse_light_block

from ..inference.procs import free_port
from .test_processes import ROOT, info, start, status, stop_all, wait_height

C = 10**9


def wallet(data_dir, *args: str, timeout: float = 240) -> str:
    """``node wallet`` (waiting up to ``timeout`` seconds for the block, as the CLI's ``--timeout``)."""
    r = subprocess.run([sys.executable, "-m", "node.cli", "wallet", "--data-dir", str(data_dir), *args,
                        "--timeout", str(timeout)], capture_output=True, text=True, timeout=timeout + 60, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def signers(api: str, height: int) -> set[str]:
    blk = httpx.get(f"{api}/v1/blocks/{height}", timeout=10).json()
    return {c["validator"] for c in blk["commit"]}


@pytest.mark.slow  # five node processes on 2 cores, about two minutes; CI's slow step runs it
def test_fifth_validator_joins_signs_and_carries_the_chain_when_one_stops(tmp_path):
    cache = tmp_path / "models"
    make_tiny(cache, 0)
    ids = [Identity.from_seed(dev_seed(i)).peer_id for i in range(5)]
    doc = {"chain_id": "tally-test-valjoin", "validators": ids[:4],
           "accounts": [{"account": a, "balance": "100", "bond": "200"} for a in ids[:4]]
           + [{"account": ids[4], "balance": "500", "bond": "0"}],  # credits
           "params": {"block_time_ms": 1000, "min_validator_bond": 150 * C}}  # params in base units
    genesis_file = tmp_path / "genesis.json"
    genesis_file.write_text(json.dumps(doc))
    genesis = parse_genesis(doc)
    dirs = [tmp_path / f"v{i}" for i in range(5)]
    procs: list = []
    try:
        # all five start at once (one that is up long before the others proposes blocks they find stale): the
        # first on a known port, which the others dial
        port = free_port()
        boot = f"/ip4/127.0.0.1/tcp/{port}/p2p/{ids[0]}"
        procs.append(start(dirs[0], cache, "--genesis", str(genesis_file), "--dev-account", "0",
                           "--listen", f"/ip4/127.0.0.1/tcp/{port}"))
        for i in (1, 2, 3, 4):
            procs.append(start(dirs[i], cache, "--genesis", str(genesis_file), "--dev-account", str(i),
                               "--bootstrap", boot))
        infos = [info(dirs[i], procs[i], timeout=180) for i in range(5)]
        apis = [x["api"] for x in infos]
        wait_height(apis[4], 3, timeout=240)
        vals = httpx.get(f"{apis[0]}/v1/validators", timeout=10).json()
        assert len(vals["validators"]) == 4 and vals["changes"] and vals["total_power"] == str(800 * C)

        # the fifth account bonds, then asks to validate (the CLI waits until each is in a block)
        wallet(dirs[4], "bond", "300")
        out = wallet(dirs[4], "validator", "join")
        h_join = int(out.split("height")[1].split()[0])
        mid = httpx.get(f"{apis[4]}/v1/validators", timeout=10).json()
        if mid["height"] < h_join + 1:  # before it is effective, it shows as pending
            assert any(p["account"] == ids[4] and p["power"] == str(300 * C) for p in mid["pending"]), mid
        top = wait_height(apis[0], h_join + 5, timeout=240)
        vals = httpx.get(f"{apis[0]}/v1/validators", timeout=10).json()
        assert {v["account"] for v in vals["validators"]} == set(ids) and vals["total_power"] == str(1100 * C)
        assert ids[4] not in signers(apis[0], h_join + 1)  # not yet in the set of h + 1
        signed_by_new = [h for h in range(h_join + 2, top + 1) if ids[4] in signers(apis[0], h)]
        assert signed_by_new, "the new validator's precommits never appeared in a commit"

        # stop one of the old four: 600 + 300 of 1100 is a quorum only with the newcomer
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        h_stop = max(status(api)["height"] for api in apis[:1] + apis[2:])
        after = wait_height(apis[0], h_stop + 5, timeout=240)
        wait_height(apis[4], after, timeout=120)
        for h in range(h_stop + 2, after + 1):
            who = signers(apis[0], h)
            assert ids[1] not in who and ids[4] in who, (h, who)
        for h in range(1, after + 1):  # one chain
            assert len({httpx.get(f"{api}/v1/blocks/{h}", timeout=10).json()["hash"]
                        for api in (apis[0], apis[4])}) == 1, f"fork at height {h}"

        # a light client, trusting only the genesis, follows every header through the change
        lc = LightClient(genesis)
        for h in range(1, after + 1):
            lb = httpx.get(f"{apis[2]}/v1/light/{h}", timeout=10).json()["light_block"]
            lc.update(*parse_light_block(unpack(bytes.fromhex(lb))))
        assert lc.height == after and Identity.from_seed(dev_seed(4)).account in lc.valset
        assert lc.hash.hex() == httpx.get(f"{apis[0]}/v1/blocks/{after}", timeout=10).json()["hash"]
        assert len(lc.valset) == 5 and lc.valset.total == 1100 * C
    finally:
        stop_all(procs)
        time.sleep(0.1)


def test_joined_validator_is_needed_and_counted_in_process(tmp_path):
    """Three nodes in one trio loop (real libp2p on loopback, LevelDB): two genesis validators of 200 credits and
    a bonded account of 300 that joins. After the change 400 of 700 is not a quorum (more than 466.7 needed), so
    every later block proves the newcomer's precommits are counted; its precommits are in the commits."""
    import trio

    from node.config import NodeConfig
    from node.ledger.core.valset import ValidatorJoin
    from node.ledger.genesis import Genesis, Params
    from node.runtime import Node

    keys = [Identity.from_seed(dev_seed(i)) for i in range(3)]
    p = Params(block_time_ms=300, price_per_token_block=100_000, max_receipt_price=50 * C,
               min_validator_bond=150 * C)
    g = Genesis("tally-test-join", 0, tuple(k.account for k in keys[:2]),
                tuple((k.account, 100 * C, 200 * C) for k in keys[:2]) + ((keys[2].account, 100 * C, 300 * C),), p)
    model_dir = make_tiny(tmp_path / "models", seed=0)
    seen: dict = {}

    async def main():
        async with trio.open_nursery() as n:
            nodes = []
            for i in range(3):
                cfg = NodeConfig(data_dir=tmp_path / f"v{i}", genesis=g, model_dir=model_dir, seed=dev_seed(i),
                                 bootstrap=[a for nd in nodes for a in nd.host.addrs[:1]])
                nd = Node(cfg)
                nodes.append(nd)
                n.start_soon(nd.run)
                await nd.started.wait()
            with trio.fail_after(60):
                while min(nd.ledger.state.height for nd in nodes) < 2:
                    await trio.sleep(0.05)
            joiner = nodes[2]
            assert not joiner.ledger.is_validator
            await joiner.ledger.submit(ValidatorJoin(g.domain, keys[2].account,
                                                     joiner.ledger.next_nonce(keys[2].account)).signed(keys[2]))
            with trio.fail_after(60):
                while keys[2].account not in nodes[0].ledger.state.valset():
                    await trio.sleep(0.05)
            seen["from"] = nodes[0].ledger.state.height + 1  # the first height the three sign
            with trio.fail_after(60):
                while min(nd.ledger.state.height for nd in nodes) < seen["from"] + 3:
                    await trio.sleep(0.05)
            assert joiner.ledger.is_validator
            seen["commits"] = [nodes[0].store.get_block(h)[1] for h in range(seen["from"], seen["from"] + 3)]
            seen["valset"] = nodes[1].ledger.state.valset()
            n.cancel_scope.cancel()

    trio.run(main)
    assert seen["valset"].total == 700 * C and len(seen["valset"]) == 3
    for commit in seen["commits"]:
        signers = {bytes(v) for v, _r, _s in commit}
        assert keys[2].account in signers, "a block after the change finalised without the newcomer"
