"""The hand-written lists of pyproject's import contracts stay complete (issue 38: "lists by hand" checked).

The layers contract is exhaustive (lint-imports fails on a package missing from it), but an independence contract
and a forbidden contract check only the modules they name: a new capability missing from the independence list, or
a new top-level package missing from the pure core's forbidden list, would pass ``lint-imports`` unchecked.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import node
from node.capabilities import CAPABILITIES

ROOT = Path(__file__).resolve().parents[1]
BASE = ("inference", "verify")  # the node's base: serving, generating and committee checks (no record)
CORE_MAY_IMPORT = {"node.ledger", "node.encoding", "node.keys", "node.msgscan"}  # msgscan: encoding's decoder


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["id"]: c for c in cfg["tool"]["importlinter"]["contracts"]}


def _top_level() -> set[str]:
    return {f"node.{m.name}" for m in pkgutil.iter_modules(node.__path__) if m.name != "__main__"}


def test_every_capability_and_the_base_are_independent():
    listed = set(_contracts()["capabilities"]["modules"])
    expected = {f"node.{c.name}" for c in CAPABILITIES} | {f"node.{b}" for b in BASE}
    assert expected <= _top_level()  # each record's name is its package's
    assert listed == expected


def test_the_pure_core_forbids_every_other_top_level_package():
    forbidden = set(_contracts()["core-leaves"]["forbidden_modules"])
    assert forbidden == _top_level() - CORE_MAY_IMPORT
