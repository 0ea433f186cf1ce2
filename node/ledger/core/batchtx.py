"""Transactions of batch jobs checked by majority vote (issue 14; the state machine is :mod:`node.ledger.core.batch`).

Lifecycle: :class:`BatchPost` (the requester escrows :meth:`BatchPost.escrow` base units) → each item is assigned by
a beacon to ``k`` distinct bonded workers → each worker sends a :class:`BatchCommit` of
:func:`commitment` ``(batch, item, attempt, worker, result hash, salt)`` within the commit window → then a
:class:`BatchReveal` of the result hash and salt within the reveal window → the item is decided by majority.
:class:`BatchCancel` refunds everything while no item has been assigned. The result bytes live off-chain (the blob
store, by content hash); the ledger holds hashes only.

Opt-in (issue 24 finding 2): a bonded account is drawn for batch items (and batch audits) only while its
:class:`BatchOffer` is live and its floor per token, times the post's :meth:`BatchPost.tokens`, is at most the
post's ``price``; ``node start --accept-batches [--batch-floor PRICE]`` publishes the offer and a node started
without the flag withdraws it (``min_price_per_token`` = :data:`WITHDRAWN`).

Replay: a post and a cancel carry the requester's account nonce; a commit and a reveal count once per (batch, item,
attempt, worker) instead, so that a worker's many independent items never wait on each other's ordering (as
receipts do, :mod:`node.ledger.core.tx`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ...encoding import H, merkle_root
from .txbase import FeeParams, SingleSigned

GENERATE, SCORE = "generate", "score"
TASK_KINDS = (GENERATE, SCORE)
MAX_ITEMS = 100_000  # items per batch
MAX_REPLICATION = 16
MAX_REISSUES = 8
MAX_WINDOW = 10_000  # blocks, for each of the commit and reveal windows
MAX_GENERATE_TOKENS = 4096
# The tokens of work one score item is counted as, for price floors: a score item is one forward pass over a text of
# up to 64 KiB whose token count the ledger cannot see (a generate item's is its ``max_tokens``). 256 tokens is a
# short paragraph; a requester scoring longer texts should pay above the floor, and a worker that wants more sets a
# higher floor of its own.
SCORE_ITEM_TOKENS = 256
WITHDRAWN = -1  # BatchOffer.min_price_per_token of a withdrawn offer
MAX_FLOOR = 10**15  # base units per token: a floor above it is refused (floor × tokens stays far from overflow)


def items_root(lines: Sequence[bytes]) -> bytes:
    """The ``items_root`` of a batch: the RFC 9162 Merkle root over ``H(line)`` for each JSONL line (its bytes
    without the newline), in file order. The item index of a commit is a line's 0-based position."""
    return merkle_root([H(b"tally/batch-item/v1", line) for line in lines])


def commitment(batch_id: bytes, item: int, attempt: int, worker: bytes, result_hash: bytes, salt: bytes) -> bytes:
    """``H(result ‖ salt)`` bound to its slot: the 32-byte hash a :class:`BatchCommit` carries. Binding the batch,
    item, attempt and the worker's own account means a commitment copied from another worker's transaction cannot
    be opened by the copier; the 32-byte random ``salt`` hides the result (a worker could otherwise try the few
    likely results against the hash)."""
    return H(b"tally/batch-commit/v1", batch_id, item.to_bytes(4, "big"), attempt.to_bytes(4, "big"), worker,
             result_hash, salt)


@dataclass(frozen=True)
class BatchPost(SingleSigned):
    """A batch of ``n_items`` items (a JSONL file whose :func:`items_root` is ``items_root``) of task ``kind``
    (``generate``: greedy completion of at most ``max_tokens`` tokens; ``score``: per-token log-likelihoods,
    ``max_tokens`` 0), each done by ``replication`` workers and decided by ``quorum`` equal results
    (``replication / 2 < quorum <= replication``), paying ``price`` base units per item per agreeing replica,
    re-issued at most ``max_reissues`` times, each attempt with a commit window of ``commit_window`` blocks and
    then a reveal window of ``reveal_window`` blocks."""

    chain_id: str
    sender: bytes  # the requester
    batch_id: bytes
    items_root: bytes
    n_items: int
    kind: str
    max_tokens: int
    replication: int
    quorum: int
    price: int
    max_reissues: int
    commit_window: int
    reveal_window: int
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/batch-post/v1"
    KIND: ClassVar[str] = "batch_post"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {
        "sender": "account", "batch_id": "bytes16", "items_root": "bytes32", "n_items": "int", "kind": "str",
        "max_tokens": "int", "replication": "int", "quorum": "int", "price": "int", "max_reissues": "int",
        "commit_window": "int", "reveal_window": "int", "nonce": "int"}

    def cost(self, params: FeeParams | None = None) -> int:
        """Base units the post moves into escrow: :func:`escrow_of` under the chain's ``params`` (its replicas'
        escrow and its audit fee); without them, :meth:`escrow` (the replicas' escrow only)."""
        return self.escrow() if params is None else escrow_of(params, self)

    def escrow(self) -> int:
        """Base units moved from the requester's balance into escrow at the post:
        ``n_items × replication × price × (1 + max_reissues)``, the most the batch can ever pay (every item paid
        ``replication`` replicas in each of its ``1 + max_reissues`` attempts). Reissue headroom is held in full so
        that a re-issue never waits on the requester's balance; what is not paid returns when the batch settles."""
        return self.n_items * self.replication * self.price * (1 + self.max_reissues)

    def tokens(self) -> int:
        """Tokens of work one item is counted as for price floors: ``max_tokens`` for ``generate``,
        :data:`SCORE_ITEM_TOKENS` for ``score`` (at least 1). A post's price per token is ``price / tokens()``."""
        return max(1, self.max_tokens) if self.kind == GENERATE else SCORE_ITEM_TOKENS


@dataclass(frozen=True)
class BatchCommit(SingleSigned):
    """Worker ``sender`` commits to its result for ``item`` (0-based) of ``batch_id`` in ``attempt`` (0 for the first
    assignment, +1 per re-issue): ``commitment`` is :func:`commitment` of the result's hash and a secret salt."""

    chain_id: str
    sender: bytes  # the worker
    batch_id: bytes
    item: int
    attempt: int
    commitment: bytes
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/batch-commit/v1"
    KIND: ClassVar[str] = "batch_commit"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "batch_id": "bytes16", "item": "int", "attempt": "int",
                                        "commitment": "bytes32"}


@dataclass(frozen=True)
class BatchReveal(SingleSigned):
    """Worker ``sender`` opens its commitment: ``result_hash`` (the content hash of the result bytes, stored off-chain)
    and the ``salt`` it committed with."""

    chain_id: str
    sender: bytes  # the worker
    batch_id: bytes
    item: int
    attempt: int
    result_hash: bytes
    salt: bytes
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/batch-reveal/v1"
    KIND: ClassVar[str] = "batch_reveal"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "batch_id": "bytes16", "item": "int", "attempt": "int",
                                        "result_hash": "bytes32", "salt": "bytes32"}


@dataclass(frozen=True)
class BatchCancel(SingleSigned):
    """The requester withdraws a batch none of whose items has been assigned: the whole escrow returns."""

    chain_id: str
    sender: bytes  # the requester
    batch_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/batch-cancel/v1"
    KIND: ClassVar[str] = "batch_cancel"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "batch_id": "bytes16", "nonce": "int"}


@dataclass(frozen=True)
class BatchAuditVote(SingleSigned):
    """A member of a decided item's audit committee (:mod:`node.ledger.core.batchaudit`) states the result hash it
    computed for the item. Counted once per (batch, item, member)."""

    chain_id: str
    sender: bytes  # the committee member
    batch_id: bytes
    item: int
    result_hash: bytes
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/batch-audit-vote/v1"
    KIND: ClassVar[str] = "batch_audit_vote"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "batch_id": "bytes16", "item": "int",
                                        "result_hash": "bytes32"}


@dataclass(frozen=True)
class BatchOffer(SingleSigned):
    """Account ``sender`` opts in to batch work (issue 24 finding 2): while this offer is live and the account is
    bonded, it may be drawn for the items and audits of a batch whose price per item per replica is at least
    ``min_price_per_token × BatchPost.tokens()`` (base units). ``min_price_per_token`` :data:`WITHDRAWN` (-1)
    withdraws the offer: no new draws; items already drawn are still to be done. A later offer replaces an
    earlier one. Carries the account nonce (one offer per nonce)."""

    chain_id: str
    sender: bytes  # the worker
    min_price_per_token: int  # base units per token of work; WITHDRAWN (-1): no offer
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/batch-offer/v1"
    KIND: ClassVar[str] = "batch_offer"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "min_price_per_token": "sint", "nonce": "int"}


def member_pay(p: FeeParams, post: BatchPost) -> int:
    """Base units an audit committee member that voted the audit's outcome is paid for one item of ``post``:
    ``price × batch_audit_pay_bps / 10^4`` (0 when the genesis pays no audit fee)."""
    return post.price * p.batch_audit_pay_bps // 10_000


def audit_share(p: FeeParams, post: BatchPost) -> int:
    """Base units of audit fee one item escrows at the post: ``committee_size ×`` :func:`member_pay`."""
    return p.committee_size * member_pay(p, post)


def escrow_of(p: FeeParams, post: BatchPost) -> int:
    """Every base unit a post moves into escrow: :meth:`BatchPost.escrow` (the replicas') plus ``n_items ×``
    :func:`audit_share`."""
    return post.escrow() + post.n_items * audit_share(p, post)


BATCH_TXS = (BatchPost, BatchCommit, BatchReveal, BatchCancel, BatchAuditVote, BatchOffer)
