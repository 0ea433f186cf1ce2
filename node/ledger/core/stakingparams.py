"""The genesis parameters of validators that change (:mod:`node.ledger.core.staking`,
:mod:`node.ledger.core.valset`)."""

from __future__ import annotations

from dataclasses import dataclass

from .params import ParamPart


@dataclass(frozen=True)
class StakingParams:
    """A bonded account with at least ``min_validator_bond`` base units of bond may join the validator set by a
    transaction, effective two heights later; voting power is the bond. 0: the validator set is fixed in genesis
    with one vote each, as before; left out of the genesis hash and document when 0. The genesis validators'
    own bonds are checked against it with the accounts (:func:`node.ledger.core.genesis.parse_genesis`)."""

    min_validator_bond: int = 0


STAKING_PART = ParamPart(StakingParams, frozenset({"min_validator_bond"}))

__all__ = ["STAKING_PART", "StakingParams"]
