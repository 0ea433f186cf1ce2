"""The module tuple: the ledger's capabilities, registered once each (the Cosmos SDK's module manager, in small).

:data:`MODULES` is at once
  * the transaction registry: :data:`node.ledger.core.tx.TX_KINDS` is the core's own kinds
    (:data:`node.ledger.core.txbase.CORE_TXS`: transfers, bonds, unbonds, inference receipts, votes, evidence)
    followed by each module's kinds, in the tuple's order;
  * the dispatch: :data:`MODULE_OF` maps a transaction's type to its module, built once here;
    :func:`node.ledger.core.state.apply_tx` looks a transaction up by ``type(tx)``;
  * the end-block order: after the core's receipt work (sampling, settlement, escalation), each module's
    ``end_block`` runs in the tuple's order (:func:`node.ledger.core.state.end_block`). The state root depends on
    this order: jobs, runs, batches, the receipt history's retirement, then the validator set's shift;
  * the tables: each module's maps and sets join the core's (:mod:`node.ledger.core.records`);
  * the receipt rules: :data:`RECEIPT_KINDS` maps each module receipt type to its
    :class:`~node.ledger.core.module.ReceiptKind`;
  * what blocks an unbond and what forces a committee: asked of every module, in the tuple's order.

Adding a capability: a package (or module) under ``node/ledger/core/`` that builds a
:class:`~node.ledger.core.module.Module` named ``MODULE``, and one line in :data:`MODULES` (``docs/architecture.md``,
"How to add a capability").
"""

from __future__ import annotations

from typing import Any

from . import batch, disputes, history, jobs, runs, staking
from .module import LedgerModule, ReceiptKind
from .txbase import CORE_TXS, Tx

MODULES: tuple[LedgerModule, ...] = (
    jobs.MODULE,  # fine-tune jobs: JobPost ... TrainReceipt (node.ledger.core.jobs)
    runs.MODULE,  # DiLoCo training runs (node.ledger.core.runs)
    batch.MODULE,  # batch jobs checked by majority vote (node.ledger.core.batch)
    history.MODULE,  # final receipts past the retention window leave the hot state (node.ledger.core.history)
    staking.MODULE,  # validator joins and leaves; the set moves one height on (node.ledger.core.staking)
    disputes.MODULE,  # a requester forces a committee on a receipt (node.ledger.core.disputes)
)


def _registry(modules: tuple[LedgerModule, ...]) -> tuple[tuple[type[Tx], ...], dict[type[Tx], LedgerModule],
                                                         dict[type[Tx], ReceiptKind]]:
    """Every kind in registry order, each module kind's module, each module receipt type's rules.

    Raises:
        ValueError: two kinds share a name, a type is registered twice, or two modules share a name or a table.
    """
    kinds: list[type[Tx]] = list(CORE_TXS)
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
        for cls in m.txs:
            if cls in module_of or cls in CORE_TXS:
                raise ValueError(f"transaction type {cls.__name__} is registered twice")
            module_of[cls] = m
            kinds.append(cls)
        receipt_kinds.update(m.receipt_kinds)
    if len({c.KIND for c in kinds}) != len(kinds):
        raise ValueError("two transaction kinds share a name")
    return tuple(kinds), module_of, receipt_kinds


KINDS, MODULE_OF, RECEIPT_KINDS = _registry(MODULES)
MODULE_MAPS: dict[str, Any] = {n: v for m in MODULES for n, v in m.maps.items()}
MODULE_SETS: tuple[str, ...] = tuple(n for m in MODULES for n in m.sets)


def module_of(tx_type: type[Tx]) -> LedgerModule | None:
    """The module of a transaction type (a subclass of a registered kind: its nearest registered base), or None
    for the core's own kinds."""
    m = MODULE_OF.get(tx_type)
    if m is None:
        m = next((MODULE_OF[c] for c in tx_type.__mro__ if c in MODULE_OF), None)
    return m


__all__ = ["KINDS", "MODULES", "MODULE_MAPS", "MODULE_OF", "MODULE_SETS", "RECEIPT_KINDS", "module_of"]
