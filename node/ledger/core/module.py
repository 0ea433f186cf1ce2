"""What a ledger module is: one registration per capability (the Cosmos SDK's module manager, in small).

A :class:`LedgerModule` names its transaction kinds (and which of them are a worker's work, for the mempool), the
state tables it owns and their store keys, its genesis parameters, how it applies one of its transactions, what it
does at the end of every block, why the chain needs another height for it (quiet when idle), and what about it
blocks an unbond. A module whose
transactions are receipts (checked by sampled committees, paid from escrow) also gives a :class:`ReceiptKind`
per receipt type: how it is sampled, who is paid on a verdict, and what happens when it is final.

The tuple of modules (:data:`node.ledger.core.modules.MODULES`) is at once the transaction registry
(:data:`node.ledger.core.tx.TX_KINDS`), the dispatch (type → module) and the end-block order.
:class:`Module` is the one implementation used in the core: a frozen record of a module's parts.

Modules see the state only through :class:`node.ledger.core.view.StateView`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .params import ParamPart
from .rows import ReceiptRecord, evolve
from .txbase import Tx, Verdict, _check
from .view import StateView

Payouts = list[tuple[bytes, int]]  # (account, base units) credited when a receipt is final


def ident(x: Any) -> Any:
    """The identity: the encode or decode of a table whose values are stored as they are (bytes, ints)."""
    return x


class ReceiptKind(Protocol):
    """The rules of one receipt type beyond the core's (:mod:`node.ledger.core.state`: escrow at inclusion,
    sampling with the block hash as beacon, committees, votes, escalation). All amounts in base units."""

    def sampled_later(self, rec: ReceiptRecord) -> bool:
        """True while a pending receipt is not to be sampled at the end of the block after its inclusion (its
        module samples it later, e.g. a round receipt when its round's commit phase closes)."""
        ...

    def sample_ppm(self, s: StateView, r: Any, ppm: int) -> int:
        """The sampling probability (parts per million) of ``r``, given the worker's adaptive rate ``ppm``."""
        ...

    def split(self, s: StateView, r: Any, verdict: Verdict, payouts: Payouts) -> tuple[Payouts, int]:
        """Who is paid on ``verdict``: the core's ``payouts`` (worker and voters on VALID; requester, voters and
        treasury on INVALID) as this kind pays them, and the base units its module still owes the worker."""
        ...

    def finalized(self, s: StateView, r: Any, verdict: Verdict, owed: int, height: int) -> None:
        """``r`` reached ``verdict`` at ``height`` (after the payouts were credited)."""
        ...

    def settle_unchecked(self, s: StateView, rec: ReceiptRecord, status: str, height: int) -> bool:
        """``rec`` settles without a verdict (unsampled past its challenge window: ``settled``; no quorum:
        ``unverified``). True when this kind settled it itself; False to let the core pay the worker."""
        ...

    def owner_final(self, s: StateView, r: Any) -> int | None:
        """When a final ``r`` leaves the state (:mod:`node.ledger.core.history`): None when it leaves on its own
        schedule (an inference receipt, by its opened height); else the final height of the job or run it belongs
        to (0 while that is open: it leaves after both)."""
        ...


class LedgerModule(Protocol):
    """One capability's part of the ledger state machine (see the module docstring)."""

    @property
    def name(self) -> str:
        """The module's name (unique in the tuple)."""
        ...

    @property
    def txs(self) -> tuple[type[Tx], ...]:
        """Its transaction kinds, in registry order."""
        ...

    @property
    def maps(self) -> Mapping[str, Any]:
        """The maps it owns: table name -> the record type stored (a dataclass, stored as its fields) or a
        :class:`node.ledger.core.kv.Codec`."""
        ...

    @property
    def sets(self) -> tuple[str, ...]:
        """The insertion-ordered sets it owns (member -> sequence number)."""
        ...

    @property
    def store_keys(self) -> Mapping[str, bytes]:
        """The store key of each table it owns (``maps`` and ``sets``): 1 to 4 bytes, unique in the module tuple.
        A consensus format: the key is hashed into every entry's state-tree key (:mod:`node.ledger.core.tree`)
        and names the table in LevelDB (``S/<key>/``, :mod:`node.ledger.statedb`) and in state snapshots
        (:mod:`node.ledger.snapshot`), so it never changes once a chain uses it."""
        ...

    @property
    def work_txs(self) -> tuple[type[Tx], ...]:
        """Those of its kinds that are a worker's or a committee member's work (receipts, votes, commits,
        reveals): a full mempool evicts other transactions for them, never the other way round
        (:class:`node.ledger.mempool_policy.Priority`)."""
        ...

    @property
    def params(self) -> ParamPart | None:
        """The dataclass of the genesis parameters it owns (a base of
        :class:`node.ledger.core.genesis.Params`, whose ``check_<module>`` method it defines), or None."""
        ...

    def height_need(self, s: StateView) -> str | None:
        """Why the chain needs another block for this module's state to move on (a timeout, a draw or a deadline
        counted in heights), as a short reason, or None when only a transaction can change it
        (:mod:`node.ledger.core.liveness`). Reads ``s`` only; stops at the first reason."""
        ...

    @property
    def receipt_kinds(self) -> Mapping[type[Tx], ReceiptKind]:
        """Its receipt types and their rules (empty when its transactions are not receipts)."""
        ...

    def apply(self, s: StateView, tx: Tx) -> None:
        """Apply one of its transactions to the working copy ``s`` (nonce and signatures already checked).

        Raises:
            InvalidTx: the transaction does not apply; ``s`` is unchanged then.
        """
        ...

    def end_block(self, s: StateView, height: int, block_hash: bytes) -> None:
        """Its work at the end of block ``height`` (hash ``block_hash``: the sampling beacon)."""
        ...

    def unbond_blocker(self, s: StateView, account: bytes, bond_after: int) -> str | None:
        """Why ``account`` may not unbond down to ``bond_after`` base units (open work it holds), or None."""
        ...

    def forces_check(self, s: StateView, receipt_id: bytes, height: int) -> bool:
        """End of block ``height``: True when this module requires a committee on the pending receipt
        ``receipt_id`` now (sampling probability 1), e.g. a requester's dispute."""
        ...

    @property
    def may_force(self) -> bool:
        """Whether :meth:`forces_check` can ever say yes (only those modules are asked, once per pending
        receipt per block)."""
        ...


def _no_end_block(_s: StateView, _height: int, _block_hash: bytes) -> None:
    return None


def _no_blocker(_s: StateView, _account: bytes, _bond_after: int) -> str | None:
    return None


def no_force(_s: StateView, _receipt_id: bytes, _height: int) -> bool:
    return False


def _no_need(_s: StateView) -> str | None:
    return None


def _no_apply(_s: StateView, tx: Tx) -> None:  # pragma: no cover - a module with kinds gives its apply
    raise NotImplementedError(f"no apply for {tx.KIND}")


@dataclass(frozen=True)
class Module:
    """A :class:`LedgerModule` made of its parts (each capability module builds one, named ``MODULE``)."""

    name: str
    txs: tuple[type[Tx], ...] = ()
    maps: Mapping[str, Any] = field(default_factory=dict)
    sets: tuple[str, ...] = ()
    store_keys: Mapping[str, bytes] = field(default_factory=dict)
    work_txs: tuple[type[Tx], ...] = ()
    params: ParamPart | None = None
    receipt_kinds: Mapping[type[Tx], ReceiptKind] = field(default_factory=dict)
    on_apply: Callable[[StateView, Any], None] = _no_apply
    on_end_block: Callable[[StateView, int, bytes], None] = _no_end_block
    on_unbond: Callable[[StateView, bytes, int], str | None] = _no_blocker
    on_force: Callable[[StateView, bytes, int], bool] = no_force
    on_need: Callable[[StateView], str | None] = _no_need

    def apply(self, s: StateView, tx: Tx) -> None:
        self.on_apply(s, tx)

    def end_block(self, s: StateView, height: int, block_hash: bytes) -> None:
        self.on_end_block(s, height, block_hash)

    def unbond_blocker(self, s: StateView, account: bytes, bond_after: int) -> str | None:
        return self.on_unbond(s, account, bond_after)

    def forces_check(self, s: StateView, receipt_id: bytes, height: int) -> bool:
        return self.on_force(s, receipt_id, height)

    def height_need(self, s: StateView) -> str | None:
        return self.on_need(s)

    @property
    def may_force(self) -> bool:
        return self.on_force is not no_force


class PlainReceipt:
    """A :class:`ReceiptKind` with the core's rules alone: sampled at the end of the block after its inclusion at
    the worker's adaptive rate, paid as the core pays, nothing more when final. Subclass to change a part."""

    def sampled_later(self, rec: ReceiptRecord) -> bool:
        return False

    def sample_ppm(self, s: StateView, r: Any, ppm: int) -> int:
        return ppm

    def split(self, s: StateView, r: Any, verdict: Verdict, payouts: Payouts) -> tuple[Payouts, int]:
        return payouts, 0

    def finalized(self, s: StateView, r: Any, verdict: Verdict, owed: int, height: int) -> None:
        return None

    def settle_unchecked(self, s: StateView, rec: ReceiptRecord, status: str, height: int) -> bool:
        return False

    def owner_final(self, s: StateView, r: Any) -> int | None:
        return None


def credit(s: StateView, a: bytes, amount: int) -> None:
    """Add ``amount`` base units to ``a``'s balance."""
    acc = s.account(a)
    s.accounts[a] = evolve(acc, balance=acc.balance + amount)


def admit_receipt(s: StateView, r: Any) -> None:
    """The core's part of including a module's receipt ``r`` (after the module's own checks): refuse a replay
    and an unbonded worker, then record it pending at the height of the block being applied.

    Raises:
        InvalidTx: ``r`` is already on the ledger, or its worker's bond is below ``min_bond``.
    """
    _check(r.id not in s.receipts, "receipt already on the ledger (replay)")
    _check(s.account(r.worker).bond >= s.params.min_bond, "worker is not bonded")
    s.receipts[r.id] = ReceiptRecord(receipt=r, height=s.height + 1)
    s.open_receipts[r.id] = None


__all__ = ["LedgerModule", "Module", "Payouts", "PlainReceipt", "ReceiptKind", "StateView", "admit_receipt", "credit",
           "ident", "no_force"]
