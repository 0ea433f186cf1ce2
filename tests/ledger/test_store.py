"""The LevelDB store: atomic appends, reopen and replay from genesis, one owner, crashes at random points."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from node.encoding import pack
from node.ledger import statedb
from node.ledger.core.chain import commit_block, propose
from node.ledger.store import LedgerStore, StoreCorrupt, StoreLocked

from .helpers import VALIDATOR, W1, W2, make_genesis, make_receipt

ROOT = Path(__file__).resolve().parents[2]


def grow(store: LedgerStore, state, g, n: int):
    for i in range(n):
        txs = [make_receipt(g, W1 if i % 2 else W2, height=state.height)] if i % 3 == 0 else []
        block, new, rejected = propose(state, txs, VALIDATOR, 1000 + i, store.last_commit())
        assert not rejected
        store.append(block, commit_block(VALIDATOR, block), state, new)
        state = new
    return state


def test_reopen_replays_and_matches(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = grow(store, store.replay(), g, 12)
    last, root, rids = state.last_hash, state.state_root(), list(state.receipts)
    rid = rids[0]
    status = state.receipts[rid].status
    store.close()  # the state reads the store: nothing of it can be read after this
    store = LedgerStore(tmp_path / "db", g)
    again = store.replay()
    assert again.height == 12 and again.last_hash == last
    assert again.state_root() == root and list(again.receipts) == rids
    assert store.get_receipt(rid)["status"] == status == again.receipts[rid].status
    store.close()


def test_verify_finds_a_damaged_state_and_repairs_it_from_the_blocks(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = grow(store, store.replay(), g, 6)
    want = state.account(W1.account).to_list()
    assert store.verify() == []
    store.db.put(statedb.PREFIX["accounts"] + W1.account, pack([1, 2, 3, 4, 5, 6]))  # damage a state key
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    assert store.replay().account(W1.account).to_list() == [1, 2, 3, 4, 5, 6]  # opening trusts its own disk
    diffs = store.verify(repair=True)
    assert len(diffs) == 1 and diffs[0].startswith("accounts " + W1.account.hex()[:16])
    assert store.verify() == [] and store.get_account(W1.account) == want
    store.close()


def test_open_reads_the_stored_state_without_replaying(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = grow(store, store.replay(), g, 9)
    root, receipts = state.state_root(), dict(state.receipts.items())
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    replayed = []
    again = store.replay(progress=replayed.append)
    assert replayed == [] and again.height == 9 and again.last_hash == state.last_hash
    assert again.state_root() == root and dict(again.receipts.items()) == receipts
    # the parent view is the state the head header commits to
    head, _ = store.get_block(9)
    assert store.parent_state.height == 8 and store.parent_state.state_root() == head.header.state_root
    store.close()


def test_a_store_without_stored_state_is_replayed_once(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    state = grow(store, store.replay(), g, 5)
    root = state.state_root()
    for k in list(store.db.iterator(prefix=b"S/", include_value=False)):  # as an older version left it
        store.db.delete(k)
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    replayed = []
    assert store.replay(progress=replayed.append).state_root() == root and replayed == [1, 2, 3, 4, 5]
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    replayed = []
    assert store.replay(progress=replayed.append).state_root() == root and replayed == []
    store.close()


def test_tampered_block_fails_verification(tmp_path):
    g = make_genesis()
    store = LedgerStore(tmp_path / "db", g)
    grow(store, store.replay(), g, 3)
    key = b"B" + (2).to_bytes(8, "big")
    raw = bytearray(store.db.get(key))
    raw[-5] ^= 0xFF  # flip a byte of the commit signature
    store.db.put(key, bytes(raw))
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    with pytest.raises(StoreCorrupt):
        store.verify()
    store.close()


def test_other_genesis_refused(tmp_path):
    LedgerStore(tmp_path / "db", make_genesis()).close()
    with pytest.raises(StoreCorrupt, match="another genesis"):
        LedgerStore(tmp_path / "db", make_genesis(committee_size=3))


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.ledger.helpers import make_genesis
    from tests.ledger.test_store import grow
    from node.ledger.store import LedgerStore
    g = make_genesis()
    store = LedgerStore(__import__("pathlib").Path({db!r}), g)
    state = store.replay()
    print("open", flush=True)
    if {hold}:
        time.sleep(60)
    while True:
        state = grow(store, state, g, 1)
        time.sleep(0.005)
""")


def test_second_process_is_refused_clearly(tmp_path):
    db = tmp_path / "db"
    p = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), db=str(db), hold=True)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "open"
        with pytest.raises(StoreLocked, match="in use by another process"):
            LedgerStore(db, make_genesis())
    finally:
        p.kill()
        p.wait()


@pytest.mark.slow  # 70 s on 2 cores (many kill -9 restarts); CI's slow step runs it
def test_kill_9_at_random_points_leaves_a_chain_that_verifies(tmp_path):
    db = tmp_path / "db"
    rng = random.Random(7)
    heads = []
    for _ in range(50):
        p = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), db=str(db), hold=False)],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "open"
        time.sleep(rng.uniform(0.0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        store = LedgerStore(db, make_genesis())
        state = store.replay()  # the stored state: raises StoreCorrupt if it is not the head's
        assert state.height == store.head and state.supply() == make_genesis().supply
        assert store.verify() == []  # every block re-checked from genesis gives exactly the stored state
        heads.append(state.height)
        store.close()
    assert heads == sorted(heads) and heads[-1] > 0
    assert len(set(heads)) > 10  # the kills really landed at many different points of the chain


def test_no_block_may_be_older_than_the_genesis(tmp_path):
    """Before the first block the parent time is the genesis time, so a proposal stamped earlier is refused."""
    from dataclasses import replace

    from node.ledger.core.chain import check_time

    g = replace(make_genesis(), genesis_time_ms=5_000)
    store = LedgerStore(tmp_path / "db", g)
    assert store.head_time_ms() == 5_000
    with pytest.raises(ValueError, match="backwards"):
        check_time(4_999, now_ms=5_000, parent_ms=store.head_time_ms())
    check_time(5_001, now_ms=5_000, parent_ms=store.head_time_ms())
    store.close()
