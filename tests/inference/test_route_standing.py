"""Issue 39, check 4: a route planned in a swarm where one server has an invalid verdict on the ledger avoids it
while others serve its span, and uses it when it is the only one.

The verdicts are real: receipts go through the ledger's own state transition (inclusion, committee draw, votes,
finalization), and the route client plans with its own ``_plan`` over that state's accounts."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from node.compute.shards import SpanInfo
from node.compute.standing import PROVEN_RUN, PUNISHED_FACTOR, standing_factor
from node.inference.client import RouteClient
from node.ledger.core.chain import propose
from node.ledger.core.state import INVALID_S, VALID_S, genesis_state
from node.ledger.core.tx import INVALID, VALID

from ..ledger.helpers import KEYS, VALIDATOR, W1, W2, W3, make_genesis, make_receipt, vote

MEMBERS = {k.account: k for k in KEYS}
MODEL = b"m" * 32


def run_blocks(state, *tx_batches):
    for txs in tx_batches:
        _block, state, rejected = propose(state, list(txs), VALIDATOR, 0, ())
        assert not rejected, rejected
    return state


def judge(g, state, worker, verdict, n=1):
    """``n`` receipts of ``worker``, each sampled (p = 1) and voted ``verdict`` by its whole committee."""
    receipts = [make_receipt(g, worker, height=state.height) for _ in range(n)]
    state = run_blocks(state, receipts, [])  # block 1 includes, block 2 draws the committees
    state = run_blocks(state, [vote(g, r.id, MEMBERS[m], verdict) for r in receipts
                               for m in state.receipts[r.id].committee])
    want = VALID_S if verdict == VALID else INVALID_S
    assert [state.receipts[r.id].status for r in receipts] == [want] * n
    return state


def client_over(state, spans):
    """A route client whose ledger is ``state`` and whose swarm table announces ``spans`` (a 4-block model)."""
    swarm = SimpleNamespace(infos=lambda model_id: list(spans), rtt={})
    host = SimpleNamespace(peer_id=VALIDATOR.peer_id)
    manifest = SimpleNamespace(model_id=MODEL, num_blocks=4)
    return RouteClient(VALIDATOR, host, None, manifest, SimpleNamespace(state=state), None, None, swarm)


def route(state, spans):
    return [(s.peer, s.start, s.end) for s in client_over(state, spans)._plan(0)]


def test_a_server_with_an_invalid_verdict_is_avoided_while_others_serve_its_span_and_used_when_alone():
    g = make_genesis()
    s = genesis_state(g)
    s = judge(g, s, W1, INVALID)  # W1: an invalid verdict, applied by the ledger's rules
    s = judge(g, s, W2, VALID, n=PROVEN_RUN)  # W2: a proven record
    bad, good, new = s.account(W1.account), s.account(W2.account), s.account(W3.account)
    assert bad.valid_run == 0 and bad.slashed == g.params.slash_amount
    assert good.valid_run == PROVEN_RUN and good.slashed == 0
    assert new.valid_run == 0 and new.slashed == 0
    assert standing_factor(bad) == PUNISHED_FACTOR > standing_factor(new) > standing_factor(good) == 1.0

    def span(who, start=0, end=4, latency=0.01):
        return SpanInfo(who.peer_id, start, end, latency=latency)

    # same span: the punished server is avoided at equal speed, and even when it is a little faster (which
    # alone would win it the route)
    for lat in (0.01, 0.008):
        assert route(s, [span(W1, latency=lat), span(W2)]) == [(W2.peer_id, 0, 4)]
        assert route(s, [span(W2), span(W1, latency=lat)]) == [(W2.peer_id, 0, 4)]
        assert route(s, [span(W1, latency=lat), span(W3)]) == [(W3.peer_id, 0, 4)]  # new is preferred to punished
    # the only server of the span: it is used
    assert route(s, [span(W1)]) == [(W1.peer_id, 0, 4)]
    assert route(s, [span(W2, 0, 2), span(W1, 2, 4)]) == [(W2.peer_id, 0, 2), (W1.peer_id, 2, 4)]

    # it earns its work back one valid verdict at a time: at PROVEN_RUN it stands as the proven server does
    factors = [standing_factor(s.account(W1.account))]
    for _ in range(PROVEN_RUN):
        s = judge(g, s, W1, VALID)
        factors.append(standing_factor(s.account(W1.account)))
    assert all(a > b for a, b in itertools.pairwise(factors)) and factors[-1] == 1.0
    want = min(W1.peer_id, W2.peer_id)  # equal standing, equal speed: the smaller peer id, as before
    assert route(s, [span(W1), span(W2)]) == [(want, 0, 4)]
