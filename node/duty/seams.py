"""The node's services as the capabilities see them: one narrow Protocol per role, declared once (issue 38).

Every capability receives the node's services (:class:`node.duty.parts.NodeParts`) and types what it uses by one
of these roles instead of restating a property list of its own (the Cosmos SDK names a module's expected keepers
once per dependency, ``x/*/types/expected_keepers.go``):

* :class:`LedgerReader` -- the current state, the signing domain, the event of the next block;
* :class:`Submitter` -- an account's next nonce and submitting a transaction;
* :class:`Ledger` -- the node's ledger service as a capability uses it: both, plus the genesis, the pending
  transactions and block listeners (:class:`node.ledger.service.LedgerService` is one);
* :class:`Executor` -- the torch executor (:class:`node.compute.executor.TorchExecutor`);
* :data:`Host` -- a request and its reply over libp2p (:class:`node.blobs.BlobHost`; :class:`node.p2p.host.P2PHost`);
* :class:`Member` and :class:`ReceiptChecker` -- a committee member as a capability's receipt check uses it, and
  that check (:class:`node.verify.member.CommitteeMember` runs them; the capabilities register theirs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from ..blobs import BlobHost, BlobStore
from ..ledger.core.block import Block
from ..ledger.core.genesis import Genesis
from ..ledger.core.state import State
from ..ledger.core.tx import Tx
from .verdict import CheckResult

T = TypeVar("T")

Host = BlobHost  # one request and its reply (node.blobs.BlobHost: declared where blobs are fetched)


class LedgerReader(Protocol):
    """The ledger as a reader: the current state, the signing domain (``chain_id``), and an event set at the
    next block."""

    @property
    def state(self) -> State: ...

    @property
    def chain_id(self) -> str: ...

    @property
    def new_block(self) -> trio.Event: ...


class Submitter(Protocol):
    """The ledger as a sender of transactions: an account's next nonce (its pending transactions counted) and
    submitting one (returns its id; raises ``InvalidTx`` when the local node refuses it)."""

    def next_nonce(self, account: bytes) -> int: ...

    async def submit(self, tx: Tx) -> bytes: ...


class Ledger(LedgerReader, Submitter, Protocol):
    """The node's ledger service as a capability uses it: reading and submitting, the genesis, the pending
    transactions (id -> transaction; KeyError when not pending) and block listeners (``fn(block, new_state)``
    after each stored block)."""

    @property
    def genesis(self) -> Genesis: ...

    @property
    def mempool(self) -> Mapping[bytes, Tx]: ...

    def on_block(self, fn: Callable[[Block, State], None]) -> None: ...


class Executor(Protocol):
    """The node's torch executor: ``fn(*args)`` on its worker thread (one call at a time), awaited."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...


class Member(Protocol):
    """A committee member as a capability's receipt check uses it: the ledger, the host and blob store to fetch
    a receipt's tensors from, the torch executor, and the model dir to replay in (its own model, or one it
    fetched by content hash from ``holders``; None when it has none)."""

    @property
    def ledger(self) -> LedgerReader: ...

    @property
    def host(self) -> Host: ...

    @property
    def blobs(self) -> BlobStore: ...

    @property
    def executor(self) -> Executor: ...

    async def model_dir_for(self, model_id: bytes, holders: Iterable[bytes]) -> Path | None: ...


class ReceiptChecker(Protocol):
    """A capability's committee check of one kind of receipt: ``await check(member, receipt)`` returns a
    :class:`~node.duty.verdict.CheckResult` (VALID / INVALID / ABSTAIN and the distance in the check's own unit,
    ``inf`` when there is none). It may raise; the member then abstains. The capability's package owns it and its
    caches (``node.market.check.TrainingCheck``, ``node.training.replay.RunChecks``) and registers it in its record
    (:class:`node.duty.capability.Capability`); :class:`node.verify.member.CommitteeMember` imports no capability."""

    def __call__(self, member: Member, receipt: Any, /) -> Awaitable[CheckResult]: ...


__all__ = ["Executor", "Host", "Ledger", "LedgerReader", "Member", "ReceiptChecker", "Submitter"]
