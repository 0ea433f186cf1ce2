"""The narrow state view: what a capability module reads and writes of the ledger state (a ``typing.Protocol``).

Every capability's state machine (:mod:`node.ledger.core.jobs`, :mod:`~node.ledger.core.runs`,
:mod:`~node.ledger.core.batch`, :mod:`~node.ledger.core.valset`, the dispute package...) types its state argument
as :class:`StateView`, never as :class:`node.ledger.core.state.State`, so no capability imports the state and the
state imports no capability: the module tuple (:mod:`node.ledger.core.modules`) joins them. This is the Cosmos
SDK's ``x/*/types/expected_keepers.go`` pattern: a module names the narrow interface it needs of the rest.

:class:`node.ledger.core.state.State` satisfies it (checked by mypy where the state is handed to a module). This
module imports nothing of a capability: only the core's own rows, tables and parameters.
"""

from __future__ import annotations

from typing import Any, Protocol

from .genesis import Params
from .kv import OrderedSet, Table
from .rows import Account


class StateView(Protocol):
    """A working copy of the ledger state as a module sees it while a block is applied (all amounts in base
    units, heights in blocks). Writes go to the copy; the caller's state is untouched until the block commits.

    ``tables`` holds every table by name (:data:`node.ledger.core.records.MAPS` and ``SETS``): a module reads and
    writes its own tables there (the ones its :class:`node.ledger.core.module.LedgerModule` declares), its sets
    through :meth:`ordered`, each by the typed accessors it gives (``jobs_of``, ``open_jobs``, ``runs_of``...).
    The named tables below are the core's alone: the bank's and the receipts module's.
    """

    params: Params
    height: int  # the height of the last applied block (the block being applied is height + 1)
    chain_id: str  # the signing domain (node.ledger.core.domain)
    validators: tuple[bytes, ...]  # the genesis validators
    tables: dict[str, Table[Any, Any]]
    archived: list[Any]  # history appends of the block applied to this copy

    @property
    def accounts(self) -> Table[bytes, Account]: ...

    @property
    def receipts(self) -> Table[Any, Any]: ...  # id -> ReceiptRecord (its receipt of any receipt kind)

    @property
    def sessions(self) -> Table[bytes, bytes]: ...  # H(worker ‖ session id) -> receipt id

    @property
    def open_receipts(self) -> OrderedSet[bytes]: ...

    @property
    def min_validator_bond(self) -> int: ...

    def ordered(self, name: str) -> OrderedSet[bytes]:
        """The insertion-ordered set table ``name`` (one of a module's ``sets``), numbered from the state's
        counter; a module reaches its own sets through it (e.g. :func:`node.ledger.core.jobstate.open_jobs`).

        Raises:
            KeyError: no set table of that name.
        """
        ...

    def account(self, a: bytes) -> Account:
        """``a``'s account (an empty one when it holds nothing)."""
        ...

    def bond_of(self, account: bytes) -> int:
        """``account``'s bond in base units."""
        ...

    def eligible(self) -> list[bytes]:
        """Accounts bonded with at least ``min_bond``: workers and committee members."""
        ...


__all__ = ["StateView"]
