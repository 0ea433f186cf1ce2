"""``node start --accept-batches --batch-floor`` publishes the node's batch offer on the ledger and a start without
the flag withdraws it (issue 24 finding 2); a node that never offered sends nothing; ``/v1/status`` carries the
small-network warning (finding 8). Real nodes in one process: libp2p on 127.0.0.1, LevelDB, API, the tiny model."""

from __future__ import annotations

import httpx
import pytest
import trio

from node.compute.model import make_tiny
from node.ledger.core.batch import reputation
from node.ledger.core.batchtx import WITHDRAWN
from node.runtime import Node

from ..e2e.swarm import node_config, tiny_genesis

FLOOR = 5_000  # base units per token


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_offer_follows_the_flag_across_restarts_and_status_warns_on_a_small_network(tmp_path, tiny):
    g = tiny_genesis(3)  # three bonded servers: committees of at most 1 member for a receipt between two of them

    async def until(nd: Node, cond, timeout: float = 60.0) -> None:
        with trio.fail_after(timeout):
            while not cond(nd.ledger.state):
                await nd.ledger.new_block.wait()

    async def main():
        out = {}
        async with trio.open_nursery() as n:
            async def start(i: int, accept: bool, floor: int | None = None):
                cfg = node_config(tmp_path, i, g, tiny)
                cfg.accept_batches, cfg.batch_floor = accept, floor
                if i:
                    cfg.bootstrap = v.host.addrs
                nd = Node(cfg)
                scope = trio.CancelScope()

                async def run():
                    with scope:
                        await nd.run()
                n.start_soon(run)
                await nd.started.wait()
                return nd, scope

            v, _ = await start(0, False)
            w1, s1 = await start(1, True, FLOOR)
            w2, _ = await start(2, False)
            a1, a2 = w1.ident.account, w2.ident.account
            await until(v, lambda st: reputation(st, a1).offer == FLOOR)
            out["nonce_after_offer"] = v.ledger.state.account(a1).nonce
            http = httpx.Client(base_url=v.api_url, headers={"Authorization": f"Bearer {v.api_token}"})
            out["offered"] = (await trio.to_thread.run_sync(lambda: http.get(f"/v1/accounts/{w1.ident.peer_id}"))
                              ).json()["batch_offer"]
            s1.cancel()
            await trio.sleep(0.5)
            await start(1, False)  # same key and data dir, started without --accept-batches
            await until(v, lambda st: reputation(st, a1).offer == WITHDRAWN)
            await v.ledger.wait_for_height(v.ledger.state.height + 6, timeout=60)  # time to send anything more
            st = v.ledger.state
            out["after"] = (reputation(st, a1).offer, st.account(a1).nonce, reputation(st, a2).offer,
                            st.account(a2).nonce)
            out["status"] = (await trio.to_thread.run_sync(lambda: http.get("/v1/status"))).json()
            out["withdrawn"] = (await trio.to_thread.run_sync(lambda: http.get(f"/v1/accounts/{w1.ident.peer_id}"))
                                ).json()["batch_offer"]
            http.close()
            n.cancel_scope.cancel()
        return out

    o = trio.run(main)
    assert o["nonce_after_offer"] == 1  # one offer, sent once
    assert o["offered"]["base_units"] == str(FLOOR) and o["withdrawn"] is None  # GET /v1/accounts/ID
    assert o["after"] == (WITHDRAWN, 2, WITHDRAWN, 0)  # withdrawn with one more tx; node 2 never sent anything
    warning = o["status"]["committee_warning"]
    assert "only 3 bonded account(s)" in warning and "bond at least 5 accounts" in warning
