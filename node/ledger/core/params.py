"""The genesis parameters of the ledger's core, and what every module's parameters are built on.

A chain's :class:`node.ledger.core.genesis.Params` is one frozen dataclass composed of the core's parameters
(:class:`CoreParams`: blocks, prices, sampling, committees, bonds and windows; :class:`IdleParams`;
:class:`FetchParams`) and each ledger module's own (a module declares its dataclass as ``params``, e.g.
:class:`node.ledger.core.jobparams.JobParams`), so every field is read as ``params.<name>`` and type-checked. Each
part validates its own fields (its :class:`ParamPart`'s ``check``, given the whole parameter set: some bounds relate
a module's field to a core one). All values are integers: amounts in base units, probabilities in ppm, windows in
blocks, times in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .sampling import PPM

MAX_HEARTBEAT_MS = 3_600_000  # the longest heartbeat_ms a genesis may set (1 hour)


class GenesisError(ValueError):
    """A genesis file that is malformed or whose parameters are unsafe."""


@dataclass(frozen=True)
class ParamPart:
    """One part of the chain's parameters: its frozen dataclass of integer fields (a base of
    :class:`node.ledger.core.genesis.Params`), the names among them left out of the genesis hash and document
    when 0, and its own bounds: ``check(params)``, given the whole parameter set (some bounds relate a part's field
    to a core one), raises :class:`GenesisError` (None: no bound beyond a non-negative integer)."""

    fields: type
    optional: frozenset[str] = frozenset()
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class CoreParams:
    """The core's parameters: blocks, receipt prices, sampling, committees, slashing, bonds, windows."""

    block_time_ms: int = 500
    price_per_token_block: int = 1_000_000
    max_receipt_price: int = 5_000_000_000
    sample_base_ppm: int = PPM
    sample_floor_ppm: int = PPM
    adapt_step: int = 10
    committee_size: int = 2
    max_rounds: int = 3
    committee_fee_bps: int = 1000
    slash_amount: int = 100_000_000_000
    min_bond: int = 10_000_000_000
    challenge_window: int = 4
    verdict_timeout: int = 120
    receipt_max_age: int = 10_000


def check_core_params(p: CoreParams) -> None:
    """Raise :class:`GenesisError` for unsafe core parameters: with sampling floor ``p`` and slash ``S``, a
    cheater's expected loss ``p · S`` must exceed its expected gain ``(1 − p) · G`` on a receipt worth at most
    ``G = max_receipt_price`` (DESIGN.md, Verification §4)."""
    if not 0 < p.sample_floor_ppm <= p.sample_base_ppm <= PPM:
        raise GenesisError("need 0 < sample_floor_ppm <= sample_base_ppm <= 1e6")
    if p.committee_size < 1 or p.committee_fee_bps > 10_000 or p.block_time_ms < 10:
        raise GenesisError("committee_size >= 1, committee_fee_bps <= 10000, block_time_ms >= 10")
    f, s, g = p.sample_floor_ppm, p.slash_amount, p.max_receipt_price
    if f * s <= (PPM - f) * g:
        raise GenesisError(
            f"cheating is profitable: p·S = {f * s / PPM:.0f} <= (1-p)·G = {(PPM - f) * g / PPM:.0f} "
            "base units; raise slash_amount or sample_floor_ppm, or lower max_receipt_price")
    if p.min_bond < 1:
        raise GenesisError("min_bond must be positive")


CORE_PART = ParamPart(CoreParams, frozenset(), check_core_params)


class _Timed(Protocol):
    @property
    def block_time_ms(self) -> int: ...

    @property
    def heartbeat_ms(self) -> int: ...


@dataclass(frozen=True)
class IdleParams:
    """Quiet when idle (:mod:`node.ledger.core.liveness`): with nothing to include and nothing in the state that
    moves on with heights, the next block comes ``heartbeat_ms`` after the last one instead of ``block_time_ms``
    (Tendermint's ``create_empty_blocks_interval``). 0, the value of every genesis written before it existed: a
    block every ``block_time_ms``, as before; 0 is left out of the genesis hash and document, so those chains keep
    their hash."""

    heartbeat_ms: int = 0


def check_idle_params(p: _Timed) -> None:
    """Raises :class:`GenesisError` for a heartbeat outside ``[block_time_ms, 1 h]`` (0 aside)."""
    if p.heartbeat_ms and not p.block_time_ms <= p.heartbeat_ms <= MAX_HEARTBEAT_MS:
        raise GenesisError(f"heartbeat_ms must be 0 (a block every block_time_ms) or between block_time_ms "
                           f"({p.block_time_ms}) and {MAX_HEARTBEAT_MS} (1 h: a follower that sees no header "
                           "for longer cannot tell a quiet chain from a halted one)")


IDLE_PART = ParamPart(IdleParams, frozenset({"heartbeat_ms"}), check_idle_params)


@dataclass(frozen=True)
class FetchParams:
    """Bounded model fetches (:mod:`node.verify.blockfetch`): a committee member drawn for a receipt of a model it
    does not hold fetches that model only when at least ``min_model_servers`` distinct bonded peers announce it in
    the swarm; otherwise it abstains without downloading anything. 0 means 1 (a model served by one bonded server
    stays verifiable); left out of the genesis hash and document when 0."""

    min_model_servers: int = 0

    def model_servers(self) -> int:
        """Bonded servers that must announce a model before a committee member fetches it (``min_model_servers``,
        0 meaning 1)."""
        return self.min_model_servers or 1


def check_fetch_params(p: FetchParams) -> None:
    """Raises :class:`GenesisError` for more than 1,000 servers."""
    if p.min_model_servers > 1_000:
        raise GenesisError("min_model_servers must be 0 (meaning 1) or in 1..1000 bonded servers")


FETCH_PART = ParamPart(FetchParams, frozenset({"min_model_servers"}), check_fetch_params)

__all__ = ["CORE_PART", "FETCH_PART", "IDLE_PART", "MAX_HEARTBEAT_MS", "CoreParams", "FetchParams", "GenesisError",
           "IdleParams", "ParamPart", "check_core_params", "check_fetch_params", "check_idle_params"]
