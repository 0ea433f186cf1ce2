"""Issue 26: the API's routers are module-level and reach the node through FastAPI dependencies
(:mod:`node.api.deps`), so one process may build several apps. Each request must read the node, the views and the
API token of the app it reached, never another app's. Two real LevelDB ledgers in tmp dirs and the real app over
each (no network: these routes read and write the ledger service)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from starlette.testclient import TestClient

from node.api.app import create_app
from node.ledger.core.tx import Transfer
from node.ledger.service import LedgerService
from node.ledger.store import LedgerStore
from tests.ledger.helpers import KEYS, VALIDATOR, W1, C, make_genesis

JS = {"accept": "application/json"}


def _app(tmp_path, name: str, token: str, validator_balance: int = 1000 * C):
    g = make_genesis()
    g = replace(g, balances=((VALIDATOR.account, validator_balance, 0), *g.balances[1:]))
    store = LedgerStore(tmp_path / name, g)
    svc = LedgerService(store, g, VALIDATOR, None)
    node = SimpleNamespace(store=store, ledger=svc, genesis=g, ident=VALIDATOR, api_token=token)
    return node, TestClient(create_app(node), base_url="http://127.0.0.1")


def test_two_apps_in_one_process_each_serve_their_own_node_and_token(tmp_path):
    a, ca = _app(tmp_path, "a", "token-a")
    b, cb = _app(tmp_path, "b", "token-b", validator_balance=C // 2)
    t = Transfer(a.genesis.domain, W1.account, KEYS[2].account, C, 0).signed(W1)
    a.ledger.add_tx(t)  # queued on node a only
    got_a = ca.get(f"/v1/txs/{t.id.hex()}/status", headers=JS)
    got_b = cb.get(f"/v1/txs/{t.id.hex()}/status", headers=JS)
    assert got_a.status_code == 200 and got_a.json()["status"] == "pending"
    assert got_b.status_code == 200 and got_b.json()["status"] == "unknown"

    # the token of one app opens nothing on the other, and a refused request queues nothing anywhere
    body = {"to": W1.peer_id, "amount": "1"}
    before = (set(a.ledger.mempool), set(b.ledger.mempool))
    for client, token in ((cb, "token-a"), (ca, "token-b"), (ca, "")):
        r = client.post("/v1/transfer", json=body, headers={**JS, "Authorization": f"Bearer {token}"})
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    assert (set(a.ledger.mempool), set(b.ledger.mempool)) == before

    # each app reads its own ledger: b's validator holds less than a's
    bal = [c.get(f"/v1/accounts/{VALIDATOR.peer_id}", headers=JS).json()["balance"]["base_units"] for c in (ca, cb)]
    assert bal == [str(1000 * C), str(C // 2)]

    # with its own token, b's request is let through and checked against b's state (its dry run refuses a
    # transfer that a's state would allow); nothing is queued
    r = cb.post("/v1/transfer", json=body, headers={**JS, "Authorization": "Bearer token-b"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_tx" and "balance" in r.json()["message"], r.text
    assert (set(a.ledger.mempool), set(b.ledger.mempool)) == before
