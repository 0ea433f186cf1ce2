"""History that ends (node.ledger.core.history): final receipts leave the hot state after ``retention_blocks`` into
an RFC 9162 log whose head is a state entry; a light client verifies a receipt that left against a header; one
changed byte fails; at most MAX_RETIRE_PER_BLOCK leave per block, oldest first; a receipt that left cannot be
replayed; retention 0 keeps every genesis hash."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from node.encoding import H, inclusion_proof, merkle_root
from node.ledger.core import history as hist
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.genesis import Params, parse_genesis
from node.ledger.core.jobstate import jobs_of
from node.ledger.core.sampling import is_sampled
from node.ledger.core.state import VALID, State, apply_block_body, genesis_state
from node.ledger.proofs import history_proof, verify_header, verify_history_proof
from node.ledger.store import LedgerStore

from .helpers import KEYS, W1, W2, make_genesis, make_receipt, vote

LOW_P = {"sample_base_ppm": 10_000, "sample_floor_ppm": 10_000}  # 1 %: most receipts settle unsampled


class Nodes(dict):
    def history_node(self, level: int, index: int) -> bytes | None:
        return self.get((level, index))


def test_log_matches_rfc9162_reference():
    head, nodes, leaves = hist.LogHead(), Nodes(), []
    assert head.root == merkle_root([])
    for n in range(1, 41):
        leaves.append(b"leaf %d" % n)
        head, a = hist.append(head, b"r", leaves[-1])
        nodes.update({(lv, i): h for lv, i, h in a.nodes})
        assert a.index == n - 1 and head.size == n
        assert head.root == merkle_root(leaves)
        assert len(head.frontier) == bin(n).count("1")
        for m in range(n):
            assert hist.inclusion_path(nodes, m, n) == inclusion_proof(leaves, m)
    with pytest.raises(IndexError):
        hist.inclusion_path(nodes, 40, 40)
    with pytest.raises(hist.HistoryMissing):
        hist.inclusion_path(Nodes(), 0, 5)
    with pytest.raises(ValueError):
        hist.LogHead.from_plain([3, head.root, [head.root]])  # 3 leaves need two frontier hashes


def test_retention_zero_keeps_the_genesis_hash():
    g0 = make_genesis()
    assert "retention_blocks" not in g0.to_doc()["params"]
    assert parse_genesis(g0.to_doc()).hash == g0.hash
    g1 = make_genesis(retention_blocks=5)
    assert g1.to_doc()["params"]["retention_blocks"] == 5
    assert g1.hash != g0.hash and parse_genesis(g1.to_doc()).hash == g1.hash
    assert Params().retention_blocks == 0


def _step(store, state, txs, t):
    """One block on ``store``, voting valid for every receipt awaiting this node's test keys."""
    votes = [vote(store.genesis, rid, k, VALID, state.receipts[rid].round) for rid in state.open_receipts
             for k in KEYS if state.receipts[rid].status == "sampled" and k.account in state.receipts[rid].committee
             and k.account not in state.receipts[rid].round_votes()]
    block, new, rejected = propose(state, list(txs) + votes, KEYS[0], t, store.last_commit())
    assert not rejected, rejected
    store.append(block, commit_block(KEYS[0], block), state, new)
    return new


def _check_proofs(store, rids) -> int:
    head_block, commit = store.get_block(store.head)
    verify_header(head_block.header, commit, store.genesis.validators)
    parent, n = store.parent_state, 0
    for rid in rids:
        got = store.history_entry(rid)
        assert got is not None
        index, _left, data = got
        if index >= hist.read_head(parent).size:
            continue  # left in the head block: the head header commits to the state before it
        p = history_proof(parent, head_block.header, store, rid, index, data)
        s = verify_history_proof(p, head_block.header, rid)
        assert s is not None and s["id"] == rid and s["index"] == index
        assert s["status"] in ("settled", "valid") and s["final_height"] > 0 and s["payouts"]
        assert verify_history_proof(p, head_block.header, H(b"another receipt")) is None
        for field in ("leaf",):
            raw = p[field]
            for i in (0, len(raw) // 2, len(raw) - 1):  # one changed byte anywhere fails
                assert verify_history_proof(dict(p, **{field: raw[:i] + bytes([raw[i] ^ 1]) + raw[i + 1:]}),
                                            head_block.header, rid) is None
        if p["path"]:
            path = list(p["path"])
            path[-1] = bytes([path[-1][0] ^ 1]) + path[-1][1:]
            assert verify_history_proof(dict(p, path=path), head_block.header, rid) is None
        bad_head = dict(p["head"], leaf=p["head"]["leaf"][:-1] + bytes([p["head"]["leaf"][-1] ^ 1]))
        assert verify_history_proof(dict(p, head=bad_head), head_block.header, rid) is None
        assert verify_history_proof(dict(p, index=index + 1), head_block.header, rid) is None
        assert verify_history_proof({"leaf": 1}, head_block.header, rid) is None
        n += 1
    return n


def test_receipts_leave_into_the_log_and_prove(tmp_path):
    g = make_genesis(retention_blocks=3, receipt_max_age=2, **LOW_P)
    store = LedgerStore(tmp_path / "db", g)
    state = store.replay()
    rids = []
    for i in range(3):
        txs = [make_receipt(g, W1 if j % 2 else W2, height=state.height) for j in range(3)]
        rids += [r.id for r in txs]
        state = _step(store, state, txs, 1000 + i)
    for i in range(30):
        state = _step(store, state, [], 2000 + i)
        if all(r not in state.receipts for r in rids):
            break
    assert all(r not in state.receipts for r in rids), "every final receipt left the hot state"
    assert len(state.sessions) == len(state.receipts)  # their sessions left with them
    head = hist.read_head(state)
    assert head.size == len(rids)
    in_order = sorted(rids, key=lambda r: store.history_entry(r)[0])
    assert head.root == merkle_root([store.history_entry(r)[2] for r in in_order])  # the RFC 9162 reference
    state = _step(store, state, [], 3000)  # the header of the next block commits to the log with all of them
    assert _check_proofs(store, rids) == len(rids)
    # the same receipt cannot come back once it left (too old for inclusion)
    old = next(tx for h in range(1, 4) for tx in store.get_block(h)[0].txs if tx.id == rids[0])
    _, _, rejected = propose(state, [old], KEYS[0], 4000, store.last_commit())
    assert rejected and "too old" in rejected[0][1]
    # a restart reopens the same state; replaying from genesis gives the same state and log
    root, head = state.state_root(), hist.read_head(state)
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    again = store.replay()
    assert again.state_root() == root and hist.read_head(again) == head
    assert store.verify() == []
    assert _check_proofs(store, rids) == len(rids)
    store.close()


def test_leaving_is_bounded_per_block_and_oldest_first(monkeypatch):
    monkeypatch.setattr(hist, "MAX_RETIRE_PER_BLOCK", 2)
    g = make_genesis(retention_blocks=2, receipt_max_age=1, **LOW_P)
    s = genesis_state(g)
    # fixed receipt ids: at 1 % sampling a random id is sampled (and then waits for a committee that never
    # votes here) about once in 20 runs; these five are not sampled, so the test is deterministic
    txs = [make_receipt(g, W1, height=0, rid=H(b"leaving %d" % i)[:16]) for i in range(5)]
    s = apply_block_body(s, 1, H(b"block 1"), txs)
    assert not any(is_sampled(H(b"block 2"), r.id, LOW_P["sample_base_ppm"]) for r in txs)
    left_per_block, order = [], []
    for h in range(2, 20):
        before = len(s.receipts)
        s = apply_block_body(s, h, H(b"block %d" % h), [])
        left_per_block.append(before - len(s.receipts))
        order += [a.receipt_id for a in s.archived]
        if not s.receipts:
            break
    assert not s.receipts and max(left_per_block) == 2 and sum(left_per_block) == 5
    finals = {}
    for rid in order:
        finals.setdefault(rid, len(finals))
    assert order == sorted(order, key=finals.__getitem__)  # log order: finalisation order, each once
    assert len(set(order)) == 5 and hist.read_head(s).size == 5
    # the same chain built from scratch has the same root (the log head and the queue are ordinary entries)
    fresh = State(s.chain_id, s.params, s.validators, s.height, s.last_hash, s.seq)
    for n, t in s.tables.items():
        for k, v in t.items():
            fresh.tables[n][k] = v
    assert fresh.state_root() == s.state_root()


def test_api_falls_back_to_the_history_and_serves_its_proofs(tmp_path):
    """The real API app over a real store and ledger service (no network: the routes read the store)."""
    from starlette.testclient import TestClient

    from node.api.app import create_app
    from node.api.views import history_proof_from_json
    from node.ledger.proofs import header_from_list
    from node.ledger.service import LedgerService

    g = make_genesis(retention_blocks=2, receipt_max_age=1, **LOW_P)
    store = LedgerStore(tmp_path / "db", g)
    state = store.replay()
    first = [make_receipt(g, W1, height=0) for _ in range(2)]
    state = _step(store, state, first, 1000)
    for i in range(12):
        state = _step(store, state, [], 2000 + i)
    late = make_receipt(g, W2, height=state.height)
    state = _step(store, state, [late], 3000)
    assert all(r.id not in state.receipts for r in first) and late.id in state.receipts
    svc = LedgerService(store, g, KEYS[0], None)
    node = SimpleNamespace(store=store, ledger=svc, genesis=g, ident=KEYS[0], api_token="t")
    c = TestClient(create_app(node), base_url="http://127.0.0.1")
    js = {"accept": "application/json"}
    for r in first:
        got = c.get(f"/v1/receipts/{r.id.hex()}", headers=js)
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["archived_height"] > body["final_height"] > 0 and body["status"] in ("settled", "valid")
        assert body["price"]["base_units"] == str(r.price) and body["worker"] and body["payouts"]
        got = c.get(f"/v1/proofs/history/{r.id.hex()}", headers=js)
        assert got.status_code == 200, got.text
        proof, commit = history_proof_from_json(got.json())
        header = header_from_list(proof["header"])
        verify_header(header, commit, g.validators)
        s = verify_history_proof(proof, header, r.id)
        assert s is not None and s["price"] == r.price and s["worker"] == W1.account
        bad = dict(proof, leaf=proof["leaf"][:-1] + bytes([proof["leaf"][-1] ^ 1]))
        assert verify_history_proof(bad, header, r.id) is None
    listed = {x["id"]: x for x in c.get("/v1/receipts?limit=50", headers=js).json()["receipts"]}
    assert set(listed) == {r.id.hex() for r in [*first, late]}  # the listing shows archived receipts too
    assert all(listed[r.id.hex()]["archived_height"] for r in first)
    got = c.get(f"/v1/proofs/history/{late.id.hex()}", headers=js)
    assert got.status_code == 404 and "/v1/proofs/records/" in got.json()["message"]
    hot = c.get(f"/v1/receipts/{late.id.hex()}", headers=js)
    assert hot.status_code == 200 and hot.json().get("archived_height") is None
    assert c.get(f"/v1/proofs/history/{'ab' * 32}", headers=js).status_code == 404
    store.close()


def test_a_state_synced_node_proves_receipts_that_leave_after_its_snapshot(tmp_path):
    from node.ledger import snapshot as snap
    from node.ledger.core.chain import check_and_apply

    g = make_genesis(retention_blocks=2, receipt_max_age=1, **LOW_P)
    a = LedgerStore(tmp_path / "a", g)
    state = a.replay()
    early = []
    for i in range(3):  # 3 receipts leave before the snapshot: the log has 3 leaves (frontier: 2 + 1)
        txs = [make_receipt(g, W1, height=state.height)]
        early += [t.id for t in txs]
        state = _step(a, state, txs, 1000 + i)
    for i in range(12):
        state = _step(a, state, [], 1100 + i)
    assert hist.read_head(state).size == 3
    manifest, chunks = snap.make(a.db, g.domain, 700)
    state = _step(a, state, [], 1200)  # certifies the snapshot's state
    block, commit = a.get_block(state.height)
    b = LedgerStore(tmp_path / "b", g)
    b_state = snap.restore(b, manifest, [chunks[c] for c in manifest.chunks], block.header, commit, g.validators)
    nb = check_and_apply(b_state, block, commit)
    b.append(block, commit, b_state, nb)
    b_state, late = nb, []
    for i in range(14):  # more receipts leave on both nodes, the same way
        txs = [make_receipt(g, W2, height=state.height)] if i < 4 else []
        late += [t.id for t in txs]
        state = _step(a, state, txs, 2000 + i)
        blk, c = a.get_block(state.height)
        nb = check_and_apply(b_state, blk, c)
        b.append(blk, c, b_state, nb)
        b_state = nb
    assert hist.read_head(b_state) == hist.read_head(state) and hist.read_head(state).size == 7
    assert _check_proofs(b, late) == len(late)  # the synced node proves what left after its snapshot
    assert all(b.history_entry(r) is None for r in early)  # not what left before it (it never held those)
    assert _check_proofs(a, early + late) == 7
    a.close()
    b.close()


def test_a_jobs_receipts_leave_after_the_job_ended_and_its_view_reads_them_from_the_log(tmp_path):
    """With retention_blocks set, a fine-tune job's training receipts stay while the job is open (it reads them),
    then leave ``retention_blocks`` after the job settled, into the same log: the job's API view shows them
    archived with their status, steps and payouts (the paid total unchanged), each proves against a header, a
    replay of one is refused (the job ended), and a restart reopens the same state."""

    from node.ledger.core.jobstate import SETTLED
    from node.ledger.core.jobtx import JobAccept, JobDeliver, JobPost, TrainReceipt
    from node.market.client import job_json

    from .helpers import CLIENT, W1

    g = make_genesis(retention_blocks=3, committee_size=2)
    store = LedgerStore(tmp_path / "db", g)
    state = store.replay()
    pps = 1_000_000
    post = JobPost(g.domain, CLIENT.account, b"\x05" * 16, "t", b"m" * 32, b"d" * 32, 4, "q_proj,v_proj", 4, 2,
                   16, 1000, 7, 2, pps, 400, 0, state.account(CLIENT.account).nonce).signed(CLIENT)
    t = iter(range(1000, 10_000))
    state = _step(store, state, [post], next(t))
    state = _step(store, state, [JobAccept(g.domain, W1.account, post.job_id, 0).signed(W1)], next(t))
    states = [bytes([i]) * 32 for i in range(3)]
    segs = [TrainReceipt(g.domain, post.job_id, W1.account, CLIENT.account, 2 * i, 2 * i + 2, states[i],
                         states[i + 1], bytes([9 + i]) * 32, 2_000_000, 2 * pps).signed(W1) for i in range(2)]
    for r in segs:
        state = _step(store, state, [r], next(t))
    state = _step(store, state, [JobDeliver(g.domain, W1.account, post.job_id, states[2], 1).signed(W1)], next(t))
    for _ in range(40):  # verdicts (this node's keys vote valid), settlement, then the retention window
        if jobs_of(state)[post.job_id].status == SETTLED:
            break
        state = _step(store, state, [], next(t))
    job = jobs_of(state)[post.job_id]
    assert job.status == SETTLED and all(r.id in state.receipts for r in segs)
    before = job_json(job, state, store.archived_summary)
    for _ in range(g.params.retention_blocks + 2):
        state = _step(store, state, [], next(t))
    assert all(r.id not in state.receipts for r in segs), "the ended job's receipts left the hot state"
    assert all(store.history_entry(r.id) is not None for r in segs)
    after = job_json(jobs_of(state)[post.job_id], state, store.archived_summary)
    assert after["paid"] == before["paid"] and int(after["paid"]["base_units"]) > 0
    assert [x["status"] for x in after["segments"]] == [x["status"] for x in before["segments"]]
    assert [x["steps"] for x in after["segments"]] == [[0, 2], [2, 4]] and all(x["archived"] for x in after["segments"])
    assert job_json(jobs_of(state)[post.job_id], state)["segments"][0]["status"] == "archived"  # no store at hand
    summary = store.archived_summary(segs[0].id)
    assert summary["kind"] == "train_receipt" and summary["session_id"] == post.job_id and summary["tokens"] == 2
    _, _, rejected = propose(state, [segs[0]], KEYS[0], next(t), store.last_commit())
    assert rejected  # the job ended: its receipt cannot come back
    state = _step(store, state, [], next(t))
    assert _check_proofs(store, [r.id for r in segs]) == len(segs)
    root = state.state_root()
    store.close()
    store = LedgerStore(tmp_path / "db", g)
    try:
        assert store.replay().state_root() == root and store.verify() == []
    finally:
        store.close()
