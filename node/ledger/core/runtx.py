"""Transactions of collaborative training runs (DiLoCo with receipts; the state machine is
:mod:`node.ledger.core.runs`).

Lifecycle of a run (DESIGN.md "Collaborative training runs"; DiLoCo, arXiv 2311.08105):

* :class:`RunPost` — a sponsor escrows the run's budget ``rounds × (max_workers × inner_steps × price_per_step +
  aggregator_fee)`` and fixes everything a worker and a verifier need: base model, trainable set, dataset hash,
  inner optimizer, H inner steps per round, rounds, workers per round, outer optimizer, pseudo-gradient codec,
  price, sampling rate, round timeout and the id of the initial parameters θ_0.
* :class:`RunJoin` / :class:`RunLeave` — a bonded worker joins (from the next round that opens) or leaves.
* :class:`RoundReceipt` — a worker's commitment for one round: θ_r, its inner optimizer state before and after,
  its parameters after H steps, the batches' Merkle root, the id of its encoded pseudo-gradient Δ and its mean
  loss. Sampled receipts are replayed by a committee (like training segments).
* :class:`RoundReveal` — after the round's commit phase closed, the worker says its Δ blob is served. Nobody can
  copy another's Δ in time: the bytes are served only after every commitment is on the ledger (commit–reveal).
* :class:`RoundAggregate` — the aggregator drawn by the beacon publishes θ_{r+1} and the outer momentum, computed
  from the accepted Δs in canonical order (:func:`node.training.outer.outer_step`). It is itself a receipt that a
  committee always re-computes bit for bit; a wrong one is slashed like any invalid receipt.
* :class:`RunCancel` — the sponsor cancels a run before its first round opened (full refund).

Amounts in base units; heights and timeouts in blocks; rates in parts per million (``*_ppm``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ...keys import Identity
from .txbase import SingleSigned, Tx

TRAINABLE = ("lora", "all")
# node.training.codec's; appended to, never changed: a posted run's codec keeps its meaning
CODECS = ("none", "int8", "topk", "topk-int4")
TOPK_CODECS = ("topk", "topk-int4")  # the codecs that keep topk_ppm / 1e6 of each tensor's entries
INNER_STATE = ("reset", "keep")


@dataclass(frozen=True)
class RunPost(SingleSigned):
    """A collaborative training run of ``rounds`` rounds of ``inner_steps`` AdamW steps per worker.

    Fields: ``trainable`` ``"lora"`` (rank ``rank`` on ``targets``) or ``"all"``; ``params0``: id (Merkle root of
    tensor commitments) of θ_0; inner AdamW learning rate ``lr_micro`` × 1e-6 on ``batch_size`` windows of
    ``seq_len`` tokens; ``inner_state`` ``"reset"`` (fresh AdamW moments every round) or ``"keep"``;
    ``screen_windows`` held-out windows per worker for the loss screen; outer SGD with learning rate
    ``outer_lr_ppm`` / 1e6, momentum ``outer_momentum_ppm`` / 1e6, Nesterov if ``nesterov`` = 1, clip at
    ``clip_ppm`` / 1e6 × the median Δ norm; ``codec`` with ``topk_ppm`` (fraction kept, top-k codecs only);
    ``min_workers``..``max_workers`` per round; each receipt sampled with probability at least ``sample_ppm`` /
    1e6; each phase of a round lasts at most ``round_timeout`` blocks; the run ends by height ``deadline``;
    ``quorum`` (optional, 0: every participant): the commit phase closes once this many participants committed,
    after a grace of a tenth of the blocks that took (:func:`node.ledger.core.runrounds.quorum_closes`), so a
    straggler stalls no round; its late receipt is refused."""

    chain_id: str
    sender: bytes
    run_id: bytes
    title: str
    model_id: bytes
    dataset_root: bytes
    trainable: str
    rank: int
    targets: str
    seed: int
    params0: bytes
    lr_micro: int
    batch_size: int
    seq_len: int
    inner_steps: int
    inner_state: str
    screen_windows: int
    rounds: int
    min_workers: int
    max_workers: int
    outer_lr_ppm: int
    outer_momentum_ppm: int
    nesterov: int
    clip_ppm: int
    codec: str
    topk_ppm: int
    price_per_step: int
    aggregator_fee: int
    sample_ppm: int
    round_timeout: int
    deadline: int
    nonce: int
    sig: bytes = b""
    quorum: int = 0

    TAG: ClassVar[bytes] = b"tally/run-post/v1"
    COST: ClassVar[str] = "budget"  # escrowed at the post
    KIND: ClassVar[str] = "run_post"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {
        "sender": "account", "run_id": "bytes16", "title": "text", "model_id": "bytes32", "dataset_root": "bytes32",
        "trainable": "str", "rank": "int", "targets": "text", "seed": "int", "params0": "bytes32",
        "lr_micro": "int", "batch_size": "int", "seq_len": "int", "inner_steps": "int", "inner_state": "str",
        "screen_windows": "int", "rounds": "int", "min_workers": "int", "max_workers": "int",
        "outer_lr_ppm": "int", "outer_momentum_ppm": "int", "nesterov": "int", "clip_ppm": "int", "codec": "str",
        "topk_ppm": "int", "price_per_step": "int", "aggregator_fee": "int", "sample_ppm": "int",
        "round_timeout": "int", "deadline": "int", "nonce": "int", "quorum": "int"}
    TAIL: ClassVar[tuple[str, ...]] = ("quorum",)  # added after runs were posted (issue 40): 0 is left out

    @property
    def receipt_price(self) -> int:
        """What one accepted round receipt earns: ``inner_steps × price_per_step`` base units."""
        return self.inner_steps * self.price_per_step

    @property
    def budget(self) -> int:
        """The escrow of the whole run in base units: every round at ``max_workers`` plus the aggregator fees."""
        return self.rounds * (self.max_workers * self.receipt_price + self.aggregator_fee)


@dataclass(frozen=True)
class RunJoin(SingleSigned):
    chain_id: str
    sender: bytes  # the worker
    run_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/run-join/v1"
    KIND: ClassVar[str] = "run_join"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "run_id": "bytes16", "nonce": "int"}


@dataclass(frozen=True)
class RunLeave(SingleSigned):
    chain_id: str
    sender: bytes  # the worker
    run_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/run-leave/v1"
    KIND: ClassVar[str] = "run_leave"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "run_id": "bytes16", "nonce": "int"}


@dataclass(frozen=True)
class RunCancel(SingleSigned):
    chain_id: str
    sender: bytes  # the sponsor
    run_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/run-cancel/v1"
    KIND: ClassVar[str] = "run_cancel"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "run_id": "bytes16", "nonce": "int"}


@dataclass(frozen=True)
class RoundReceipt(Tx):
    """Signed claim "I trained round ``round`` (attempt ``attempt``) of run ``run_id``": ``params_before`` (θ_r),
    ``opt_before`` / ``opt_after`` (inner optimizer state: moments, codec residual, step), ``params_after``
    (θ_worker after ``steps`` = H inner steps), ``batches_root`` (Merkle root of the assigned batches),
    ``delta_root`` (id of the encoded Δ = θ_r − θ_worker), ``delta_bytes`` (its payload size), the mean loss in
    millionths of a nat per token (-1: not finite) and ``price`` = H × price_per_step. Replay protection: its id,
    and one receipt per worker per round attempt."""

    chain_id: str
    run_id: bytes
    round: int
    attempt: int
    worker: bytes
    sponsor: bytes
    params_before: bytes
    opt_before: bytes
    params_after: bytes
    opt_after: bytes
    batches_root: bytes
    delta_root: bytes
    delta_bytes: int
    loss_ppm: int
    steps: int
    price: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/round-receipt/v1"
    KIND: ClassVar[str] = "round_receipt"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {
        "run_id": "bytes16", "round": "int", "attempt": "int", "worker": "account", "sponsor": "account",
        "params_before": "bytes32", "opt_before": "bytes32", "params_after": "bytes32", "opt_after": "bytes32",
        "batches_root": "bytes32", "delta_root": "bytes32", "delta_bytes": "int", "loss_ppm": "sint",
        "steps": "int", "price": "int"}

    @property
    def requester(self) -> bytes:
        """The account paying for the work (the run's sponsor), excluded from the committee like a requester."""
        return self.sponsor

    @property
    def sender(self) -> bytes:
        return self.worker

    def history_tail(self) -> list[Any]:
        """The last six fields of its history summary (:func:`node.ledger.core.history.summary`): ``[run id,
        round, b"", 0, steps, steps]``."""
        return [self.run_id, self.round, b"", 0, self.steps, self.steps]

    def signed(self, ident: Identity) -> RoundReceipt:
        return replace(self, sig=ident.sign(self.id))

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(self.worker, self.id, self.sig, "round receipt")]


@dataclass(frozen=True)
class RoundReveal(Tx):
    """"My Δ ``delta_root`` for round ``round`` (attempt ``attempt``) of ``run_id`` is served now": accepted only
    after the round's commit phase closed and before its reveal phase ends."""

    chain_id: str
    run_id: bytes
    round: int
    attempt: int
    worker: bytes
    delta_root: bytes
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/round-reveal/v1"
    KIND: ClassVar[str] = "round_reveal"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"run_id": "bytes16", "round": "int", "attempt": "int", "worker": "account",
                                        "delta_root": "bytes32"}

    @property
    def sender(self) -> bytes:
        return self.worker

    def signed(self, ident: Identity) -> RoundReveal:
        return replace(self, sig=ident.sign(self.id))

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(self.worker, self.id, self.sig, "round reveal")]


@dataclass(frozen=True)
class RoundAggregate(Tx):
    """The drawn aggregator's claim: from θ_r (``params_before``) and outer momentum ``momentum_before`` (all
    zero bytes: none yet), the Δs of ``accepted`` (worker accounts in canonical, ascending order) give
    ``params_next`` (θ_{r+1}) and ``momentum_next``. ``price`` = the run's ``aggregator_fee``. Always re-computed
    by a committee (bit for bit); on a valid verdict round r+1 opens from ``params_next``. ``heldout_ppm``
    (optional, 0: not measured): θ_{r+1}'s mean loss on the run's held-out windows, millionths of a nat per token
    (:mod:`node.training.heldout`; the committee re-measures it within a tolerance)."""

    chain_id: str
    run_id: bytes
    round: int
    attempt: int
    aggregator: bytes
    sponsor: bytes
    params_before: bytes
    momentum_before: bytes
    params_next: bytes
    momentum_next: bytes
    accepted: tuple[bytes, ...]
    price: int
    sig: bytes = b""
    heldout_ppm: int = 0

    TAG: ClassVar[bytes] = b"tally/round-aggregate/v1"
    KIND: ClassVar[str] = "round_aggregate"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {
        "run_id": "bytes16", "round": "int", "attempt": "int", "aggregator": "account", "sponsor": "account",
        "params_before": "bytes32", "momentum_before": "bytes32", "params_next": "bytes32",
        "momentum_next": "bytes32", "accepted": "accounts", "price": "int", "heldout_ppm": "int"}
    TAIL: ClassVar[tuple[str, ...]] = ("heldout_ppm",)  # added after aggregates were signed (issue 40)

    def __post_init__(self) -> None:
        object.__setattr__(self, "accepted", tuple(self.accepted))  # from the wire: a list (hashable as a tuple)

    @property
    def worker(self) -> bytes:
        """The account that did the work (the aggregator): slashed on an invalid verdict."""
        return self.aggregator

    @property
    def requester(self) -> bytes:
        return self.sponsor

    @property
    def sender(self) -> bytes:
        return self.aggregator

    def history_tail(self) -> list[Any]:
        """The last six fields of its history summary (:func:`node.ledger.core.history.summary`): ``[run id,
        round, b"", 0, 0, 0]`` (an aggregate trains no steps)."""
        return [self.run_id, self.round, b"", 0, 0, 0]

    def signed(self, ident: Identity) -> RoundAggregate:
        return replace(self, sig=ident.sign(self.id))

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(self.aggregator, self.id, self.sig, "round aggregate")]


NO_MOMENTUM = b"\x00" * 32  # momentum_before of a run's first outer step

# the kinds of the runs module (node.ledger.core.runs.MODULE), in registry order
RUN_TXS = (RunPost, RunJoin, RunLeave, RunCancel, RoundReceipt, RoundReveal, RoundAggregate)
