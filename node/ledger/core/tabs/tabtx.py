"""The transactions of settlement by tabs and epoch batches (issue 37; the rules are :mod:`.rules`).

* :class:`TabOpen`, :class:`TabTopUp`, :class:`TabClose` -- a requester locks credits for one worker, adds to
  them, and asks for the unspent rest back (after genesis ``tab_close_delay`` blocks, so the worker can still
  redeem). Ordered by the requester's account nonce. A tab names one worker: a cumulative voucher is one counter,
  and two workers redeeming one counter would race for it (a Filecoin payment channel has one payee per lane).
* :class:`TabReceipt` -- an inference receipt under a tab: today's receipt (co-signed by worker and requester,
  hash-committed to inputs and outputs) with the tab, a tab nonce and the cumulative amount owed on the tab after
  this receipt. The newest one is the voucher for all before it (Filecoin's vouchers: the newest nonce wins, a
  replay adds nothing). It enters the ledger only inside an :class:`EpochBatch` (as a voucher) and a
  :class:`Reveal` (as a sampled receipt), never alone.
* :class:`EpochBatch` -- once per epoch a worker commits to its epoch's receipts: the RFC 9162 Merkle root over
  their ids in order, their count and work, and the newest voucher of each tab it touched (Livepeer's
  ``ClaimWork``: one root over signed receipts; segments audited by a block hash after the claim).
* :class:`Reveal` -- a sampled receipt of a batch with its Merkle inclusion proof.
* :class:`TabDispute` -- a requester puts a receipt it holds before a committee while the batch that redeemed it
  is not final.

Amounts in base units; heights and windows in blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, ClassVar

from ....encoding import H, verify_inclusion
from ....keys import Identity
from ..txbase import InvalidTx, SingleSigned, Tx, _check, _check_field

MAX_VOUCHERS = 1024  # vouchers in one batch (tabs one worker settles per epoch in one transaction)
MAX_COUNT = 1 << 32  # receipts one batch may commit to


@dataclass(frozen=True)
class TabOpen(SingleSigned):
    """The requester ``sender`` locks ``amount`` for ``worker``; the tab's id is this transaction's id."""

    chain_id: str
    sender: bytes
    worker: bytes
    amount: int
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/tab-open/v1"
    KIND: ClassVar[str] = "tab_open"
    COST: ClassVar[str] = "amount"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "worker": "account", "amount": "amount",
                                        "nonce": "int"}


@dataclass(frozen=True)
class TabTopUp(SingleSigned):
    """The requester ``sender`` adds ``amount`` to the lock of its open tab ``tab_id``."""

    chain_id: str
    sender: bytes
    tab_id: bytes
    amount: int
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/tab-topup/v1"
    KIND: ClassVar[str] = "tab_topup"
    COST: ClassVar[str] = "amount"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "tab_id": "bytes32", "amount": "amount",
                                        "nonce": "int"}


@dataclass(frozen=True)
class TabClose(SingleSigned):
    """The requester ``sender`` closes tab ``tab_id``: its unspent lock returns ``tab_close_delay`` blocks later."""

    chain_id: str
    sender: bytes
    tab_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/tab-close/v1"
    KIND: ClassVar[str] = "tab_close"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "tab_id": "bytes32", "nonce": "int"}


@dataclass(frozen=True)
class TabReceipt(Tx):
    """One inference session on one span, paid through tab ``tab_id`` (fields as
    :class:`~node.ledger.core.txbase.Receipt`'s, ``price`` replaced by the tab's counter): ``tab_nonce`` counts
    the tab's receipts (1, 2, ...), ``cumulative`` is what the requester owes on the tab after this one. The
    requester's signature over the id is the voucher for ``cumulative``."""

    chain_id: str
    session_id: bytes
    worker: bytes
    requester: bytes
    model_id: bytes
    span_start: int
    span_end: int
    tokens: int
    inputs_root: bytes
    outputs_root: bytes
    tab_id: bytes
    tab_nonce: int
    cumulative: int
    opened_height: int
    compression: str = "none"
    worker_sig: bytes = b""
    requester_sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/tab-receipt/v1"
    KIND: ClassVar[str] = "tab_receipt"
    PAYER: ClassVar[str] = "requester"
    SIGS: ClassVar[tuple[str, ...]] = ("worker_sig", "requester_sig")
    SCHEMA: ClassVar[dict[str, str]] = {
        "session_id": "bytes16", "worker": "account", "requester": "account", "model_id": "bytes32",
        "span_start": "int", "span_end": "int", "tokens": "int", "inputs_root": "bytes32",
        "outputs_root": "bytes32", "tab_id": "bytes32", "tab_nonce": "int", "cumulative": "int",
        "opened_height": "int", "compression": "str",
    }

    price: ClassVar[int] = 0  # the core's escrow and payouts see no price: the tab and the batch hold the money

    def history_tail(self) -> list[Any]:
        """The last six fields of its history summary, as a plain receipt's
        (:meth:`~node.ledger.core.txbase.Receipt.history_tail`)."""
        return [self.session_id, self.opened_height, self.model_id, self.span_start, self.span_end, self.tokens]

    @property
    def work(self) -> int:
        """Work in token-blocks: ``tokens × (span_end − span_start)``."""
        return self.tokens * (self.span_end - self.span_start)

    def sign_worker(self, ident: Identity) -> TabReceipt:
        _check(ident.account == self.worker, "only the worker signs as worker")
        return replace(self, worker_sig=ident.sign(self.id))

    def countersign(self, ident: Identity) -> TabReceipt:
        _check(ident.account == self.requester, "only the requester countersigns")
        return replace(self, requester_sig=ident.sign(self.id))

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(self.worker, self.id, self.worker_sig, "worker tab receipt"),
                (self.requester, self.id, self.requester_sig, "requester tab receipt")]

    def check_shape(self) -> None:
        """Raises InvalidTx: worker is the requester, a bad span, no token, or a tab nonce of 0."""
        _check(self.worker != self.requester, "worker and requester must differ")
        _check(0 <= self.span_start < self.span_end <= 4096, "bad span")
        _check(self.tokens > 0, "a receipt covers at least one token")
        _check(self.tab_nonce >= 1, "a tab receipt's nonce starts at 1")

    def to_record(self) -> list[Any]:
        """Its fields and both signatures, the chain id left out: how a batch or a reveal carries it."""
        return [*self.unsigned(), self.worker_sig, self.requester_sig]

    @classmethod
    def from_record(cls, chain_id: str, rec: Any) -> TabReceipt:
        """The receipt a batch or reveal carries as ``rec`` (:meth:`to_record`), every field checked.

        Raises:
            InvalidTx: a wrong number of fields or a bad field or signature size.
        """
        _check(isinstance(rec, list) and len(rec) == len(cls.SCHEMA) + 2, "a tab receipt record has "
               f"{len(cls.SCHEMA) + 2} entries")
        for (name, kind), v in zip(cls.SCHEMA.items(), rec, strict=False):
            _check_field(name, kind, v)
        for sig in rec[-2:]:
            _check(isinstance(sig, bytes) and len(sig) == 64, "a tab receipt carries both 64-byte signatures")
        return cls(chain_id, *rec)


def batch_key(worker: bytes, epoch: int) -> bytes:
    """The state key of ``worker``'s epoch batch for ``epoch`` (32 bytes): one batch per worker and epoch."""
    return H(b"tally/epoch-batch-key/v1", worker, epoch.to_bytes(8, "big"))


@dataclass(frozen=True)
class EpochBatch(SingleSigned):
    """``worker``'s receipts of ``epoch``: ``root`` (RFC 9162 Merkle root over their ids in order), ``count``,
    ``work`` (their token-blocks) and ``vouchers`` (the newest :class:`TabReceipt` of each tab it touched, as
    records, at most one per tab). One per worker and epoch."""

    chain_id: str
    worker: bytes
    epoch: int
    root: bytes
    count: int
    work: int
    vouchers: list[list[bytes | int | str]]
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/epoch-batch/v1"
    KIND: ClassVar[str] = "epoch_batch"
    PAYER: ClassVar[str] = "worker"
    SIGNER: ClassVar[str] = "worker"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"worker": "account", "epoch": "int", "root": "bytes32", "count": "int",
                                        "work": "int", "vouchers": "records"}

    @cached_property
    def voucher_receipts(self) -> tuple[TabReceipt, ...]:
        """The vouchers as receipts, checked: shape, this worker's, one per tab.

        Raises:
            InvalidTx: a malformed voucher, another worker's, two for one tab, or more than :data:`MAX_VOUCHERS`.
        """
        _check(len(self.vouchers) <= MAX_VOUCHERS, f"at most {MAX_VOUCHERS} vouchers in one batch")
        out = tuple(TabReceipt.from_record(self.chain_id, v) for v in self.vouchers)
        for r in out:
            r.check_shape()
            _check(r.worker == self.worker, "a voucher of another worker")
        _check(len({r.tab_id for r in out}) == len(out), "two vouchers for one tab (only the newest counts)")
        return out

    @property
    def key(self) -> bytes:
        """The batch's key in the state: one batch per worker and epoch (:func:`batch_key`)."""
        return batch_key(self.worker, self.epoch)

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        """The worker's signature and each voucher's requester signature (once per tab per epoch)."""
        try:
            vouchers = self.voucher_receipts
        except InvalidTx:
            vouchers = ()  # refused by the state with the reason; the worker's signature is still checked here
        return [(self.worker, self.id, self.sig, self.KIND),
                *((r.requester, r.id, r.requester_sig, "voucher") for r in vouchers)]


@dataclass(frozen=True)
class Reveal(SingleSigned):
    """``worker`` reveals receipt number ``index`` of its batch ``batch_key``: the receipt as a record and its
    RFC 9162 inclusion proof against the batch's root."""

    chain_id: str
    worker: bytes
    batch_key: bytes
    index: int
    receipt: list[bytes | int | str]
    proof: list[bytes]
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/reveal/v1"
    KIND: ClassVar[str] = "reveal"
    PAYER: ClassVar[str] = "worker"
    SIGNER: ClassVar[str] = "worker"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"worker": "account", "batch_key": "bytes32", "index": "int",
                                        "receipt": "record", "proof": "hashes"}

    @cached_property
    def tab_receipt(self) -> TabReceipt:
        """The revealed receipt (fields checked; raises InvalidTx for a malformed one)."""
        r = TabReceipt.from_record(self.chain_id, self.receipt)
        r.check_shape()
        return r

    def proves(self, root: bytes, count: int) -> bool:
        """Whether the receipt's id is leaf ``index`` of the ``count``-leaf tree of ``root``."""
        return verify_inclusion(self.tab_receipt.id, self.index, count, list(self.proof), root)

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        """The worker's signature over the reveal, and both signatures of the revealed receipt."""
        try:
            inner = self.tab_receipt.signature_checks()
        except InvalidTx:
            inner = []
        return [(self.worker, self.id, self.sig, self.KIND), *inner]


@dataclass(frozen=True)
class TabDispute(SingleSigned):
    """The requester ``sender`` puts a receipt it holds (co-signed, as a record) before a committee while the
    worker's batch ``batch_key`` that redeemed it is not final (DESIGN.md "Settlement": "a requester may still
    dispute any receipt it holds within the window"). Replay-protected by the receipt's id (once per receipt)."""

    chain_id: str
    sender: bytes
    batch_key: bytes
    receipt: list[bytes | int | str]
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/tab-dispute/v1"
    KIND: ClassVar[str] = "tab_dispute"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "batch_key": "bytes32", "receipt": "record"}

    @cached_property
    def tab_receipt(self) -> TabReceipt:
        """The disputed receipt (fields checked; raises InvalidTx for a malformed one)."""
        r = TabReceipt.from_record(self.chain_id, self.receipt)
        r.check_shape()
        return r

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        """The requester's signature over the dispute, and both signatures of the disputed receipt."""
        try:
            inner = self.tab_receipt.signature_checks()
        except InvalidTx:
            inner = []
        return [(self.sender, self.id, self.sig, self.KIND), *inner]


TAB_TXS: tuple[type[Tx], ...] = (TabOpen, TabTopUp, TabClose, EpochBatch, Reveal, TabDispute, TabReceipt)

__all__ = ["MAX_COUNT", "MAX_VOUCHERS", "TAB_TXS", "EpochBatch", "Reveal", "TabClose", "TabDispute", "TabOpen",
           "TabReceipt", "TabTopUp", "batch_key"]
