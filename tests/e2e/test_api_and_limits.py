"""The HTTP API on a live in-process swarm: reads, token and Host checks, and the prompt-length refusal."""

from __future__ import annotations

import httpx
import pytest
import trio

from node.compute.model import make_tiny

from .swarm import swarm, wait_final

SPANS = [(0, 2), (2, 4), (4, 6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


async def http(method: str, url: str, **kw) -> httpx.Response:
    return await trio.to_thread.run_sync(lambda: httpx.request(method, url, timeout=30, **kw))


def test_api_reads_generate_and_refusals(tmp_path, tiny):
    async def main():
        async with swarm(tmp_path, tiny, SPANS) as nodes:
            client, api = nodes[0], nodes[0].api_url
            auth = {"Authorization": f"Bearer {client.api_token}"}
            me = client.ident.peer_id
            out = {}
            out["status"] = (await http("GET", f"{api}/v1/status")).json()
            out["acct0"] = (await http("GET", f"{api}/v1/accounts/{me}")).json()
            # a prompt longer than the model's maximum length: refused at once, nothing opened or charged
            too_long = {"prompt_ids": [1] * 300, "max_new_tokens": 8}
            out["too_long"] = await http("POST", f"{api}/v1/generate", json=too_long, headers=auth)
            out["served_after_refusal"] = [nd.server.sessions_served + nd.server.active for nd in nodes[1:]]
            # no token / wrong token / foreign Host / foreign Origin: refused
            ok_body = {"prompt_ids": [3, 4, 5], "max_new_tokens": 4}
            out["no_token"] = await http("POST", f"{api}/v1/generate", json=ok_body)
            out["bad_token"] = await http("POST", f"{api}/v1/generate", json=ok_body,
                                          headers={"Authorization": "Bearer nope"})
            out["evil_host"] = await http("GET", f"{api}/v1/status", headers={"Host": "attacker.example"})
            out["evil_origin"] = await http("POST", f"{api}/v1/generate", json=ok_body,
                                            headers={**auth, "Origin": "https://evil.example"})
            out["mempool_after_refusals"] = len(client.ledger.mempool)
            out["receipts_after_refusals"] = len(client.ledger.state.receipts)
            gen = (await http("POST", f"{api}/v1/generate", json=ok_body, headers=auth)).json()
            rids = [bytes.fromhex(r) for r in gen["receipts"]]
            await wait_final(client, rids)
            out["gen"] = gen
            out["receipt"] = (await http("GET", f"{api}/v1/receipts/{gen['receipts'][0]}")).json()
            out["block"] = (await http("GET", f"{api}/v1/blocks/{out['receipt']['height']}")).json()
            out["missing"] = await http("GET", f"{api}/v1/blocks/999999")
            out["bad_id"] = await http("GET", f"{api}/v1/receipts/zz")
            out["bad_spelling"] = await http("POST", f"{api}/v1/transfer", headers=auth,
                                             json={"to": nodes[1].ident.peer_id, "amount": "-1"})
            out["bad_amount"] = await http("POST", f"{api}/v1/transfer", headers=auth,
                                           json={"to": nodes[1].ident.peer_id, "amount": "0"})
            return out

    out = trio.run(main)
    assert out["status"]["validator"] is True and len(out["status"]["swarm"]) == 3
    assert out["acct0"]["balance"]["credits"] == "1000"
    r = out["too_long"]
    assert r.status_code == 413 and r.json()["code"] == "prompt_too_long" and "256" in r.json()["message"]
    assert out["served_after_refusal"] == [0, 0, 0]
    assert out["no_token"].status_code == 401 and out["bad_token"].status_code == 401
    assert out["evil_host"].status_code == 403 and out["evil_origin"].status_code == 403
    assert out["mempool_after_refusals"] == 0 and out["receipts_after_refusals"] == 0
    assert len(out["gen"]["tokens"]) == 4 and len(out["gen"]["receipts"]) == 3
    rec = out["receipt"]
    assert rec["status"] == "valid" and len(rec["votes"]) == 2 and rec["tokens"] == 3 + 4 - 1
    assert any(t["kind"] == "receipt" for t in out["block"]["txs"])
    assert out["missing"].status_code == 404 and out["missing"].json()["code"] == "not_found"
    assert out["bad_id"].status_code == 422 and out["bad_id"].json()["code"] == "bad_request"  # not 64 hex
    assert out["bad_spelling"].status_code == 422 and "0.5" in out["bad_spelling"].json()["message"]  # shows the form
    assert out["bad_amount"].status_code == 400 and out["bad_amount"].json()["code"] == "bad_amount"



def test_light_client_checks_proofs_against_headers_alone(tmp_path, tiny):
    """Proofs from the API verify with nothing but the genesis validator set; tampered ones do not."""
    from node.api.app import proof_from_json
    from node.ledger.core.block import InvalidBlock
    from node.ledger.proofs import header_from_list, verify_account_proof, verify_header, verify_tx_proof

    async def main():
        async with swarm(tmp_path, tiny, SPANS) as nodes:
            client, api = nodes[0], nodes[0].api_url
            gen = await client.generate([3, 1, 4], 3)
            await wait_final(client, [r.id for r in gen.receipts])
            rid = gen.receipts[0].id
            rp = (await http("GET", f"{api}/v1/proofs/receipts/{rid.hex()}")).json()
            ap = (await http("GET", f"{api}/v1/proofs/accounts/{nodes[1].ident.peer_id}")).json()
            return rid, rp, ap, client.genesis.validators, nodes[1].ident.account

    rid, rp, ap, validators, w1 = trio.run(main)
    proof, commit = proof_from_json(rp)
    header = header_from_list(proof["header"])
    verify_header(header, commit, validators)
    tx = verify_tx_proof(proof, header)
    assert tx is not None and tx["t"] == "receipt"
    from node.ledger.core.tx import decode_tx
    assert decode_tx(tx).id == rid
    bad = dict(proof, leaf=proof["leaf"][:-1] + bytes([proof["leaf"][-1] ^ 1]))
    assert verify_tx_proof(bad, header) is None
    with pytest.raises(InvalidBlock):
        verify_header(header, commit, (w1,))  # not signed by that "validator set"
    aproof, acommit = proof_from_json(ap)
    aheader = header_from_list(aproof["header"])
    verify_header(aheader, acommit, validators)
    acct = verify_account_proof(aproof, aheader, w1)
    assert acct is not None and acct["bond"] == 200 * 10**9
    assert verify_account_proof(aproof, aheader, validators[0]) is None  # proof is for another account
