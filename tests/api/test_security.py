"""Security of the local wallet: foreign Host / Origin (DNS rebinding, cross-site requests), missing or wrong
token — all refused with no state change; the key and the token are never served or logged; no CORS."""

from __future__ import annotations

import logging
import stat

import httpx
import pytest

from .conftest import get, snapshot

BODIES = {"/v1/transfer": {"to": None, "amount": "1"}, "/v1/bond": {"amount": "1"}, "/v1/unbond": {"amount": "1"},
          "/v1/generate": {"prompt_ids": [3, 4], "max_new_tokens": 2}}
FOREIGN = [
    ("host", {"Host": "127.0.0.1.evil.example"}), ("host", {"Host": "attacker.example"}),
    ("host", {"Host": "localhost.evil.example:80"}), ("host", {"Host": "127.0.0.1:1@evil.example"}),
    ("host", {"Host": ""}), ("origin", {"Origin": "https://evil.example"}), ("origin", {"Origin": "null"}),
    ("origin", {"Origin": "http://127.0.0.1:1"}), ("origin", {"Origin": "http://localhost"}),
    ("origin", {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}),
]


def server_side(caplog):
    """Log records of the nodes (the test's own HTTP client logs the URLs it requests)."""
    return [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]


def test_foreign_host_origin_and_bad_tokens_change_nothing(live, caplog):
    caplog.set_level(logging.DEBUG)
    api, peer = live.api, live.nodes[1].ident.peer_id
    BODIES["/v1/transfer"]["to"] = peer
    token = live.client.api_token
    before = snapshot(live)
    refused = []
    for path, body in BODIES.items():
        for kind, headers in FOREIGN:
            r = httpx.post(api + path, json=body, headers={**live.auth, **headers}, timeout=30)
            want = "forbidden_host" if kind == "host" else "forbidden_origin"
            assert r.status_code == 403 and r.json()["code"] == want, (path, headers, r.status_code, r.text)
            assert "access-control-allow-origin" not in r.headers
            refused.append(r)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"},
                        {"Authorization": f"Bearer {token}x"}, {"Authorization": f"Bearer {token[:-1]}"},
                        {"Authorization": "Bearer"}, {"Cookie": f"token={token}"}):
            r = httpx.post(api + path, json=body, headers=headers, params={"token": token}, timeout=30)
            assert r.status_code == 401 and r.json()["code"] == "unauthorized", (path, headers, r.text)
            refused.append(r)
    for _kind, headers in FOREIGN:  # reads too: a rebinding page must not read balances
        r = get(f"{api}/v1/accounts/{peer}", headers=headers)
        assert r.status_code == 403, headers
        r = get(f"{api}/", headers={**headers, "Accept": "text/html"})
        assert r.status_code == 403, headers
    pre = httpx.options(f"{api}/v1/transfer", headers={"Origin": "https://evil.example",
                                                        "Access-Control-Request-Method": "POST"}, timeout=30)
    assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
    assert snapshot(live) == before
    # the same request with the token and a same-origin Origin is accepted: the snapshot would have seen it
    ok = httpx.post(f"{api}/v1/transfer", json=BODIES["/v1/transfer"],
                    headers={**live.auth, "Origin": api}, timeout=30)
    assert ok.status_code == 200, ok.text
    # the transfer is in the mempool, or already in a block (mempool empty again, the sender's nonce moved on)
    after = snapshot(live)
    assert after[:2] != before[:2], "an accepted transfer changed neither the mempool nor the accounts"
    assert "access-control-allow-origin" not in ok.headers
    assert not any(token in rec.getMessage() for rec in server_side(caplog))


def test_key_and_token_are_never_served(live, caplog):
    caplog.set_level(logging.DEBUG)
    api, c = live.api, live.client
    data_dir = c.cfg.data_dir
    seed = c.ident.seed
    secrets = [seed.hex(), c.api_token]
    for name in ("node_key", "api_token"):
        mode = stat.S_IMODE((data_dir / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    probes = ["/node_key", "/api_token", "/static/../node_key", "/static/%2e%2e/node_key",
              "/static/..%2fnode_key", "/static/%2e%2e%2f%2e%2e%2fnode_key", "/static/swagger/../../node_key",
              f"/static/{data_dir}/node_key", "/v1/../node_key", "/docs/../api_token", "/n0/node_key",
              "/.tally/node_key", "/v1/accounts/..%2f..%2fnode_key", "/static//etc/passwd"]
    for p in probes:
        r = httpx.get(api + p, timeout=30)
        assert r.status_code in (400, 404, 422), (p, r.status_code)
        assert seed not in r.content and not any(s in r.text for s in secrets), p
    # nothing any read route answers holds the key or the token
    gen = live.generate([7, 8], 2)
    me, rid = c.ident.peer_id, gen.receipts[0].id.hex()
    reads = ["/v1/status", f"/v1/accounts/{me}", f"/v1/accounts/{me}/history", f"/v1/accounts/{me}/receipts",
             "/v1/bonds", "/v1/blocks", "/v1/blocks/1", f"/v1/receipts/{rid}", "/v1/validators", "/v1/swarm",
             "/v1/verification", "/metrics", "/openapi.json", "/docs", "/", "/blocks", f"/accounts/{me}",
             f"/receipts/{rid}", "/validators", "/swarm", "/verification", "/jobs", f"/v1/proofs/accounts/{me}"]
    for p in reads:
        r = httpx.get(api + p, timeout=30, headers={"Accept": "text/html"})
        assert r.status_code == 200, (p, r.status_code)
        assert seed not in r.content and not any(s in r.text for s in secrets), p
        assert "access-control-allow-origin" not in r.headers
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    assert not any(s in rec.getMessage() for rec in server_side(caplog) for s in secrets)


def test_api_binds_to_loopback_by_default():
    from node.cli import build_parser
    from node.config import NodeConfig

    args = build_parser().parse_args(["start"])
    assert args.api_host == "127.0.0.1"
    assert NodeConfig.__dataclass_fields__["api_host"].default == "127.0.0.1"


@pytest.mark.parametrize("host,ok", [("127.0.0.1:8700", True), ("localhost:1", True), ("[::1]:8700", True),
                                     ("127.0.0.1", True), ("127.0.0.1.evil.example", False),
                                     ("attacker.example", False), ("localhost.", False), ("127.1", False),
                                     ("0.0.0.0:8700", False), ("[::1].evil", False)])
def test_loopback_host_rule(host, ok):
    from node.api.security import check_request

    assert (check_request({b"host": host.encode()}) is None) == ok
