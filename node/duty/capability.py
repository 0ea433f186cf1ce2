"""One record per capability (issue 38): what a node's paid work adds to the node, declared by its own package.

A capability (fine-tune jobs, training runs, batch jobs, settlement by tabs) is a package under ``node/`` that
exports one :class:`Capability`: its ledger modules (already in the ledger's own tuple,
:data:`node.ledger.core.modules.MODULES`), what it runs in a node (:attr:`Capability.build`: its services and the
libp2p protocols it answers), its committee checks, its HTTP router, its ``node`` sub-commands, its part of the
node's settings and its ``node start`` flags. The tuple of records (:data:`node.capabilities.CAPABILITIES`) is what
``runtime.Node``, the API app and the CLI iterate: adding a capability is one package and one line there (the
Cosmos SDK's ``BasicManager``, which registers each module's codecs, routes and CLI commands).

The record imports nothing of the node above this layer: fields are callables and Protocols, so every capability
can build its own without importing another.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from ..ledger.core.module import LedgerModule
from ..ledger.core.txbase import Tx
from ..p2p.streams import StreamHandler
from .parts import NodeParts, Service
from .seams import ReceiptChecker

if TYPE_CHECKING:
    from fastapi import APIRouter

S = TypeVar("S")


class AddParser(Protocol):
    """Adds a capability's sub-command to ``node``'s sub-parsers (``data_dir``: the default ``--data-dir``)."""

    def __call__(self, sub: argparse._SubParsersAction[argparse.ArgumentParser], data_dir: Path, /) -> None: ...


class Command(NamedTuple):
    """A ``node <name>`` sub-command: ``add(sub, default data dir)`` builds its parser, ``run(args)`` runs it
    (argparse's ``set_defaults(func=run)``)."""

    name: str
    add: AddParser
    run: Callable[[argparse.Namespace], Any]


def _no_close() -> None:
    return None


@dataclass(frozen=True)
class Built:
    """What a capability runs in one node: its long-running services, started in the node's nursery in order after
    the committee member; the libp2p protocols it answers (protocol id -> stream handler); the objects the node and
    the API may reach by type (``Node.service``: a store, a book, a gate); and what to close when the node stops
    (a LevelDB it opened)."""

    services: tuple[Service, ...] = ()
    handlers: Mapping[str, StreamHandler] = field(default_factory=dict)
    parts: tuple[object, ...] = ()
    close: Callable[[], None] = _no_close


def _nothing(_parts: NodeParts) -> Built:
    return Built()


@dataclass(frozen=True)
class StartOptions:
    """A capability's ``node start`` flags: ``add(parser)`` adds them; ``settings(args)`` returns its settings
    (:attr:`Capability.settings`) from the parsed flags.

    ``settings`` raises ValueError with a message for the user when the flags do not go together."""

    add: Callable[[argparse.ArgumentParser], None]
    settings: Callable[[argparse.Namespace], Any]


@dataclass(frozen=True)
class Capability:
    """One capability's record (module docstring).

    Attributes:
        name: its name (unique; the package's).
        ledger: its ledger modules (each in :data:`node.ledger.core.modules.MODULES`; checked at import by
            :mod:`node.capabilities`).
        build: ``build(parts)`` -> :class:`Built` (no model is loaded, no torch imported here).
        checkers: ``checkers()`` -> {receipt type: its committee check}, handed to the committee member.
        router: ``router()`` -> its FastAPI router (mounted with the API's error responses), or None; a callable,
            so that ``node --help`` imports no FastAPI.
        commands: its ``node`` sub-commands.
        settings: the dataclass of its settings (a base of ``node.config.NodeConfig``), or None.
        start: its ``node start`` flags, or None.
        faults: its test cheats, the names ``node start --fault`` accepts for it (devnet and test chains only;
            unique across the node, checked at import by :mod:`node.capabilities`).
        fault_help: one sentence per cheat for ``node start --help`` (each name in ``faults`` quoted in it).
    """

    name: str
    ledger: tuple[LedgerModule, ...] = ()
    build: Callable[[NodeParts], Built] = _nothing
    checkers: Callable[[], Mapping[type[Tx], ReceiptChecker]] | None = None
    router: Callable[[], APIRouter] | None = None
    commands: tuple[Command, ...] = ()
    settings: type | None = None
    start: StartOptions | None = None
    faults: tuple[str, ...] = ()
    fault_help: str = ""


def settings_of(config: object, kind: type[S]) -> S:
    """``config`` (the node's settings) as the capability settings ``kind`` (a part of ``NodeConfig``).

    Raises:
        TypeError: ``config`` does not have that part (a capability missing from ``NodeConfig``'s bases).
    """
    if not isinstance(config, kind):
        raise TypeError(f"the node's settings have no {kind.__name__} part")
    return config


__all__ = ["AddParser", "Built", "Capability", "Command", "StartOptions", "settings_of"]
