"""Issue 37, check 4: tabs and epoch batches are ledger state like any other -- a light client checks a tab's and a
batch's entry against a header with an inclusion proof (and refuses a forged one), and a node that starts from a
state snapshot taken mid-epoch (an open tab, a batch waiting for its reveals) reaches the same state and follows the
chain through the batch's payment."""

from __future__ import annotations

from node.ledger import snapshot as snap
from node.ledger.core.chain import check_and_apply, commit_block, propose
from node.ledger.core.records import CODECS
from node.ledger.core.tx import VALID
from node.ledger.proofs import entry_proof, verify_entry_proof
from node.ledger.store import LedgerStore

from .helpers import VALIDATOR
from .tabs_helpers import KEYS, C, Chain, tab_genesis

REQ, W1 = KEYS[0], KEYS[1]


def _mid_epoch(tmp_path):
    g = tab_genesis()
    a = LedgerStore(tmp_path / "a", g)
    c = Chain(g, a)
    tab = c.open_tab(REQ, W1, 10 * C)
    c.block()
    rs = c.receipts(W1, REQ, tab, [C, C, C])
    b = c.batch(W1, rs)
    c.block(2)  # included, drawn: waiting for reveals
    return g, a, c, tab, rs, b


def test_a_tab_and_a_batch_are_proved_against_a_header(tmp_path):
    _g, a, c, tab, _rs, b = _mid_epoch(tmp_path)
    c.block()  # the head block commits to the state the entries are in
    head, _ = a.get_block(a.head)
    parent = a.parent_state
    for table, key in (("tabs", tab), ("settlements", b.key)):
        p = entry_proof(parent, head.header, table, key)
        leaf = verify_entry_proof(p, head.header, table, key)
        assert leaf is not None and CODECS[table].loads(leaf) == parent.tables[table][key]
        forged = dict(p, leaf=p["leaf"][:-1] + bytes([p["leaf"][-1] ^ 1]))
        assert verify_entry_proof(forged, head.header, table, key) is None
    assert CODECS["tabs"].loads(verify_entry_proof(entry_proof(parent, head.header, "tabs", tab), head.header,
                                                   "tabs", tab)).redeemed == 3 * C  # the batch redeemed it
    a.close()


def test_a_node_synced_mid_epoch_follows_the_batch_to_its_payment(tmp_path):
    g, a, c, tab, rs, b = _mid_epoch(tmp_path)
    manifest, chunks = snap.make(a.db, g.domain, chunk_bytes=600)
    blk, new, _ = propose(c.state, [], VALIDATOR, 9000, a.last_commit())  # commits to the snapshot's state
    commit = commit_block(VALIDATOR, blk)
    a.append(blk, commit, c.state, new)
    c.state = new
    c.blocks.append((blk, commit))
    other = LedgerStore(tmp_path / "b", g)
    restored = snap.restore(other, manifest, [chunks[x] for x in manifest.chunks], blk.header, commit,
                            g.validators)
    state = check_and_apply(restored, blk, commit)
    other.append(blk, commit, restored, state)
    assert state.state_root() == c.state.state_root() and b.key in state.tables["settlements"]
    for i in c.settlement(b).draw:
        c.reveal(W1, b, rs, i)
    for _ in range(8):  # reveals, committees, votes, the settle window: the synced node follows every block
        c.vote_all(VALID)
        c.block()
        blk, commit = c.blocks[-1]
        nxt = check_and_apply(state, blk, commit)
        other.append(blk, commit, state, nxt)
        state = nxt
        assert state.state_root() == c.state.state_root()
    assert b.key not in state.tables["settlements"] and state.tables["tabs"][tab].redeemed == 3 * C
    other.close()
    a.close()
