"""Transactions of the fine-tune job marketplace (see :mod:`node.ledger.core.jobs` for their state transition).

Lifecycle: :class:`JobPost` (the requester escrows ``steps × price_per_step``) → :class:`JobAccept` by a bonded
worker → one :class:`TrainReceipt` per segment of at most ``segment_steps`` steps, sampled and re-executed like
inference receipts → :class:`JobDeliver` of the final training state's id → settlement. :class:`JobCancel` before
acceptance refunds everything; past ``deadline`` (a ledger height) an undelivered job expires. An accepted job
whose first segment is not on the ledger within the genesis ``job_start_window`` returns to open, and so does one
its worker gives up with :class:`JobRelease` before its first segment (penalties in :mod:`node.ledger.core.jobs`).
Posts, accepts, deliveries and cancellations carry a per-account nonce; a training receipt is replay-protected by
its id and by the contiguity of its step range with the job's previous receipt. Account fields (``sender``,
``worker``, ``requester``) must be valid Ed25519 public keys, checked when a transaction is decoded
(:func:`node.ledger.core.tx.decode_tx`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ...keys import Identity
from .txbase import SingleSigned, Tx

# The linear layers of a Llama-architecture decoder block that LoRA may adapt (peft ``target_modules`` names):
# attention projections and MLP. A post naming anything else would be accepted by a worker and then fail in
# peft at every attempt, so the ledger refuses it.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_targets(targets: str) -> tuple[str, ...]:
    """``"q_proj,v_proj"`` -> ``("q_proj", "v_proj")``.

    Raises:
        ValueError: empty, a name outside :data:`LORA_TARGETS`, or a name twice.
    """
    names = tuple(t.strip() for t in targets.split(","))
    bad = [t for t in names if t not in LORA_TARGETS]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(f"targets must be distinct comma-separated names among {', '.join(LORA_TARGETS)} "
                         f"(got {targets!r})")
    return names


@dataclass(frozen=True)
class JobPost(SingleSigned):
    """A fine-tune job: LoRA of ``rank`` on ``targets`` (comma-separated module names) of ``model_id``, trained on
    the text with content hash ``dataset_root`` for ``steps`` steps of ``batch_size`` windows of ``seq_len``
    tokens at learning rate ``lr_micro`` × 1e-6 with ``seed``, in segments of ``segment_steps`` steps; paying
    ``price_per_step`` base units per step, due by ledger height ``deadline``, each segment sampled with
    probability at least ``sample_ppm`` / 1e6."""

    chain_id: str
    sender: bytes
    job_id: bytes
    title: str
    model_id: bytes
    dataset_root: bytes
    rank: int
    targets: str
    steps: int
    batch_size: int
    seq_len: int
    lr_micro: int
    seed: int
    segment_steps: int
    price_per_step: int
    deadline: int
    sample_ppm: int
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/job-post/v1"
    COST: ClassVar[str] = "price"  # the job's whole price, escrowed at the post
    KIND: ClassVar[str] = "job_post"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {
        "sender": "account", "job_id": "bytes16", "title": "text", "model_id": "bytes32", "dataset_root": "bytes32",
        "rank": "int", "targets": "text", "steps": "int", "batch_size": "int", "seq_len": "int", "lr_micro": "int",
        "seed": "int", "segment_steps": "int", "price_per_step": "int", "deadline": "int", "sample_ppm": "int",
        "nonce": "int"}

    @property
    def price(self) -> int:
        """The whole job's price in base units: ``steps × price_per_step`` (held in escrow)."""
        return self.steps * self.price_per_step


@dataclass(frozen=True)
class JobAccept(SingleSigned):
    chain_id: str
    sender: bytes  # the worker
    job_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/job-accept/v1"
    KIND: ClassVar[str] = "job_accept"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "job_id": "bytes16", "nonce": "int"}


@dataclass(frozen=True)
class JobDeliver(SingleSigned):
    chain_id: str
    sender: bytes  # the worker
    job_id: bytes
    adapter: bytes  # id of the final training state (its Merkle root), fetched by content hash
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/job-deliver/v1"
    KIND: ClassVar[str] = "job_deliver"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "job_id": "bytes16", "adapter": "bytes32",
                                        "nonce": "int"}


@dataclass(frozen=True)
class JobCancel(SingleSigned):
    chain_id: str
    sender: bytes  # the requester
    job_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/job-cancel/v1"
    KIND: ClassVar[str] = "job_cancel"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "job_id": "bytes16", "nonce": "int"}


@dataclass(frozen=True)
class JobRelease(SingleSigned):
    """The worker gives back an accepted job it cannot do, before its first segment is on the ledger: the job
    returns to open and the worker's bond pays ``job_release_penalty`` (smaller than the start window's
    ``job_start_penalty``, so a worker that knows it cannot start says so at once)."""

    chain_id: str
    sender: bytes  # the worker
    job_id: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/job-release/v1"
    KIND: ClassVar[str] = "job_release"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "job_id": "bytes16", "nonce": "int"}


@dataclass(frozen=True)
class TrainReceipt(Tx):
    """Signed claim "I trained steps ``[step_start, step_end)`` of job ``job_id``": the training state before and
    after (Merkle roots, :mod:`node.compute.train`), the Merkle root of the batches trained on, the segment's
    mean loss in millionths of a nat per token (-1: the loss was not finite) and the price
    ``(step_end − step_start) × price_per_step``. Work measure: steps × batch size."""

    chain_id: str
    job_id: bytes
    worker: bytes
    requester: bytes
    step_start: int
    step_end: int
    state_before: bytes
    state_after: bytes
    batches_root: bytes
    loss_ppm: int
    price: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/train-receipt/v1"
    PAYER: ClassVar[str] = "worker"  # paid from the job's escrow: the worker sends it
    KIND: ClassVar[str] = "train_receipt"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {
        "job_id": "bytes16", "worker": "account", "requester": "account", "step_start": "int", "step_end": "int",
        "state_before": "bytes32", "state_after": "bytes32", "batches_root": "bytes32", "loss_ppm": "sint",
        "price": "int"}

    def history_tail(self) -> list[Any]:
        """The last six fields of its history summary (:func:`node.ledger.core.history.summary`): ``[job id, 0,
        b"", step start, step end, steps]``."""
        return [self.job_id, 0, b"", self.step_start, self.step_end, self.step_end - self.step_start]

    def signed(self, ident: Identity) -> TrainReceipt:
        return replace(self, sig=ident.sign(self.id))

    def signature_checks(self) -> list[tuple[bytes, bytes, bytes, str]]:
        return [(self.worker, self.id, self.sig, "training receipt")]


# the kinds of the jobs module (node.ledger.core.jobs.MODULE), in registry order
JOB_TXS = (JobPost, JobAccept, JobDeliver, JobCancel, JobRelease, TrainReceipt)
