"""A chain in memory for tests of tabs and epoch batches: blocks proposed and committed by the one validator,
tab receipts co-signed by worker and requester, batches with their Merkle roots, and reveals with proofs."""

from __future__ import annotations

import os

from node.encoding import inclusion_proof, merkle_root
from node.identity import Identity
from node.ledger.core.chain import commit_block, propose
from node.ledger.core.state import State, genesis_state
from node.ledger.core.tabs import EpochBatch, Reveal, TabClose, TabOpen, TabReceipt, TabTopUp
from node.ledger.core.tabs.rules import epoch_of
from node.ledger.core.tx import Tx, Vote
from node.ledger.genesis import Genesis

from .helpers import KEYS, VALIDATOR, C, make_genesis

TAB_PARAMS = dict(epoch_blocks=4, batch_samples=2, reveal_window=3, settle_window=2, tab_close_delay=12,
                  committee_size=2, challenge_window=2, verdict_timeout=3, max_rounds=2)


def tab_genesis(**over) -> Genesis:
    return make_genesis(**{**TAB_PARAMS, **over})


class Chain:
    """One validator's chain in memory: ``send`` queues transactions, ``block`` includes them; ``rejected`` holds
    the last block's refusals as ``(tx, reason)``."""

    def __init__(self, g: Genesis, store=None):
        self.g, self.store = g, store  # store: a LedgerStore the blocks are appended to (LevelDB), or None
        self.state: State = genesis_state(g) if store is None else store.replay()
        self.blocks: list = []
        self.pending: list[Tx] = []
        self.rejected: list = []
        self.supply = self.state.supply()

    def nonce(self, k: Identity) -> int:
        return self.state.account(k.account).nonce + sum(
            1 for t in self.pending if getattr(t, "sender", None) == k.account and "nonce" in t.SCHEMA)

    def send(self, *txs: Tx) -> None:
        self.pending.extend(txs)

    def block(self, n: int = 1) -> None:
        for _ in range(n):
            last = self.blocks[-1][1] if self.blocks else ()
            blk, new, self.rejected = propose(self.state, self.pending, VALIDATOR, len(self.blocks), last)
            commit = commit_block(VALIDATOR, blk)
            self.blocks.append((blk, commit))
            if self.store is not None:
                self.store.append(blk, commit, self.state, new)
            self.state, self.pending = new, []
            assert self.state.supply() == self.supply, "credits are conserved"

    def open_tab(self, requester: Identity, worker: Identity, amount: int) -> bytes:
        tx = TabOpen(self.g.domain, requester.account, worker.account, amount, self.nonce(requester)).signed(requester)
        self.send(tx)
        return tx.id

    def topup(self, requester: Identity, tab_id: bytes, amount: int) -> None:
        self.send(TabTopUp(self.g.domain, requester.account, tab_id, amount, self.nonce(requester)).signed(requester))

    def close(self, requester: Identity, tab_id: bytes) -> None:
        self.send(TabClose(self.g.domain, requester.account, tab_id, self.nonce(requester)).signed(requester))

    def receipts(self, worker: Identity, requester: Identity, tab_id: bytes, amounts: list[int], start_nonce: int = 1,
                 start_owed: int = 0) -> list[TabReceipt]:
        """Tab receipts of ``amounts`` (base units each) on ``tab_id``, cumulative from ``start_owed``."""
        out, owed = [], start_owed
        for i, a in enumerate(amounts):
            owed += a
            r = TabReceipt(self.g.domain, os.urandom(16), worker.account, requester.account, b"m" * 32, 0, 4, 10,
                           b"i" * 32, b"o" * 32, tab_id, start_nonce + i, owed, self.state.height)
            out.append(r.sign_worker(worker).countersign(requester))
        return out

    def batch(self, worker: Identity, receipts: list[TabReceipt], vouchers: list[TabReceipt] | None = None,
              epoch: int | None = None) -> EpochBatch:
        """The worker's batch over ``receipts``; vouchers: the newest receipt per tab unless given."""
        if vouchers is None:
            newest: dict[bytes, TabReceipt] = {}
            for r in receipts:
                if r.tab_id not in newest or r.tab_nonce > newest[r.tab_id].tab_nonce:
                    newest[r.tab_id] = r
            vouchers = list(newest.values())
        if epoch is None:
            epoch = epoch_of(self.state.height + 1, self.g.params.epoch_blocks)
        b = EpochBatch(self.g.domain, worker.account, epoch, merkle_root([r.id for r in receipts]), len(receipts),
                       sum(r.work for r in receipts), [v.to_record() for v in vouchers]).signed(worker)
        self.send(b)
        return b

    def reveal(self, worker: Identity, b: EpochBatch, receipts: list[TabReceipt], index: int,
               proof: list[bytes] | None = None, receipt: TabReceipt | None = None) -> Reveal:
        ids = [r.id for r in receipts]
        rv = Reveal(self.g.domain, worker.account, b.key, index, (receipt or receipts[index]).to_record(),
                    proof if proof is not None else inclusion_proof(ids, index)).signed(worker)
        self.send(rv)
        return rv

    def vote_all(self, verdict: int) -> int:
        """Every committee member of every sampled receipt votes ``verdict``; returns the votes sent."""
        keys = {k.account: k for k in KEYS}
        n = 0
        for rid, rec in self.state.receipts.items():
            if rec.status == "sampled":
                for m in rec.committee:
                    if m not in rec.round_votes():
                        self.send(Vote(self.g.domain, rid, m, rec.round, verdict, 0).signed(keys[m]))
                        n += 1
        return n

    def settlement(self, b: EpochBatch):
        return self.state.tables["settlements"].get(b.key)


__all__ = ["KEYS", "TAB_PARAMS", "C", "Chain", "tab_genesis"]
