"""Schemathesis against the node's own OpenAPI schema on a live swarm: positive and negative cases for every
operation, without and with the API token. Every response must be a non-5xx answer that conforms to the schema
(status code, content type, body), and a refused request (4xx) must change nothing."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import snapshot

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 15


def own_snapshot(live):
    """What only an accepted request of this node can change, stable while earlier accepted transactions move
    from the mempool into blocks: the next nonce of its account, the receipts it requested (ledger + mempool),
    the sessions the servers opened."""
    from node.api.wallet import _next_nonce

    def snap():
        c = live.client
        me = c.ident.account
        mine = sum(1 for r in c.ledger.state.receipts.values() if r.receipt.requester == me)
        mine += sum(1 for t in c.ledger.mempool.values() if getattr(t, "requester", None) == me
                    and t.id not in c.ledger.state.receipts)
        return (_next_nonce(c, me), mine, [(nd.server.sessions_served, nd.server.active) for nd in live.nodes[1:]])
    return live.call(snap)


CALLS: dict[str, int] = {}


def _fuzz(live, op, mode, headers, snapshot, examples=()):
    failures = []

    def with_examples(fn):
        for body in examples:
            fn = example(case=op.Case(body=body, media_type="application/json"))(fn)
        return fn

    @settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate], database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    @with_examples
    def run(case):
        before = snapshot(live)
        response = case.call(base_url=live.api, headers=headers, timeout=30)
        key = f"{op.method.upper()} {op.path} {response.status_code}"
        CALLS[key] = CALLS.get(key, 0) + 1
        case.validate_response(response, checks=CHECKS)
        if response.status_code >= 400:
            after = snapshot(live)
            if after != before:
                failures.append((case.as_curl_command(), response.status_code))

    try:
        run()
    except Unsatisfiable:
        if mode != GenerationMode.NEGATIVE:
            raise  # an operation without parameters has no invalid input to generate
    assert not failures, failures


@pytest.fixture(scope="module")
def schema(live):
    return schemathesis.openapi.from_url(f"{live.api}/openapi.json")


def _operations(schema):
    return [r.ok() for r in schema.get_all_operations()]


@pytest.mark.slow  # out of the default suite for its time (~40 s; it took 18 min here); CI runs it
def test_every_operation_without_token(live, schema):
    ops = _operations(schema)
    assert len(ops) >= 20
    live.generate([3, 1, 4], 2)  # receipts, history and votes to read
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(live, op, mode, {}, snapshot)  # with no token nothing may change at all
    print("\n".join(f"{n:4d} {k}" for k, n in sorted(CALLS.items())))
    assert sum(CALLS.values()) >= 10 * len(ops)


@pytest.mark.slow  # about 2 minutes on 2 cores (every state-changing operation fuzzed); CI's slow step runs it
def test_state_changing_operations_with_token(live, schema):
    ops = [op for op in _operations(schema) if op.method.upper() != "GET"]
    assert {op.path for op in ops} >= {"/v1/transfer", "/v1/bond", "/v1/unbond", "/v1/generate"}
    peer = live.nodes[1].ident.peer_id
    accepted = {"/v1/transfer": [{"to": peer, "amount": "0.5"}], "/v1/bond": [{"amount": "1"}],
                "/v1/unbond": [{"amount": "0.5"}], "/v1/generate": [{"prompt_ids": [1, 2], "max_new_tokens": 2}]}
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            ex = accepted.get(op.path, ()) if mode == GenerationMode.POSITIVE else ()
            _fuzz(live, op, mode, live.auth, own_snapshot, ex)
    print("\n".join(f"{n:4d} {k}" for k, n in sorted(CALLS.items()) if not k.startswith("GET")))
    for path in accepted:  # the accepted path ran too, and later refusals still changed nothing
        assert any(k.startswith(f"POST {path} 200") for k in CALLS), path
