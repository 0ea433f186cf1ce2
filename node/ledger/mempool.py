"""The mempool: which transactions a node queues for its next blocks, and the reason it gives for every other.

Pure and synchronous (no I/O, no trio): :class:`~node.ledger.service.LedgerService` feeds it transactions from
local callers, from gossip and from the direct-submit protocol, and hands it every new head state.

**Admission.** The pool keeps a *pending state*: the head state with every *ready* transaction applied in the
order it was admitted. A transaction is admitted when

* it applies to the pending state (a dry run of :func:`node.ledger.core.state.apply_tx`, the same transition the
  block will run) — it is then *ready*; or
* it carries a nonce (transfers, bonds, unbonds, job messages) that is ahead of its sender's next nonce by less
  than ``Limits.nonce_window`` and its sender can pay for it: its balance in the pending state covers its cost
  plus the cost of all its queued gapped transactions (:func:`cost`: every base unit the transaction moves out of
  its sender's balance, escrows included), and it holds some balance or bond. Such a *gapped* transaction waits
  for its predecessors at most ``Limits.future_ttl_blocks`` blocks and becomes ready when they arrive.

Receipts, training receipts, votes and evidence carry no nonce and are admitted only when they apply now (their
own rules: bonded worker, requester's balance, committee membership, not yet on the ledger...). Every
refusal raises :class:`~node.ledger.core.tx.InvalidTx` with its reason; nothing is changed then.

**Caps** (per account, per peer, in memory) and **priority when full** (WORK evicts ACCOUNT, never the other
way round): :mod:`node.ledger.mempool_policy`, with the bounds (:class:`~node.ledger.mempool_policy.Limits`) and
each transaction's class, payer and cost.

**Signatures** are verified once, at admission, after the cheap checks (so a flood of unpayable or far-future
transactions costs no signature check). :meth:`Mempool.verified` tells the block builder which transactions it
need not verify again: only the exact object admitted (same id and same signature bytes). A block from another
validator (a proposal, or a committed block from a peer) is checked the same way (:func:`node.ledger.core.chain.
check_block` with ``verified``): the signatures of the transactions admitted here are not verified again, every
other one is.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from ..encoding import pack
from .core.domain import mismatch
from .core.state import State, apply_tx
from .core.tx import InvalidTx, Tx
from .mempool_policy import Limits, Priority, cost, is_free, payer, priority, sig_key
from .txstatus import TxState, TxStatus

K = TypeVar("K", str, bytes)


def _decrement(counter: Counter[K], k: K) -> None:
    """One less of ``k`` in ``counter``; a count that reaches 0 leaves it (the counters hold live keys only)."""
    counter[k] -= 1
    if counter[k] <= 0:
        del counter[k]


@dataclass
class _Entry:
    tx: Tx
    size: int  # bytes of the msgpack wire form
    cls: Priority
    payer: bytes
    peer: str | None
    height: int  # head height at admission
    key: bytes  # sig_key of the admitted object
    seq: int  # admission order
    free: bool = False  # counted in the payer's max_free_per_sender
    ready: bool = False


class Mempool(Mapping[bytes, Tx]):
    """Queued transactions by id (a read-only mapping: ``len``, ``in``, ``values()``), the pending state, the
    signature cache and the per-peer refusal record of one node.

    Args:
        state: the head state.
        limits: the bounds (:class:`Limits`).
        clock: seconds, monotonic (per-peer windows).
    """

    def __init__(self, state: State, limits: Limits = Limits(),  # noqa: B008 - Limits is a frozen dataclass
                 clock: Callable[[], float] = time.monotonic):
        self.limits, self.clock = limits, clock
        self.state = state
        self._pending: State | None = None  # state + ready txs; None while no tx is ready (no copy needed)
        self._entries: dict[bytes, _Entry] = {}
        self._ready: dict[bytes, None] = {}  # ids applied to the pending state, in order
        self._future: dict[bytes, dict[int, bytes]] = {}  # sender -> nonce -> id of gapped txs
        self._per_payer: Counter[bytes] = Counter()
        self._free_per_payer: Counter[bytes] = Counter()
        self._per_peer: Counter[str] = Counter()
        self._refusals: dict[str, deque[float]] = {}
        self._count = [0, 0]  # per Priority
        self._bytes = [0, 0]
        self._seq = 0
        self.rejected: OrderedDict[bytes, str] = OrderedDict()  # tx id -> reason (refused, dropped, evicted)
        self._included: OrderedDict[bytes, None] = OrderedDict()  # ids in recent blocks (bounded by `remember`)
        self.stats: Counter[str] = Counter()  # admitted, refused, dropped, expired, evicted
        self._since: dict[bytes, float] = {}  # id -> clock() at admission (queued ids; pruned at each reset)

    # ---------------------------------------------------------------- mapping

    def __getitem__(self, tid: bytes) -> Tx:
        return self._entries[tid].tx

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Bytes of the queued transactions' wire form."""
        return sum(self._bytes)

    def count(self, cls: Priority) -> int:
        """Queued transactions of class ``cls``."""
        return self._count[cls]

    # ---------------------------------------------------------------- queries

    def view(self) -> State:
        """The pending state (read it, never change it): the head state plus every ready transaction."""
        return self._pending if self._pending is not None else self.state

    def next_nonce(self, account: bytes) -> int:
        """The nonce of ``account``'s next transaction: its ledger nonce plus its ready queued transactions."""
        return self.view().account(account).nonce

    def candidates(self) -> list[Tx]:
        """The ready transactions in the order they apply on the head state (what the next block should try)."""
        return [self._entries[t].tx for t in self._ready]

    def verified(self, tx: Tx) -> bool:
        """Whether this exact signed object (same id and signature bytes) was verified at admission."""
        e = self._entries.get(tx.id)
        return e is not None and e.key == sig_key(tx)

    def status(self, tid: bytes) -> TxStatus | None:
        """What this pool knows of ``tid``: queued (ready, or waiting behind a nonce gap: which nonce is missing and
        how many blocks it may still wait), or dropped or refused with the reason; None when neither (never seen
        here, included in a block: ask the store, or forgotten: the reasons kept are bounded by
        ``Limits.remember``)."""
        e = self._entries.get(tid)
        if e is not None:
            age = max(0.0, self.clock() - self._since.get(tid, self.clock()))
            if e.ready:
                return TxStatus(TxState.PENDING, "applies on the head state; waiting for a block", age, e.height)
            sender, nonce = e.tx.sender_nonce or (b"", 0)  # a queued gapped transaction has a nonce
            missing = self.view().account(sender).nonce
            left = max(0, self.limits.future_ttl_blocks - (self.state.height - e.height))
            return TxStatus(TxState.PENDING, f"nonce gap: this is nonce {nonce} of its sender and nonce "
                                             f"{missing} has not reached this node; dropped unless it arrives "
                                             f"within {left} blocks", age, e.height, missing, left)
        why = self.rejected.get(tid)
        return None if why is None else TxStatus(TxState.DROPPED, why)

    def local(self) -> list[Tx]:
        """The queued transactions that local callers submitted (not gossip or direct-submit peers), in admission
        order: what this node re-sends while they wait (:meth:`node.ledger.service.LedgerService.resend_due`)."""
        return [e.tx for e in sorted(self._entries.values(), key=lambda e: e.seq) if e.peer is None]

    # ---------------------------------------------------------------- admission

    def check_peer(self, peer: str) -> None:
        """Raise :class:`InvalidTx` if ``peer`` is over its refusal budget (the caps:
        :mod:`node.ledger.mempool_policy`)."""
        d = self._refusals.get(peer)
        L = self.limits
        if d is not None and len(d) >= L.max_refusals_per_peer and self.clock() - d[0] < L.peer_window_s:
            raise InvalidTx(f"peer sent {len(d)} refused transactions in the last {L.peer_window_s:g} s; "
                            "its transactions are ignored for now")

    def note_refusal(self, peer: str | None, tid: bytes | None = None, reason: str = "") -> None:
        """Record a refusal (against ``peer`` when it came from one; the reason under ``tid`` when known)."""
        self.stats["refused"] += 1
        if tid is not None:
            self._remember(tid, reason)
        if peer is None:
            return
        d = self._refusals.get(peer)
        if d is None:
            if len(self._refusals) >= self.limits.max_tracked_peers:  # bounded: forget stale peers first
                now = self.clock()
                for p in [p for p, q in self._refusals.items() if now - q[-1] >= self.limits.peer_window_s]:
                    del self._refusals[p]
                if len(self._refusals) >= self.limits.max_tracked_peers:
                    self._refusals.pop(next(iter(self._refusals)))
            d = self._refusals[peer] = deque(maxlen=max(1, self.limits.max_refusals_per_peer))
        d.append(self.clock())

    def add(self, tx: Tx, peer: str | None = None) -> bytes:
        """Admit ``tx`` (from ``peer``, or a local caller when None). Returns its id; a transaction already
        queued, or in one of the last blocks (a second copy from gossip or a second submitter), is a no-op.

        Raises:
            InvalidTx: with the reason it is refused (wrong chain, bad signature, nonce used or too far ahead,
                sender cannot pay, any state rule, a cap, or a full pool). Nothing changes then.
        """
        try:
            tid = self._admit(tx, peer)
        except InvalidTx as e:
            self.note_refusal(peer, tx.id, str(e))
            raise
        if tid in self._entries and tid not in self._since:  # admission time, for status(); pruned in reset()
            self._since[tid] = self.clock()
        return tid

    def _admit(self, tx: Tx, peer: str | None) -> bytes:
        L = self.limits
        if tx.chain_id != self.state.chain_id:
            raise InvalidTx(mismatch(tx.chain_id, self.state.chain_id))  # chain id and genesis (core.domain)
        tid = tx.id
        if tid in self._entries or tid in self._included:
            return tid
        if peer is not None:
            self.check_peer(peer)
            if self._per_peer[peer] >= L.max_queued_per_peer:
                raise InvalidTx(f"peer has {self._per_peer[peer]} transactions queued (at most "
                                f"{L.max_queued_per_peer})")
        who, cls = payer(tx), priority(tx)
        if self._per_payer[who] >= L.max_per_sender:
            raise InvalidTx(f"account {who.hex()[:16]} has {self._per_payer[who]} transactions queued (at most "
                            f"{L.max_per_sender}); wait for the next block")
        free = is_free(tx)
        if free and self._free_per_payer[who] >= L.max_free_per_sender:
            raise InvalidTx(f"account {who.hex()[:16]} has {self._free_per_payer[who]} queued transactions that "
                            f"move no credits (joins, leaves, cancels, unbonds: at most {L.max_free_per_sender}); "
                            "wait for the next block")
        gapped = False
        sn = tx.sender_nonce
        if sn is not None:
            gapped = self._check_nonced(tx, *sn)
        size = len(pack(tx.to_wire()))
        victims = self._victims(tx, cls, size, gapped)
        key = sig_key(tx)
        tx.check_signatures()  # the one signature check of this transaction
        if not gapped:
            if self._pending is None:
                self._pending = self.state.copy()
            apply_tx(self._pending, tx, signatures_checked=True)  # raises with the ledger's reason, changes nothing
        self._seq += 1
        e = _Entry(tx, size, cls, who, peer, self.state.height, key, self._seq, free=free, ready=not gapped)
        self._insert(e)
        if gapped and (sn := tx.sender_nonce) is not None:  # only a nonce-ordered transaction can be gapped
            self._future.setdefault(sn[0], {})[sn[1]] = tid
        else:
            self._ready[tid] = None
            if (sn := tx.sender_nonce) is not None:
                self._promote(sn[0])
        self.stats["admitted"] += 1
        if victims:
            ready_gone = False
            for v in victims:
                ready_gone |= self._entries[v].ready
                self._drop(v, "evicted from a full mempool by higher-priority transactions", "evicted")
            if ready_gone:
                self._rebuild()
        return tid

    def _check_nonced(self, tx: Tx, sender: bytes, nonce: int) -> bool:
        """Nonce window and ability to pay (``sender``, ``nonce``: ``sender_nonce``). Returns whether ``tx`` is
        gapped (ahead of the next nonce)."""
        L = self.limits
        acc = self.view().account(sender)
        nxt = acc.nonce
        if nonce < nxt:
            if nonce < self.state.account(sender).nonce:
                raise InvalidTx(f"bad nonce {nonce}: already used (the sender's next nonce is {nxt})")
            raise InvalidTx(f"bad nonce {nonce}: another transaction of this sender with this nonce is queued "
                            f"(next nonce {nxt})")
        if nonce >= nxt + L.nonce_window:
            raise InvalidTx(f"bad nonce {nonce}: too far ahead (the sender's next nonce is {nxt}; at most "
                            f"{nxt + L.nonce_window - 1} is queued)")
        gapped = nonce > nxt
        fut = self._future.get(sender, {})
        if gapped and nonce in fut:
            raise InvalidTx(f"bad nonce {nonce}: another transaction of this sender with this nonce is queued")
        p = self.state.params
        need = cost(tx, p) + (sum(cost(self._entries[t].tx, p) for t in fut.values()) if gapped else 0)
        if need > acc.balance:
            queued = " with the sender's queued transactions" if gapped else ""
            raise InvalidTx(f"insufficient balance: {need} base units needed{queued}, {acc.balance} available")
        if gapped and acc.balance == 0 and acc.bond == 0:
            raise InvalidTx(f"bad nonce {nonce}: ahead of the next nonce {nxt}, and the sender holds no credits "
                            "to pay for a queued transaction")
        return gapped

    def _victims(self, tx: Tx, cls: Priority, size: int, gapped: bool) -> list[bytes]:
        """Ids to evict so that ``tx`` fits, or raise ``InvalidTx("mempool full ...")`` (evicts nothing)."""
        L = self.limits
        need_n = len(self._entries) + 1 - L.max_txs
        need_b = self.size_bytes + size - L.max_bytes
        if cls is Priority.ACCOUNT:
            cap_n, cap_b = L.max_txs * L.account_share_pct // 100, L.max_bytes * L.account_share_pct // 100
            need_n = max(need_n, self._count[Priority.ACCOUNT] + 1 - cap_n)
            need_b = max(need_b, self._bytes[Priority.ACCOUNT] + size - cap_b)
        if need_n <= 0 and need_b <= 0:
            return []
        full = (f"mempool full for account transactions (transfers, bonds, job posts: at most "
                f"{L.account_share_pct} % of {L.max_txs} transactions and {L.max_bytes} bytes); try again later"
                if cls is Priority.ACCOUNT else
                f"mempool full ({len(self._entries)} transactions, {self.size_bytes} bytes); try again later")
        if gapped:
            raise InvalidTx(full)
        me = payer(tx)
        order = sorted(((e for e in self._entries.values()
                         if e.cls is Priority.ACCOUNT and not e.ready and e.payer != me)),
                       key=lambda e: (-self._per_payer[e.payer], e.payer, -e.tx.nonce))  # type: ignore[attr-defined]
        if cls is Priority.WORK:
            order += self._ready_tails(me)
        out: list[bytes] = []
        for e in order:
            if need_n <= 0 and need_b <= 0:
                break
            out.append(e.tx.id)
            need_n -= 1
            need_b -= e.size
        if need_n > 0 or need_b > 0:
            raise InvalidTx(full)
        return out

    def _ready_tails(self, exclude: bytes) -> list[_Entry]:
        """Ready ACCOUNT entries that no other entry of their sender follows, the longest queue's last first."""
        by_sender: dict[bytes, list[_Entry]] = {}
        for t in self._ready:
            e = self._entries[t]
            if e.tx.sender_nonce is not None and e.payer != exclude:
                by_sender.setdefault(e.payer, []).append(e)
        out: list[_Entry] = []
        for sender in sorted(by_sender, key=lambda s: -self._per_payer[s]):
            if self._future.get(sender):
                continue  # its gapped ones go first (they are in the gapped list)
            for e in reversed(by_sender[sender]):
                if e.cls is not Priority.ACCOUNT:
                    break
                out.append(e)
        return out

    # ---------------------------------------------------------------- bookkeeping

    def _insert(self, e: _Entry) -> None:
        self._entries[e.tx.id] = e
        self._per_payer[e.payer] += 1
        if e.free:
            self._free_per_payer[e.payer] += 1
        if e.peer is not None:
            self._per_peer[e.peer] += 1
        self._count[e.cls] += 1
        self._bytes[e.cls] += e.size

    def _remove(self, tid: bytes) -> _Entry | None:
        e = self._entries.pop(tid, None)
        if e is None:
            return None
        self._ready.pop(tid, None)
        if (sn := e.tx.sender_nonce) is not None:
            sender, nonce = sn
            fut = self._future.get(sender)
            if fut is not None and fut.get(nonce) == tid:
                del fut[nonce]
                if not fut:
                    del self._future[sender]
        _decrement(self._per_payer, e.payer)
        if e.peer is not None:
            _decrement(self._per_peer, e.peer)
        if e.free:
            _decrement(self._free_per_payer, e.payer)
        self._count[e.cls] -= 1
        self._bytes[e.cls] -= e.size
        return e

    def _remember(self, tid: bytes, reason: str) -> None:
        self.rejected[tid] = reason
        self.rejected.move_to_end(tid)
        while len(self.rejected) > self.limits.remember:
            self.rejected.popitem(last=False)

    def _drop(self, tid: bytes, reason: str, stat: str = "dropped") -> None:
        if self._remove(tid) is not None:
            self._remember(tid, reason)
            self.stats[stat] += 1

    def _promote(self, sender: bytes) -> None:
        """Apply ``sender``'s gapped transactions that its next nonce has reached."""
        fut = self._future.get(sender)
        while fut:
            view = self.view()
            tid = fut.get(view.account(sender).nonce)
            if tid is None:
                break
            del fut[view.account(sender).nonce]
            e = self._entries[tid]
            try:
                if self._pending is None:
                    self._pending = self.state.copy()
                apply_tx(self._pending, e.tx, signatures_checked=True)
            except InvalidTx as ex:
                self._drop(tid, str(ex))
                break
            e.ready = True
            self._ready[tid] = None
        if not self._future.get(sender):
            self._future.pop(sender, None)

    def drop(self, rejected: Iterable[tuple[Tx, str]]) -> None:
        """Forget transactions a block builder found not to apply (with its reasons) and rebuild the rest."""
        gone = False
        for tx, why in rejected:
            if tx.id in self._entries:
                self._drop(tx.id, why)
                gone = True
        if gone:
            self._rebuild()

    def reset(self, state: State, included: Iterable[bytes] = ()) -> None:
        """A new head ``state``: forget the ``included`` ids, re-apply the ready transactions on it (dropping
        those that no longer apply, with their reasons), promote gapped ones whose turn came, and expire gapped
        ones that waited ``future_ttl_blocks`` or that their sender can no longer pay for."""
        self.state = state
        for tid in included:
            self._remove(tid)
            self._included[tid] = None
        while len(self._included) > self.limits.remember:
            self._included.popitem(last=False)
        self._rebuild()
        self._since = {t: at for t, at in self._since.items() if t in self._entries}

    def _rebuild(self) -> None:
        L = self.limits
        order, self._ready, self._pending = list(self._ready), {}, None
        for tid in order:
            e = self._entries[tid]
            tx = e.tx
            sn = tx.sender_nonce
            if sn is not None and sn[1] > self.view().account(sn[0]).nonce:
                e.ready = False  # a predecessor went away: wait again, as a gapped transaction
                self._future.setdefault(sn[0], {})[sn[1]] = tid
                continue
            try:
                if self._pending is None:
                    self._pending = self.state.copy()
                apply_tx(self._pending, tx, signatures_checked=True)
            except InvalidTx as ex:
                self._drop(tid, str(ex))
                continue
            self._ready[tid] = None
        for sender in list(self._future):
            self._promote(sender)
            fut = self._future.get(sender, {})
            acc = self.view().account(sender)
            spent = 0
            for nonce in sorted(fut):
                tid = fut[nonce]
                e = self._entries[tid]
                spent += cost(e.tx, self.state.params)
                if nonce < acc.nonce:
                    self._drop(tid, f"bad nonce {nonce}: already used")
                elif self.state.height - e.height >= L.future_ttl_blocks:
                    self._drop(tid, f"bad nonce {nonce}: waited {L.future_ttl_blocks} blocks for nonce {acc.nonce}",
                               "expired")
                elif spent > acc.balance:
                    self._drop(tid, f"insufficient balance: {spent} base units needed with the sender's queued "
                                    f"transactions, {acc.balance} available")


__all__ = ["Mempool"]
