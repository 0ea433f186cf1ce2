"""Issue 24 finding 1, played as the attacker: a requester posts an item file that was never run through
``parse_items`` (one 60 KB line of ``[``, which made ``json.loads`` raise ``RecursionError`` in every worker, so no
drawn worker ever committed and each paid the absent penalty). Now every drawn worker returns the deterministic
``bad_item_file`` result, they agree, nobody is penalised, each worker parses the file once (off the event loop),
and credits are conserved in the reopened LevelDB."""

from __future__ import annotations

import json
import os

import pytest
import trio

import node.batch.worker as batch_worker
from node.batch.client import content_store, items_of
from node.batch.items import MAX_DEPTH, ItemsError, nesting_too_deep, parse_items, parse_posted, result_hash
from node.compute.model import make_tiny
from node.encoding import pack
from node.ledger.core.batchstate import BatchStatus, Fate, ItemStatus
from node.ledger.core.batchtx import BatchPost, items_root
from node.ledger.store import LedgerStore
from node.runtime import Node

from ..e2e.swarm import C, node_config, tiny_genesis
from .offers import wait_offers

NESTED = b"[" * 60_000  # the finding's line: 60 KB of nested arrays


def test_nesting_is_refused_before_json_loads():
    assert nesting_too_deep(NESTED)
    assert nesting_too_deep(b"{" * 60_000)
    assert nesting_too_deep(b'{"a":' * 20_000)
    with pytest.raises(ItemsError, match="line 2: arrays/objects nested deeper than"):
        parse_items(b'{"prompt": "a"}\n' + NESTED + b"\n", "generate")
    ok = b"[" * MAX_DEPTH + b"1" + b"]" * MAX_DEPTH
    deep = b"[" * (MAX_DEPTH + 1) + b"1" + b"]" * (MAX_DEPTH + 1)
    assert not nesting_too_deep(ok) and nesting_too_deep(deep)
    assert not nesting_too_deep(b"[]" * 30_000)  # wide is fine: only depth is bounded
    assert not nesting_too_deep(json.dumps({"prompt": "[" * 60_000}).encode())  # brackets inside strings
    assert not nesting_too_deep(json.dumps({"prompt": '\\"[' * 10_000}).encode())  # escaped quotes too
    assert nesting_too_deep(b'"\\\\"' + b"[" * 100)  # an escaped backslash closes nothing: the [ are outside
    assert nesting_too_deep(b'"abc' + b"]" * 10 + b'"' + b"[" * 100)
    assert not nesting_too_deep(b'"' + b"[" * 1000)  # unterminated string: json.loads stops at its quote
    # an item with extra, shallow structure still parses; the depth limit changes nothing for real items
    f = parse_items(b'{"prompt_ids": [1, 2], "meta": {"tags": [[1], [2]]}}\n', "generate")
    assert f.items[0]["prompt_ids"] == [1, 2]


def test_parse_posted_never_raises():
    good = b'{"text": "a"}\n{"text": "b"}\n'
    assert parse_posted(good, "score", 2) == (parse_items(good, "score"), "")
    for data, n in [(NESTED, 1), (b"\xff\xfe", 1), (b"", 1), (good, 3), (b'{"text": 1}', 1),
                    (b"[]" * 30_000, 1), (b'{"text": "' + b"x" * (70 << 10) + b'"}', 1)]:
        f, why = parse_posted(data, "score", n)
        assert f is None and why, (data[:20], why)
    assert "the post says 3" in parse_posted(good, "score", 3)[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_nested_file_posted_raw_gets_bad_item_file_and_no_penalty(tmp_path, tiny, monkeypatch):
    g = tiny_genesis(3, batch_slash=10 * C)
    lines = [b'{"prompt": "fine"}', NESTED, b'{"prompt": "also fine"}']  # one bad line spoils the file
    data = b"".join(x + b"\n" for x in lines)
    parses: list[int] = []

    def counted(data, kind, n_items):  # the real parser, counted: each worker parses once, not once per item
        parses.append(len(data))
        return parse_posted(data, kind, n_items)
    monkeypatch.setattr(batch_worker, "parse_posted", counted)

    async def main():
        async with trio.open_nursery() as n:
            nodes = []
            for i in range(4):
                cfg = node_config(tmp_path, i, g, tiny)
                if i:
                    cfg.bootstrap = nodes[0].host.addrs
                    cfg.accept_batches = True
                nd = Node(cfg)
                n.start_soon(nd.run)
                await nd.started.wait()
                nodes.append(nd)
            req = nodes[0]
            me = req.ident.account
            await wait_offers(req, [nd.ident.account for nd in nodes[1:]])
            root = items_root(lines)
            content_store(req).put(root, data)  # served to the workers as-is: the attacker skips parse_items
            post = BatchPost(g.domain, me, os.urandom(16), root, len(lines), "generate", 3, 3, 2, 10**6, 1,
                             20, 20, req.ledger.next_nonce(me)).signed(req.ident)
            await req.ledger.submit(post)
            with trio.fail_after(120):
                while True:
                    b = req.ledger.state.tables["batches"].get(post.batch_id)
                    if b is not None and b.status == BatchStatus.SETTLED:
                        break
                    await req.ledger.new_block.wait()
            n.cancel_scope.cancel()
        return post, [nd.ident.account for nd in nodes[1:]], [nd.batches.done for nd in nodes[1:]]

    post, workers, done = trio.run(main)
    store = LedgerStore(tmp_path / "n0" / "ledger", g)  # the requester's LevelDB, reopened
    try:
        st = store.replay()
        b = st.tables["batches"][post.batch_id]
        bad = result_hash(pack({"error": "bad_item_file"}))
        assert b.accepted == len(lines)
        for it in items_of(st, b):
            assert it.status == ItemStatus.ACCEPTED and it.result == bad
            fates = [f for _a, _w, f, _x in it.history]
            assert fates == [Fate.AGREED] * 3, it.history  # every drawn worker agreed: nobody absent
            assert set(it.agreed) == set(workers)
        for w in workers:
            acc = st.account(w)
            assert acc.slashed == 0 and acc.bond == 200 * C  # no absent penalty on any honest worker
            assert acc.balance > 100 * C  # paid for the error results
        assert st.supply() == g.supply  # balances + bonds + escrows, on disk
    finally:
        store.close()
    assert done == [len(lines)] * 3  # each worker answered every item
    assert len(parses) == 3  # one parse per worker, not one per item or per retry
