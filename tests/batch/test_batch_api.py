"""``/v1/batches``, the explorer's batch pages and ``node batch`` against one live in-process node (real libp2p host,
LevelDB, API): a bad file or parameter is refused with its reason and posts nothing; a good one is posted with
escrow, listed, shown, and cancelled back to the requester while no worker offers to draw it. A post that fewer
than k opted-in workers take is refused (issue 24 finding 2); three bonded accounts offer, the post lands, and they
withdraw before its first draw (their nodes never run), so the batch stays open."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from node.compute.model import make_tiny
from node.identity import Identity, dev_seed
from node.ledger.core.batchtx import WITHDRAWN, BatchOffer, BatchPost
from node.runtime import Node

from ..e2e.swarm import node_config, tiny_genesis
from .offers import wait_offers

ROOT = Path(__file__).resolve().parents[2]
GOOD = '{"text": "To be, or not to be"}\n{"text": "that is the question"}\n'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def batch_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", "batch", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_batch_api_and_cli(tmp_path, tiny):
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text('{"text": "fine"}\n{"text": oops}\n')
    good_file = tmp_path / "good.jsonl"
    good_file.write_text(GOOD)

    async def main():
        async with trio.open_nursery() as n:
            node = Node(node_config(tmp_path, 0, tiny_genesis(3), tiny))
            n.start_soon(node.run)
            await node.started.wait()
            st = node.ledger.state
            me = node.ident.account
            bal0 = st.account(me).balance
            http = httpx.Client(base_url=node.api_url, headers={"Authorization": f"Bearer {node.api_token}"})

            async def call(method, path, **kw):
                return await trio.to_thread.run_sync(lambda: http.request(method, path, **kw))

            async def cli(*args):
                return await trio.to_thread.run_sync(lambda: batch_cli(node.cfg.data_dir, *args))

            out = {}
            out["bad"] = await call("POST", "/v1/batches", json={"items": '{"text": "a"}\n{"text": oops}\n',
                                                                 "kind": "score"})
            out["bad_kind"] = await call("POST", "/v1/batches", json={"items": GOOD, "kind": "generate"})
            out["bad_quorum"] = await call("POST", "/v1/batches", json={"items": GOOD, "kind": "score",
                                                                        "replication": 4, "quorum": 2})
            out["rich"] = await call("POST", "/v1/batches", json={"items": GOOD, "kind": "score", "price": "1000"})
            out["no_token"] = await trio.to_thread.run_sync(
                lambda: httpx.post(node.api_url + "/v1/batches", json={"items": GOOD, "kind": "score"}))
            out["cli_bad"] = await cli("post", str(bad_file), "--kind", "score")
            await node.ledger.wait_for_height(node.ledger.state.height + 2, timeout=30)
            out["after_bad"] = (len(node.ledger.state.tables["batches"]), node.ledger.state.account(me).balance,
                                len(node.ledger.candidates()))
            out["no_takers"] = await call("POST", "/v1/batches", json={"items": GOOD, "kind": "score",
                                                                       "replication": 3, "price": "0.5"})
            keys = [Identity.from_seed(dev_seed(i)) for i in (1, 2, 3)]  # bonded; their nodes never run
            for k in keys:
                await node.ledger.submit(BatchOffer(node.ledger.chain_id, k.account, 0, 0).signed(k))
            await wait_offers(node, [k.account for k in keys])

            async def withdraw_once_posted():  # in the post's block or the next: before its first draw
                with trio.fail_after(120):
                    while not any(isinstance(node.ledger.mempool[t], BatchPost) for t in node.ledger.mempool):
                        await trio.sleep(0.002)
                for k in keys:
                    await node.ledger.submit(BatchOffer(node.ledger.chain_id, k.account, WITHDRAWN, 1).signed(k))
            n.start_soon(withdraw_once_posted)
            out["cli_post"] = await cli("post", str(good_file), "--kind", "score", "-k", "3", "--price", "0.5")
            bid = out["cli_post"].stdout.split()[2]
            with trio.fail_after(30):
                while bytes.fromhex(bid) not in node.ledger.state.tables["batches"]:
                    await node.ledger.new_block.wait()
            out["bal_posted"] = node.ledger.state.account(me).balance
            out["list"] = (await call("GET", "/v1/batches")).json()
            out["one"] = (await call("GET", f"/v1/batches/{bid}?items=true")).json()
            out["page"] = await call("GET", f"/batches/{bid}", headers={"Accept": "text/html"})
            out["pages"] = await call("GET", "/batches", headers={"Accept": "text/html"})
            out["missing"] = await call("GET", "/v1/batches/" + "0" * 32)
            out["fetch_open"] = (await call("POST", f"/v1/batches/{bid}/fetch", json={})).json()
            out["cli_status"] = await cli("status", bid)
            out["cli_cancel"] = await cli("cancel", bid)
            with trio.fail_after(30):
                while node.ledger.state.tables["batches"][bytes.fromhex(bid)].status.value != "cancelled":
                    await node.ledger.new_block.wait()
            out["bal_end"] = node.ledger.state.account(me).balance
            out["bal0"], out["bid"] = bal0, bid
            http.close()
            n.cancel_scope.cancel()
        return out

    o = trio.run(main)
    assert o["bad"].status_code == 400 and o["bad"].json()["code"] == "bad_batch"
    assert "line 2: bad JSON" in o["bad"].json()["message"]
    assert o["bad_kind"].status_code == 400 and "line 1" in o["bad_kind"].json()["message"]
    assert o["bad_quorum"].status_code == 400 and "quorum" in o["bad_quorum"].json()["message"]
    assert o["rich"].status_code == 400 and "balance cannot cover" in o["rich"].json()["message"]
    assert o["no_token"].status_code == 401
    assert o["cli_bad"].returncode != 0 and "line 2: bad JSON" in o["cli_bad"].stderr
    assert o["after_bad"] == (0, o["bal0"], 0)  # nothing posted, nothing queued, nothing spent
    assert o["no_takers"].status_code == 400 and "only 0 bonded account(s) other than the requester accept " \
        "batches" in o["no_takers"].json()["message"]
    assert o["cli_post"].returncode == 0, o["cli_post"].stderr
    escrow = 2 * 3 * 500_000_000 * 2  # n × k × price × (1 + max_reissues)
    assert o["bal0"] - o["bal_posted"] == escrow
    assert o["list"]["total"] == 1 and o["list"]["batches"][0]["batch_id"] == o["bid"]
    one = o["one"]
    assert one["status"] == "open" and one["n_items"] == 2 and one["kind"] == "score" and one["max_tokens"] == 0
    assert one["escrow"]["base_units"] == str(escrow) and one["items"] == [] and one["agreement_rate"] is None
    assert o["page"].status_code == 200 and o["bid"] in o["page"].text and "0 of 2 items decided" in o["page"].text
    assert o["pages"].status_code == 200 and o["bid"] in o["pages"].text
    assert o["missing"].status_code == 404
    assert o["fetch_open"]["results"] == [] and o["fetch_open"]["status"] == "open"
    assert o["cli_status"].returncode == 0 and "open" in o["cli_status"].stdout and "0/2 decided" in \
        o["cli_status"].stdout
    assert o["cli_cancel"].returncode == 0 and "cancel submitted" in o["cli_cancel"].stdout
    assert o["bal_end"] == o["bal0"]  # the whole escrow came back
