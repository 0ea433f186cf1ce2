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

CAPABILITIES: tuple[Capability, ...] = (
    MARKET,  # fine-tune jobs (node.market)
    TRAINING,  # DiLoCo training runs (node.training)
    BATCH,  # batch jobs checked by majority vote (node.batch)
    SETTLE,  # settlement by tabs and epoch batches (node.settle)
    DISPUTES,  # a requester's disputes of receipts it caught (node.disputes)
)


def check_capabilities(caps: tuple[Capability, ...]) -> None:
    """The checks at import of the tuple (the Cosmos SDK's ``assertNoForgottenModules``, node side).

    Raises:
        ValueError: two records share a name or a command, or a record's ledger module is not in the ledger's
            module tuple.
    """
    names = [c.name for c in caps]
    if len(set(names)) != len(names):
        raise ValueError(f"two capabilities share a name: {names}")
    commands = [cmd.name for c in caps for cmd in c.commands]
    if len(set(commands)) != len(commands):
        raise ValueError(f"two capabilities add the same command: {commands}")
    for c in caps:
        for m in c.ledger:
            if m not in MODULES:
                raise ValueError(f"capability {c.name!r}: its ledger module {m.name!r} is not in ledger MODULES")


check_capabilities(CAPABILITIES)

__all__ = ["CAPABILITIES", "check_capabilities"]
