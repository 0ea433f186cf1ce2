"""The module tuple: the ledger's modules, registered once each (the Cosmos SDK's module manager, in small).

:data:`MODULES` = the bank, the receipts, then :data:`EXTENSIONS` (jobs, runs, batches, history, staking,
disputes, tabs). The tuple is at once
  * the transaction registry: :data:`node.ledger.core.tx.TX_KINDS` is every module's kinds in the tuple's order,
    derived here (no kind is registered by an import-time write);
  * the dispatch: :data:`MODULE_OF` maps a transaction's type to its module, built once;
    :func:`node.ledger.core.state.apply_tx` looks a transaction up by ``type(tx)``;
  * the end-block order: :func:`node.ledger.core.state.end_block` runs each module's ``end_block`` in the tuple's
    order. The state root depends on it: the receipts' sampling, settlement and escalation, then jobs, runs,
    batches, the receipt history's retirement, and the validator set's shift (the order before modules);
  * the tables: each module's maps and sets (:mod:`node.ledger.core.records`, in the snapshot's table order);
  * the receipt rules: the receipts module settles every module's receipts by its
    :class:`~node.ledger.core.module.ReceiptKind` and asks each extension's ``forces_check`` (a dispute);
  * the unbond rules: the bank asks the receipts and each extension, in order, whether a worker holds open work;
  * the store keys: :data:`STORE_KEYS` (table -> key), from which the state tree's per-table tags
    (:mod:`node.ledger.core.tree`), LevelDB's prefixes (:mod:`node.ledger.statedb`) and the state snapshot's
    table order (:mod:`node.ledger.snapshot`) are derived;
  * the mempool's work kinds: :data:`WORK_KINDS`, every module's ``work_txs`` (:mod:`node.ledger.mempool_policy`);
  * liveness: :func:`node.ledger.core.liveness.height_need` asks each module's ``height_need`` in order;
  * the genesis parameters: each module's ``params`` part is checked here to be one of
    :data:`node.ledger.core.genesis.PARTS`, and every part to be a module's or the core's.

The bank and the receipts are built from the extensions here, as a Cosmos app wires its keepers: they import no
capability. Adding a capability: a package under ``node/ledger/core/`` that builds a
:class:`~node.ledger.core.module.Module` named ``MODULE``, and one line in :data:`EXTENSIONS`
(``docs/architecture.md``, "How to add a capability").
"""

from __future__ import annotations

from typing import Any

from . import bank, batch, disputes, history, jobs, runs, staking, tabs
from .genesis import PARTS
from .module import LedgerModule, ReceiptKind
from .params import CORE_PART, FETCH_PART, IDLE_PART
from .receipts import Receipts
from .txbase import Tx

# The modules built on the bank and the receipts, in end-block order: one line each.
EXTENSIONS: tuple[LedgerModule, ...] = (
    jobs.MODULE,  # fine-tune jobs: JobPost ... TrainReceipt (node.ledger.core.jobs)
    runs.MODULE,  # DiLoCo training runs (node.ledger.core.runs)
    batch.MODULE,  # batch jobs checked by majority vote (node.ledger.core.batch)
    history.MODULE,  # final receipts past the retention window leave the hot state (node.ledger.core.history)
    staking.MODULE,  # validator joins and leaves, evidence; the set moves one height on (node.ledger.core.staking)
    disputes.MODULE,  # a requester forces a committee on a receipt (node.ledger.core.disputes)
    tabs.MODULE,  # tabs and epoch batches: settlement per epoch, not per receipt (node.ledger.core.tabs)
)
RECEIPTS = Receipts(EXTENSIONS)  # every receipt's sampling and settlement, by its module's ReceiptKind
MODULES: tuple[LedgerModule, ...] = (
    bank.module(blockers=(RECEIPTS, *EXTENSIONS)),  # transfers, bonds; unbonds unless a module holds open work
    RECEIPTS,  # inference receipts and votes (node.ledger.core.receipts)
    *EXTENSIONS,
)


def _registry(modules: tuple[LedgerModule, ...]) -> tuple[tuple[type[Tx], ...], dict[type[Tx], LedgerModule],
                                                         dict[type[Tx], ReceiptKind]]:
    """Every kind in registry order, each module kind's module, each module receipt type's rules (the checks
    of the Cosmos SDK's ``assertNoForgottenModules``, at import).

    Raises:
        ValueError: two kinds share a name, a type is registered twice, two modules share a name or a table, a
            table has no store key (or a key names no table of its module), two tables share a key, a work kind
            is not its module's, or a module's parameters are not a part of ``Params``.
    """
    kinds: list[type[Tx]] = []
    module_of: dict[type[Tx], LedgerModule] = {}
    receipt_kinds: dict[type[Tx], ReceiptKind] = {}
    names: set[str] = set()
    tables: set[str] = set()
    for m in modules:
        if m.name in names:
            raise ValueError(f"two modules named {m.name!r}")
        names.add(m.name)
        for t in (*m.maps, *m.sets):
            if t in tables:
                raise ValueError(f"table {t!r} is declared twice")
            tables.add(t)
        if set(m.store_keys) != {*m.maps, *m.sets}:
            raise ValueError(f"module {m.name!r}: store keys for {sorted(m.store_keys)}, tables "
                             f"{sorted({*m.maps, *m.sets})}: one key per table")
        if not set(m.work_txs) <= set(m.txs):
            raise ValueError(f"module {m.name!r}: a work kind that is not one of its kinds")
        if m.params is not None and m.params not in PARTS:
            raise ValueError(f"module {m.name!r}: its parameters {m.params.fields.__name__} are not a part of Params")
        for cls in m.txs:
            if cls in module_of:
                raise ValueError(f"transaction type {cls.__name__} is registered twice")
            module_of[cls] = m
            kinds.append(cls)
        receipt_kinds.update(m.receipt_kinds)
    if len({c.KIND for c in kinds}) != len(kinds):
        raise ValueError("two transaction kinds share a name")
    keys = [k for m in modules for k in m.store_keys.values()]
    if len(set(keys)) != len(keys) or not all(1 <= len(k) <= 4 and b"/" not in k for k in keys):
        raise ValueError("store keys must be 1 to 4 bytes without '/', one per table")
    owned = {m.params for m in modules if m.params is not None}
    if set(PARTS) - owned - set(CORE_PARTS):
        raise ValueError("parts of Params no module declares: "
                         f"{sorted(p.fields.__name__ for p in set(PARTS) - owned - set(CORE_PARTS))}")
    return tuple(kinds), module_of, receipt_kinds


CORE_PARTS = (CORE_PART, IDLE_PART, FETCH_PART)  # the parameters of the core (bank, receipts, consensus)
KINDS, MODULE_OF, RECEIPT_KINDS = _registry(MODULES)
MODULE_MAPS: dict[str, Any] = {n: v for m in MODULES for n, v in m.maps.items()}
MODULE_SETS: tuple[str, ...] = tuple(n for m in MODULES for n in m.sets)
STORE_KEYS: dict[str, bytes] = {t: k for m in MODULES for t, k in m.store_keys.items()}  # table -> store key
WORK_KINDS: frozenset[str] = frozenset(t.KIND for m in MODULES for t in m.work_txs)


def module_of(tx_type: type[Tx]) -> LedgerModule | None:
    """The module of a transaction type (a subclass of a registered kind: its nearest registered base), or None
    for a type no module registered."""
    m = MODULE_OF.get(tx_type)
    if m is None:
        m = next((MODULE_OF[c] for c in tx_type.__mro__ if c in MODULE_OF), None)
    return m


__all__ = ["CORE_PARTS", "EXTENSIONS", "KINDS", "MODULES", "MODULE_MAPS", "MODULE_OF", "MODULE_SETS", "RECEIPTS",
           "RECEIPT_KINDS", "STORE_KEYS", "WORK_KINDS", "module_of"]
