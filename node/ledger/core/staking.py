"""The staking module: validator joins and leaves, and the validator set moving one height on each block.

The rules are :mod:`node.ledger.core.valset`'s (pure, below the genesis and the blocks, which read validator sets);
this module registers them with the module tuple (:mod:`node.ledger.core.modules`): the kinds
:class:`~node.ledger.core.valset.ValidatorJoin` and :class:`~node.ledger.core.valset.ValidatorLeave`, the
``validators`` table (account -> ``(power at height, at height+1, at height+2, member)``), the end-block shift, and
the unbond it refuses (one that would leave the chain without validators).
"""

from __future__ import annotations

from typing import Any

from .kv import Codec
from .module import Module
from .valset import VALIDATOR_TXS, Row, apply_validator_tx, end_block_validators, leaves_none
from .view import StateView


def _apply(s: StateView, tx: Any) -> None:
    apply_validator_tx(s, tx)


def _end_block(s: StateView, _height: int, _block_hash: bytes) -> None:
    end_block_validators(s)


def _unbond_blocker(s: StateView, account: bytes, bond_after: int) -> str | None:
    if leaves_none(s, account, bond_after):
        return "unbonding below min_validator_bond would leave the chain without validators"
    return None


def _row(x: Any) -> Row:
    return (int(x[0]), int(x[1]), int(x[2]), int(x[3]))


MODULE = Module("staking", txs=VALIDATOR_TXS, maps={"validators": Codec(list, _row)}, on_apply=_apply,
                on_end_block=_end_block, on_unbond=_unbond_blocker)

__all__ = ["MODULE"]
