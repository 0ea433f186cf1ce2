"""The wallet/credits API on a live swarm: reads, history, receipts by account with verdicts, transfers, bonds,
blocks and transactions, search, pagination, error shapes, /metrics and the offline /docs."""

from __future__ import annotations

import re
import time

import httpx
from hypothesis import HealthCheck, given, settings, strategies as st

from node.encoding import AMOUNT_FORM
from node.identity import account_to_str
from node.ledger.core.jobstate import jobs_of
from node.ledger.genesis import TREASURY
from tests.ledger.test_accounts_valid import BAD
from tests.test_amounts import ALPHABET, ORACLE

from .conftest import get, post

C = 10**9


def _amount_ok(a: dict) -> bool:
    return set(a) == {"base_units", "credits"} and a["base_units"].isdigit() and isinstance(a["credits"], str)


def test_reads_history_receipts_transfer_and_search(live):
    api, client = live.api, live.client
    gen = live.generate([3, 1, 4], 3)
    rid = gen.receipts[0].id.hex()
    worker = gen.receipts[0].worker
    from node.identity import account_to_str

    w = account_to_str(worker)
    me = client.ident.peer_id

    end = time.monotonic() + 15  # the swarm view is built from announcements, which can trail the first session
    while len((status := get(f"{api}/v1/status").json())["swarm"]) < 3 and time.monotonic() < end:
        time.sleep(0.2)
    assert status["validator"] is True and status["validators"] == 1 and len(status["swarm"]) == 3
    acc = get(f"{api}/v1/accounts/{me}").json()
    assert all(_amount_ok(acc[k]) for k in ("balance", "bond", "escrow", "slashed"))

    # receipts by account with their verdicts, for the worker, the requester and a committee member
    rec = get(f"{api}/v1/receipts/{rid}").json()
    assert rec["status"] == "valid" and len(rec["votes"]) == 2 and rec["kind"] == "inference"
    mine = get(f"{api}/v1/accounts/{w}/receipts").json()["receipts"]
    assert [x["role"] for x in mine if x["receipt"]["id"] == rid] == ["worker"]
    member = rec["committee"][0]
    theirs = get(f"{api}/v1/accounts/{member}/receipts").json()["receipts"]
    assert any(x["role"] == "committee" and x["receipt"]["status"] == "valid" for x in theirs)
    req = get(f"{api}/v1/accounts/{me}/receipts?limit=2").json()
    assert len(req["receipts"]) == 2 and req["next"] and all(x["role"] == "requester" for x in req["receipts"])
    rest = get(f"{api}/v1/accounts/{me}/receipts?limit=2&cursor={req['next']}").json()
    assert len(rest["receipts"]) == 1 and rest["next"] is None

    # a transfer: refused without funds, accepted with the token, then in both histories
    too_much = post(f"{api}/v1/transfer", headers=live.auth, json={"to": w, "amount": "1000000"})
    assert too_much.status_code == 400 and too_much.json()["code"] == "invalid_tx"
    w_before = int(get(f"{api}/v1/accounts/{w}").json()["balance"]["base_units"])
    assert get(f"{api}/v1/accounts/{w}").json()["balance"]["base_units"] == str(w_before)  # cached, same answer
    r = post(f"{api}/v1/transfer", headers=live.auth, json={"to": w, "amount": "2.5"})
    assert r.status_code == 200, r.text
    sent = r.json()
    assert sent["amount"] == {"base_units": str(25 * C // 10), "credits": "2.5"} and sent["kind"] == "transfer"
    tx = None
    for _ in range(100):
        tx = get(f"{api}/v1/txs/{sent['id']}")
        if tx.status_code == 200:
            break
        live.wait_height(live.call(lambda: client.ledger.state.height) + 1)
    assert tx.status_code == 200 and tx.json()["kind"] == "transfer"
    t = tx.json()
    assert t["fields"]["recipient"] == w and t["fields"]["amount"]["credits"] == "2.5"
    again = get(f"{api}/v1/accounts/{w}")  # the response cache follows the new state
    assert int(again.json()["balance"]["base_units"]) - w_before == 25 * C // 10
    assert "script-src 'self'" in again.headers["content-security-policy"]
    assert get(f"{api}/v1/accounts/{w}", headers={"Host": "attacker.example"}).status_code == 403
    hist_w = get(f"{api}/v1/accounts/{w}/history").json()["events"]
    assert hist_w[0]["kind"] == "transfer" and hist_w[0]["role"] == "recipient"
    assert any(e["kind"] == "payout" and e["receipt"] == rid for e in hist_w)
    hist_me = get(f"{api}/v1/accounts/{me}/history?limit=1").json()
    assert hist_me["events"][0]["tx"] == sent["id"] and hist_me["next"]
    older = get(f"{api}/v1/accounts/{me}/history?limit=50&cursor={hist_me['next']}").json()["events"]
    assert {"paid", "receipt"} <= {e["kind"] for e in older} and sent["id"] not in [e["tx"] for e in older]
    effects = {e["kind"]: e["effect"] for e in older if e["kind"] in ("paid", "receipt")}
    assert "into escrow" in effects["receipt"] and "escrow released" in effects["paid"]  # one price, not two
    assert get(f"{api}/v1/accounts/{me}/history?cursor=garbage").status_code == 422

    # blocks, pagination and the block of the transfer
    blocks = get(f"{api}/v1/blocks?limit=5").json()
    assert len(blocks["blocks"]) == 5 and blocks["next"]
    heights = [b["height"] for b in blocks["blocks"]]
    assert heights == sorted(heights, reverse=True)
    older_blocks = get(f"{api}/v1/blocks?limit=5&before={blocks['next']}").json()["blocks"]
    assert older_blocks[0]["height"] == heights[-1] - 1
    blk = get(f"{api}/v1/blocks/{t['height']}").json()
    assert sent["id"] in [x["id"] for x in blk["txs"]] and blk["hash"] == t["block_hash"] and blk["commit"]

    # search: height, block hash, receipt id, tx id, account, nothing
    def s(q):
        return get(f"{api}/v1/search", params={"q": q})

    assert s(str(t["height"])).json()["url"] == f"/blocks/{t['height']}"
    assert s(t["block_hash"]).json()["kind"] == "block"
    assert s(rid).json() == {"kind": "receipt", "id": rid, "url": f"/receipts/{rid}", "api": f"/v1/receipts/{rid}"}
    assert s(sent["id"]).json()["kind"] == "tx"
    assert s(w).json()["url"] == f"/accounts/{w}"
    assert s("deadbeef" * 8).status_code == 404 and s("hello").json()["code"] == "not_found"
    assert s("\u00b97").status_code == 404  # a superscript digit is no height (found by Schemathesis)

    # bonds, validators, swarm, verification
    bonds = get(f"{api}/v1/bonds").json()
    assert w in [b["account"] for b in bonds["bonds"] if b["eligible"]]
    vals = get(f"{api}/v1/validators").json()
    assert vals["validators"][0]["account"] == me and vals["validators"][0]["signed"] == vals["window"]
    sw = get(f"{api}/v1/swarm").json()
    assert sw["covered"] == sw["num_blocks"] == 6 and sw["coverage"] == [1] * 6
    ver = get(f"{api}/v1/verification").json()
    assert ver["valid"] >= 3 and ver["sampled"] >= 3 and ver["votes"]["valid"] >= 6
    assert sum(b["valid"] for b in ver["series"]) == ver["valid"]


def test_status_names_no_span_while_auto_has_not_chosen_one(live):
    """``--span auto`` before the node has chosen its blocks: ``/v1/status`` says null, not the letters of "auto"
    (it said ``["a", "u", "t", "o"]``); once chosen, the (start, end) pair."""
    server = live.nodes[1]
    chosen = server.cfg.span
    try:
        live.call(lambda: setattr(server.cfg, "span", "auto"))
        assert get(f"{server.api_url}/v1/status").json()["span"] is None
        assert live.call(server.info)["span"] is None  # node.json likewise
    finally:
        live.call(lambda: setattr(server.cfg, "span", chosen))
    assert get(f"{server.api_url}/v1/status").json()["span"] == list(chosen)


def test_bond_unbond_dry_run_and_errors(live):
    api, client = live.api, live.client
    before = live.call(lambda: dict(client.ledger.mempool))
    r = post(f"{api}/v1/unbond", headers=live.auth, json={"amount": "1"})  # node 0 has no bond
    assert r.status_code == 400 and r.json() == {"code": "invalid_tx", "message": "unbond exceeds the bond"}
    r = post(f"{api}/v1/bond", headers=live.auth, json={"amount": "0"})
    assert r.status_code == 400 and r.json()["code"] == "bad_amount"
    r = post(f"{api}/v1/transfer", headers=live.auth, json={"to": TREASURY.hex(), "amount": "1"})
    assert r.status_code == 400 and r.json()["code"] == "bad_account"
    assert live.call(lambda: dict(client.ledger.mempool)) == before
    r = post(f"{api}/v1/bond", headers=live.auth, json={"amount": "1.25"})
    assert r.status_code == 200 and r.json()["kind"] == "bond"
    # errors are JSON with a code and a message, whatever failed
    for path, code, status in [("/v1/nope", "not_found", 404), ("/v1/blocks/0", "bad_request", 422),
                               ("/v1/blocks/99999999", "not_found", 404), ("/v1/receipts/xyz", "bad_request", 422),
                               ("/v1/accounts/notapeer", "bad_request", 422),
                               ("/v1/accounts/12D3KooW" + "1" * 44, "bad_account", 400),
                               ("/v1/accounts/" + client.ident.account.hex() + "/history?cursor=abc", "bad_cursor",
                                400),
                               ("/v1/accounts/" + "ab" * 32, "bad_account", 400)]:  # 32 bytes, but no point
        r = get(api + path)
        assert r.status_code == status and r.json()["code"] == code and r.json()["message"], (path, r.text)
    r = httpx_put(f"{api}/v1/status")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    r = post(f"{api}/v1/transfer", headers={**live.auth, "Content-Type": "text/plain"}, content=b"to=x")
    assert r.status_code == 422 and r.json()["code"] == "bad_request"


def httpx_put(url):
    import httpx

    return httpx.put(url, timeout=30)


def test_metrics_and_offline_docs(live):
    api = live.api
    live.generate([5, 6], 2)
    text = get(f"{api}/metrics").text
    values = {}
    for line in text.splitlines():
        m = re.match(r"^(tally_[a-z0-9_]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    height = live.call(lambda: live.client.ledger.state.height)
    assert values["tally_blocks_total"] >= height - 1 and values["tally_block_height"] >= height - 1
    assert values["tally_receipts_total"] >= 3 and values['tally_verdicts_total{verdict="valid"}'] >= 3
    assert values['tally_votes_total{verdict="valid"}'] >= 6 and values["tally_ledger_sessions_total"] >= 3
    assert values['tally_p2p_stream_bytes_total{direction="sent"}'] > 0 and values["tally_peers"] >= 3
    assert values["tally_ledger_block_bytes_total"] > 0 and values["tally_swarm_blocks_covered"] == 6
    assert "# TYPE tally_blocks_total counter" in text

    docs = get(f"{api}/docs")
    assert docs.status_code == 200 and "/static/swagger/swagger-ui-bundle.js" in docs.text
    assert not re.search(r"(src|href)=\"https?://", docs.text)  # nothing from a CDN
    assert get(f"{api}/static/swagger/swagger-ui-bundle.js").status_code == 200
    schema = get(f"{api}/openapi.json").json()
    assert schema["components"]["securitySchemes"]["api_token"]["scheme"] == "bearer"
    for path in ("/v1/status", "/v1/accounts/{account}/history", "/v1/accounts/{account}/receipts", "/v1/bonds",
                 "/v1/transfer", "/v1/txs/{tx_id}", "/v1/proofs/receipts/{receipt_id}", "/v1/search"):
        assert path in schema["paths"], path


# every spelling the issue found moving credits, and the other classes of non-canonical amount
NON_CANONICAL = [" 1", "1 ", "1e0", "+1E-9", "1e3", "1E3", "\uff11", "\u0661", "1.", ".5", "01", "00.5", "-1", "+1",
                 "1.0000000001", "1,5", "1_0", "0x1", "NaN", "Infinity", "", " ", "1\n", "\u00b2", "1..5"]
OUT_OF_RANGE = ["0", "0.0", "0.000000000", "9223372036.854775808", "99999999999"]  # canonical, but not payable


def _mine(live):
    """Everything of this node's that an accepted transfer, bond, unbond or job post changes, and nothing that the
    swarm's background work (receipts settling, other nodes' votes) moves: its nonce and bond, the transactions it
    has queued, and the jobs on the ledger. Read on the swarm's own thread."""
    def read():
        c = live.client
        me = c.ident.account
        acc = c.ledger.state.account(me)
        queued = frozenset(t.id for t in list(c.ledger.mempool.values()) if getattr(t, "sender", None) == me)
        return acc.nonce, acc.bond, queued, len(jobs_of(c.ledger.state))
    return live.call(read)


def _settled_mine(live, blocks: int = 200):
    """:func:`_mine` once this node's own queued transactions (an earlier test's bond) are in blocks (bounded)."""
    for _ in range(blocks):
        got = _mine(live)
        if not got[2]:
            return got
        live.wait_height(live.call(lambda: live.client.ledger.state.height) + 1)
    raise AssertionError("this node's transactions stayed queued")


def _amount_requests(api: str, to: str, amount):
    return [(f"{api}/v1/transfer", {"to": to, "amount": amount}), (f"{api}/v1/bond", {"amount": amount}),
            (f"{api}/v1/unbond", {"amount": amount}),
            (f"{api}/v1/jobs", {"text": "to be or not to be", "steps": 1, "price_per_step": amount})]


def test_api_refuses_every_non_canonical_amount_and_changes_nothing(live):
    api, to = live.api, live.nodes[1].ident.peer_id
    before = _settled_mine(live)
    seen = []
    http = httpx.Client(timeout=30, headers=live.auth)  # one keep-alive connection for the few hundred requests

    def refuse(amount, code: int, says: str):
        for url, body in _amount_requests(api, to, amount):
            r = http.post(url, json=body)
            assert r.status_code == code, (url, amount, r.status_code, r.text)
            assert says in r.json()["message"], (url, amount, r.text)
            seen.append(url)

    for amount in NON_CANONICAL:  # the spelling: 422 with the accepted form
        refuse(amount, 422, AMOUNT_FORM)
    for amount in OUT_OF_RANGE[:3]:  # the value: 400 bad_amount
        refuse(amount, 400, "positive")
    for amount in OUT_OF_RANGE[3:]:
        refuse(amount, 400, "at most 9223372036.854775807 credits")
    for amount in (1, 1.5, None, ["1"]):  # JSON numbers and other types: never an amount
        refuse(amount, 422, "string")

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.text(alphabet=ALPHABET, max_size=16).filter(lambda t: not ORACLE.match(t)),
           st.integers(0, 3))
    def generated(amount, endpoint):  # one endpoint per example: the parser's own property test is tests/test_amounts
        url, body = _amount_requests(api, to, amount)[endpoint]
        r = http.post(url, json=body)
        assert r.status_code == 422 and AMOUNT_FORM in r.json()["message"], (url, amount, r.text)
        seen.append(url)

    generated()
    http.close()
    assert _mine(live) == before and len(seen) >= 4 * (len(NON_CANONICAL) + len(OUT_OF_RANGE) + 4) + 40
    # the canonical spelling of the same amount is accepted: the refusals above were about the spelling
    r = post(f"{api}/v1/bond", headers=live.auth, json={"amount": "1.000000000"})
    assert r.status_code == 200 and r.json()["amount"]["base_units"] == str(C), r.text
    assert _mine(live) != before


def test_api_refuses_accounts_that_are_no_ed25519_key(live):
    api = live.api
    before = _settled_mine(live)
    for what, raw in BAD.items():
        for text in (account_to_str(raw), raw.hex()):
            r = post(f"{api}/v1/transfer", headers=live.auth, json={"to": text, "amount": "1"})
            assert r.status_code == 400 and r.json()["code"] == "bad_account", (what, r.text)
            assert "not a valid Ed25519 public key" in r.json()["message"], (what, r.text)
            for path in (f"/v1/accounts/{text}", f"/v1/accounts/{text}/history"):
                r = get(api + path)
                assert r.status_code == 400 and r.json()["code"] == "bad_account", (what, path, r.text)
    assert _mine(live) == before
    assert not live.call(lambda: [raw for raw in BAD.values() if raw in live.client.ledger.state.accounts
                                  and raw != TREASURY])  # no credits reached any of them
    # a real key in the same two spellings is a fine recipient
    peer = live.nodes[2].ident
    for text in (peer.peer_id, peer.account.hex()):
        r = post(f"{api}/v1/transfer", headers=live.auth, json={"to": text, "amount": "0.5"})
        assert r.status_code == 200, r.text
