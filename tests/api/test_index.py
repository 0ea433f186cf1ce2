"""The explorer indexes in the LedgerStore: history and receipts by account, tx and block-hash lookups, written
with each block and rebuilt identically from the blocks when missing or partial."""

from __future__ import annotations

from node.ledger.core.chain import commit_block, propose
from node.ledger.core.state import VALID
from node.ledger.core.tx import Transfer
from node.ledger.store import LedgerStore
from tests.ledger.helpers import CLIENT, KEYS, VALIDATOR, W1, C, make_genesis, make_receipt, vote


def _grow(store, state, g, batches):
    for txs in batches:
        txs = txs(state) if callable(txs) else txs
        block, new, rejected = propose(state, txs, VALIDATOR, 1000 + state.height, store.last_commit())
        assert not rejected, rejected
        store.append(block, commit_block(VALIDATOR, block), state, new)
        state = new
    return state


def _dump(store):
    return [(k, v) for k, v in store.db.iterator(prefix=b"i/")]


def test_history_receipts_and_lookups_survive_a_rebuild(tmp_path):
    g = make_genesis(committee_size=2)
    store = LedgerStore(tmp_path / "db", g)
    state = store.replay()
    t1 = Transfer(g.domain, CLIENT.account, W1.account, 5 * C, 0).signed(CLIENT)
    rec = make_receipt(g, W1, height=0)
    state = _grow(store, state, g, [[t1], [rec], []])
    rr = state.receipts[rec.id]
    assert rr.status == "sampled" and W1.account not in rr.committee  # p = 1 in this genesis
    votes = [vote(g, rec.id, k, VALID) for k in KEYS if k.account in rr.committee]
    state = _grow(store, state, g, [votes, []])
    assert state.receipts[rec.id].status == "valid"

    assert store.tx_location(t1.id) == (1, 0, "transfer") and store.tx_location(rec.id) == (2, 0, "receipt")
    assert store.height_of_hash(state.last_hash) == state.height
    hist, nxt = store.history(W1.account, 10)
    kinds = [e["k"] for _, _, e in hist]
    assert kinds == ["payout", "receipt", "transfer"] and nxt is None  # newest first
    assert hist[2][2]["amount"] == 5 * C and hist[2][2]["role"] == "recipient"
    page1, nxt = store.history(CLIENT.account, 2)
    page2, nxt2 = store.history(CLIENT.account, 2, nxt)
    assert [e["k"] for _, _, e in page1 + page2] == ["paid", "receipt", "transfer"] and nxt2 is None
    member = rr.committee[0]
    assert store.account_receipts(member, 5)[0] == [(2, rec.id, "committee")]
    assert store.account_receipts(W1.account, 5)[0] == [(2, rec.id, "worker")]
    assert store.account_receipts(CLIENT.account, 5)[0] == [(2, rec.id, "requester")]
    meta = store.index_meta()
    assert meta[0] == state.height and meta[3] == 1 + 1 + len(votes)

    before = _dump(store)
    for k, _ in before[: len(before) // 2]:  # lose half of the index: replay rebuilds all of it
        store.db.delete(k)
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    store.replay()
    assert _dump(store) == before
    store.close()
