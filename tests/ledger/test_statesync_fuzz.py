"""Property-based fuzzing (hypothesis, bounded) of what state sync does with a peer's offer before any chunk:
for any msgpack value in any field of an offer, :func:`node.ledger.statesync.parse_offer`,
:func:`node.ledger.snapshot.check_manifest` and the commit check refuse with SnapshotError or InvalidBlock, or
accept, and never raise anything else (issue 23, finding 3 and check 2); the server's "light" request handler
answers any request with a map."""

from __future__ import annotations

import trio
from hypothesis import HealthCheck, given, settings, strategies as st

from node.encoding import pack, unpack
from node.ledger import snapshot as snap, statesync as ss
from node.ledger.core.block import InvalidBlock
from node.ledger.core.chain import commit_block, propose
from node.ledger.store import LedgerStore

from .helpers import VALIDATOR, make_genesis
from .test_store import grow

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
                    st.binary(max_size=48), st.text(max_size=12), st.sampled_from([b"", 0, -1, 5, 10**12]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=9),
                                                        st.dictionaries(st.one_of(st.text(max_size=4),
                                                                                  st.binary(max_size=4)),
                                                                        inner, max_size=4)),
                      max_leaves=24)


def _source(tmp):
    g = make_genesis()
    src = LedgerStore(tmp / "src", g)
    state = grow(src, src.replay(), g, 4)
    m, _ = snap.make(src.db, g.domain, 700)
    block, new, _ = propose(state, [], VALIDATOR, 9000, src.last_commit())
    src.append(block, commit_block(VALIDATOR, block), state, new)
    raw = src.get_block_raw(5)
    offer = {"status": "ok", "manifest": m.to_wire(), "block": {"b": {"h": raw["b"]["h"]}, "c": raw["c"]}}
    return g, src, unpack(pack(offer))  # as it arrives: decoded from the wire


def _check(g, reply) -> None:
    try:
        m, header, commit = ss.parse_offer(reply)
        snap.check_manifest(m, header, g.domain)
        snap.verify_header(header, commit, g.validators)
    except (snap.SnapshotError, InvalidBlock):
        pass


def _paths(x, path=()):
    """Every path into a nested offer (keys of maps, indexes of lists)."""
    yield path
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x[:12]):
            yield from _paths(v, (*path, i))


def _replace(x, path, new):
    if not path:
        return new
    if isinstance(x, dict):
        return {**x, path[0]: _replace(x[path[0]], path[1:], new)}
    out = list(x)
    out[path[0]] = _replace(out[path[0]], path[1:], new)
    return out


def test_any_field_of_an_offer_replaced_by_anything(tmp_path):
    g, src, offer = _source(tmp_path)
    paths = list(_paths(offer))
    _check(g, offer)  # the honest offer passes

    @FUZZ
    @given(st.sampled_from(paths), values)
    def one(path, new):
        _check(g, _replace(offer, path, new))

    try:
        one()
    finally:
        src.close()


def test_any_offer_reply(tmp_path):
    g = make_genesis()

    @FUZZ
    @given(st.dictionaries(st.sampled_from(["status", "manifest", "block", "b", "c", "h"]), values, max_size=4))
    def one(reply):
        _check(g, reply)

    one()


def test_any_light_request_gets_a_map(tmp_path):
    _, src, _ = _source(tmp_path)

    @FUZZ
    @given(st.dictionaries(st.sampled_from(["op", "from", "count", "x"]), values, max_size=4))
    def one(msg):
        reply = trio.run(ss._light_handler_reply, src, {"op": "light", **msg})
        assert isinstance(reply, dict) and reply["status"] in ("ok", "error")

    try:
        one()
    finally:
        src.close()
