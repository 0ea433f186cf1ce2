"""The state root is the sparse Merkle root over every state entry (node.ledger.core.tree): built incrementally it
equals a build from scratch; every account and receipt record proves against its header, before and after a
restart; one changed byte fails; a proof for another key fails; stale tree nodes are pruned."""

from __future__ import annotations

from node.ledger.core import tree as tr
from node.ledger.core.state import VALID, State
from node.ledger.proofs import entry_proof, verify_account_proof, verify_entry_proof, verify_record_proof
from node.ledger.store import LedgerStore

from .helpers import KEYS, W1, make_genesis, make_receipt, vote
from .test_store import grow


def _fresh_root(state) -> bytes:
    fresh = State(state.chain_id, state.params, state.validators, state.height, state.last_hash, state.seq)
    for n, t in state.tables.items():
        for k, v in t.items():
            fresh.tables[n][k] = v
    return fresh.state_root()


def _check_all(store: LedgerStore, state) -> int:
    head, _ = store.get_block(store.head)
    parent = store.parent_state
    assert parent.state_root() == head.header.state_root
    n = 0
    for a in parent.accounts:
        p = entry_proof(parent, head.header, "accounts", a)
        got = verify_account_proof(p, head.header, a)
        assert got is not None and got["balance"] == parent.accounts[a].balance
        assert verify_account_proof(p, head.header, W1.account if a != W1.account else KEYS[0].account) is None
        bad = dict(p, leaf=p["leaf"][:-1] + bytes([p["leaf"][-1] ^ 1]))
        assert verify_account_proof(bad, head.header, a) is None
        n += 1
    for rid in parent.receipts:
        p = entry_proof(parent, head.header, "receipts", rid)
        rec = verify_record_proof(p, head.header, rid)
        assert rec is not None and rec["status"] == parent.receipts[rid].status
        if p["path"]:
            sib = [s for s in p["path"] if s]
            if sib:
                path = list(p["path"])
                i = path.index(sib[0])
                path[i] = bytes([sib[0][0] ^ 1]) + sib[0][1:]
                assert verify_entry_proof(dict(p, path=path), head.header, "receipts", rid) is None
        n += 1
    return n


def test_roots_proofs_and_restart(tmp_path):
    g = make_genesis(committee_size=2)
    store = LedgerStore(tmp_path / "db", g)
    state = grow(store, store.replay(), g, 7)
    # a sampled receipt and its votes, so records change after inclusion
    from node.ledger.core.chain import commit_block, propose

    rec = make_receipt(g, W1, height=state.height)
    for txs in ([rec], []):
        block, new, rej = propose(state, txs, KEYS[0], 2000 + state.height, store.last_commit())
        assert not rej
        store.append(block, commit_block(KEYS[0], block), state, new)
        state = new
    r = state.receipts[rec.id]
    if r.committee:
        votes = [vote(g, rec.id, k, VALID) for k in KEYS if k.account in r.committee]
        block, new, rej = propose(state, votes, KEYS[0], 3000 + state.height, store.last_commit())
        assert not rej
        store.append(block, commit_block(KEYS[0], block), state, new)
        state = new
    assert state.state_root() == _fresh_root(state)  # incremental == from scratch
    assert _check_all(store, state) > 3
    root, height = state.state_root(), state.height
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    again = store.replay()
    assert again.height == height and again.state_root() == root
    assert _check_all(store, again) > 3  # the parent view from the undo record proves too
    state = grow(store, again, g, 3)
    assert state.state_root() == _fresh_root(state)
    store.close()


def test_stale_tree_nodes_are_pruned_after_the_retention(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "RETAIN", 4)
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = grow(store, store.replay(), g, 30)
    nodes = sum(1 for _ in store.db.iterator(prefix=tr.NODES, include_value=False))
    stale = [int.from_bytes(k[len(tr.STALE):len(tr.STALE) + 8], "big")
             for k in store.db.iterator(prefix=tr.STALE, include_value=False)]
    assert stale and min(stale) > 30 - 4 - 1  # nothing older than the retention is kept
    assert nodes < 30 * 8  # far fewer than every version's nodes
    assert state.state_root() == _fresh_root(state)
    _check_all(store, state)
    store.close()
