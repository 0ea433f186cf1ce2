"""The staking module: validator joins and leaves, double-signing evidence, and the validator set moving one
height on each block.

The rules are :mod:`node.ledger.core.valset`'s (pure, below the genesis and the blocks, which read validator sets);
this module registers them with the module tuple (:mod:`node.ledger.core.modules`): the kinds
:class:`~node.ledger.core.valset.ValidatorJoin` and :class:`~node.ledger.core.valset.ValidatorLeave`, the
``validators`` table (account -> ``(power at height, at height+1, at height+2, member)``), the end-block shift, and
the unbond it refuses (one that would leave the chain without validators); and
:class:`~node.ledger.core.txbase.Evidence` with its ``evidence`` table (evidence key -> ``(height, slashed)``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .genesis import TREASURY
from .kv import Codec, Table
from .module import Module, credit
from .stakingparams import STAKING_PART
from .txbase import Evidence, _check
from .valset import VALIDATOR_TXS, Row, apply_validator_tx, end_block_validators, leaves_none
from .view import StateView


def evidence_of(s: StateView) -> Table[bytes, tuple[int, int]]:
    """The ``evidence`` table of state ``s``: evidence key (:attr:`Evidence.key`) -> ``(height, slashed base
    units)``, one entry per slashed double-sign."""
    return s.tables["evidence"]


def apply_evidence(s: StateView, e: Evidence) -> None:
    """Slash a validator that signed two different votes of one kind at one height and round: its bond loses
    ``min(bond, slash_amount)`` to the treasury; counted once per :attr:`Evidence.key`.

    Raises:
        InvalidTx: the two values are equal, not a validator, already counted, or from a future height.
    """
    _check(e.value_a != e.value_b, "evidence needs two different values")
    _check(e.validator in s.validators or e.validator in s.tables["validators"], "evidence against a non-validator")
    _check(e.key not in evidence_of(s), "evidence already on the ledger (counted once)")
    _check(e.height <= s.height + 1, "evidence from a future height")
    acc = s.account(e.validator)
    slashed = min(acc.bond, s.params.slash_amount)
    s.accounts[e.validator] = replace(acc, bond=acc.bond - slashed, slashed=acc.slashed + slashed)
    credit(s, TREASURY, slashed)
    evidence_of(s)[e.key] = (s.height + 1, slashed)


def _apply(s: StateView, tx: Any) -> None:
    if isinstance(tx, Evidence):
        apply_evidence(s, tx)
    else:
        apply_validator_tx(s, tx)


def _end_block(s: StateView, _height: int, _block_hash: bytes) -> None:
    end_block_validators(s)


def _unbond_blocker(s: StateView, account: bytes, bond_after: int) -> str | None:
    if leaves_none(s, account, bond_after):
        return "unbonding below min_validator_bond would leave the chain without validators"
    return None


def _row(x: Any) -> Row:
    return (int(x[0]), int(x[1]), int(x[2]), int(x[3]))


def _evidence_row(x: Any) -> tuple[int, int]:
    return (int(x[0]), int(x[1]))


MODULE = Module("staking", txs=(*VALIDATOR_TXS, Evidence),
                maps={"validators": Codec(list, _row),
                      "evidence": Codec(list, _evidence_row)},  # evidence key -> (height, slashed base units)
                store_keys={"validators": b"v", "evidence": b"e"}, work_txs=(Evidence,), params=STAKING_PART,
                on_apply=_apply, on_end_block=_end_block, on_unbond=_unbond_blocker)

__all__ = ["MODULE", "evidence_of"]
