"""The capabilities a node runs, one record each (issue 38): the tuple that ``node.runtime.Node``, the API app
(:func:`node.api.app.create_app`) and the ``node`` command (:mod:`node.cli`) iterate.

Each record (:class:`node.duty.capability.Capability`) is its package's ``CAPABILITY``: its ledger modules, what
it runs in a node, its committee checks, its API router, its ``node`` sub-commands, its settings and its ``node
start`` flags. Adding a capability is one package and one line here (and its settings as a base of
``node.config.NodeConfig``, its ledger modules in :data:`node.ledger.core.modules.EXTENSIONS`). The order is the
order their services start in (after the committee member), their routers mount and their commands are listed.

The node's base is not a capability record: serving spans and generating (:mod:`node.inference`) and checking
receipts as a committee member (:mod:`node.verify`) are what every node is, built by the runtime itself; the
inference receipt's check is the member's own.
"""

from __future__ import annotations

from .batch.capability import CAPABILITY as BATCH
from .disputes.capability import CAPABILITY as DISPUTES
from .duty.capability import Capability
from .ledger.core.modules import MODULES
from .market.capability import CAPABILITY as MARKET
from .settle.capability import CAPABILITY as SETTLE
from .training.capability import CAPABILITY as TRAINING

# The ledger modules of the node's base (accounts and bonds, inference receipts and committees, the receipt history,
# validators), which no capability record owns; every other module in MODULES must be some record's.
BASE_MODULES = ("bank", "receipts", "history", "staking")

CAPABILITIES: tuple[Capability, ...] = (
    MARKET,  # fine-tune jobs (node.market)
    TRAINING,  # DiLoCo training runs (node.training)
    BATCH,  # batch jobs checked by majority vote (node.batch)
    SETTLE,  # settlement by tabs and epoch batches (node.settle)
    DISPUTES,  # a requester's disputes of receipts it caught (node.disputes)
)


def check_capabilities(caps: tuple[Capability, ...], base: tuple[str, ...] = BASE_MODULES) -> None:
    """The checks at import of the tuple (the Cosmos SDK's ``assertNoForgottenModules``, node side).

    Raises:
        ValueError: two records share a name, a command or a test cheat, a record's fault help leaves one of its
            cheats unexplained, a record's ledger module is not in the ledger's module tuple, or a ledger module
            is neither a record's nor one of the node's base (``base``: a module added with no record).
    """
    names = [c.name for c in caps]
    if len(set(names)) != len(names):
        raise ValueError(f"two capabilities share a name: {names}")
    faults = [f for c in caps for f in c.faults]
    if len(set(faults)) != len(faults):
        raise ValueError(f"two capabilities name the same test cheat: {faults}")
    for c in caps:
        missing = [f for f in c.faults if f"'{f}'" not in c.fault_help]
        if missing:
            raise ValueError(f"capability {c.name!r}: its fault_help does not explain {missing}")
    commands = [cmd.name for c in caps for cmd in c.commands]
    if len(set(commands)) != len(commands):
        raise ValueError(f"two capabilities add the same command: {commands}")
    for c in caps:
        for m in c.ledger:
            if m not in MODULES:
                raise ValueError(f"capability {c.name!r}: its ledger module {m.name!r} is not in ledger MODULES")
    owned = {m.name for c in caps for m in c.ledger} | set(base)
    forgotten = [m.name for m in MODULES if m.name not in owned]
    if forgotten:
        raise ValueError(f"ledger modules with no capability record: {forgotten} (add the record to CAPABILITIES, "
                         "or the module to BASE_MODULES when the node's base runs it)")


check_capabilities(CAPABILITIES)

__all__ = ["BASE_MODULES", "CAPABILITIES", "check_capabilities"]
