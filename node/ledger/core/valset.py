"""Validators that change: the validator set, its voting power and its commitments (pure).

Model: CometBFT's ``MsgCreateValidator`` and x/staking's EndBlock validator updates. A bonded account with at
least ``min_validator_bond`` base units of bond asks to validate with :class:`ValidatorJoin`; it stops with
:class:`ValidatorLeave`, by unbonding below the minimum, or by being slashed below it. **Voting power is the
bond in base units.** A change made by block ``H`` is effective from height ``H + 2``: as in CometBFT
(``EndBlock`` updates of block H apply at H+2, because header H+1 already names the set that signs H+1 in its
``next_validators_hash``; CometBFT spec, "Validator updates", abci/abci++_methods.md), so every header names the
set that signs it (``validators_hash``) and the one that signs the next height (``next_validators_hash``).

State (table ``validators``): account -> ``(power at height, power at height+1, power at height+2, member)`` for
the state after ``height`` blocks (CometBFT's LastValidators, Validators, NextValidators), ``member`` 1 while the
account wants to validate. At the end of every block (:func:`end_block_validators`) each row moves one height
on, and the new power at height+2 is the bond if the account is a member with at least ``min_validator_bond``
of bond, else 0 (and it stops being a member). A row with nothing left is deleted.

Chains whose genesis leaves ``min_validator_bond`` at 0 keep today's rules: the genesis validators, one vote
each, headers without validator hashes (their stored blocks and hashes are unchanged).

Quorum everywhere (commits, the consensus machine): more than 2/3 of the total power (Tendermint,
arXiv:1807.04938: with total power ``T`` up to ``f = (T − 1) // 3`` may be faulty and a quorum is ``T − f``,
the smallest power ``q`` with ``3q > 2T``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from ...encoding import merkle_root, pack, unpack
from .txbase import SingleSigned, _check

VALSET_TAG = b"tally/valset/v1"


MAX_SLOTS = 1024  # the longest proposer cycle (powers are scaled down to at most this many slots)


def slot_weights(powers: Sequence[int], max_slots: int = MAX_SLOTS) -> list[int]:
    """Proposal slots per validator in one cycle: ``powers`` divided by their gcd; if that sums to more than
    ``max_slots``, scaled to ``max_slots`` by largest remainder (Hamilton's method: ties to the lower index)
    with at least 1 slot each (so the cycle may exceed ``max_slots`` by up to ``len(powers)``).

    Raises:
        ValueError: an empty list or a power below 1.
    """
    if not powers or min(powers) < 1:
        raise ValueError("powers must be a non-empty list of integers >= 1")
    g = 0
    for p in powers:
        g = math.gcd(g, p)
    w = [p // g for p in powers]
    total = sum(w)
    if total <= max_slots:
        return w
    quota = [p * max_slots for p in powers]
    whole = [q // sum(powers) for q in quota]
    rest = max_slots - sum(whole)
    order = sorted(range(len(powers)), key=lambda i: (-(quota[i] % sum(powers)), i))
    for i in order[:rest]:
        whole[i] += 1
    return [max(1, x) for x in whole]


@functools.lru_cache(maxsize=64)  # a few sets are live at once (this height's, the next, a syncing peer's)
def proposer_schedule(members: tuple[tuple[bytes, int], ...]) -> tuple[int, ...]:
    """One cycle of proposers (indexes into ``members``), each validator ``slot_weights`` times, interleaved by
    CometBFT's proposer-priority rule (spec, consensus/proposer-selection.md: every step each priority grows by
    its weight, the highest proposes and loses the total; ties to the lower index = the smaller account). Unlike
    CometBFT the priorities start from zero for every set instead of carrying over a change: the schedule is a
    pure function of the set, which every node and light client computes alike. Memoized per set."""
    w = slot_weights([p for _, p in members])
    total = sum(w)
    prio = [0] * len(w)
    out = []
    for _ in range(total):
        for i, x in enumerate(w):
            prio[i] += x
        best = max(range(len(w)), key=lambda i: (prio[i], -i))
        prio[best] -= total
        out.append(best)
    return tuple(out)


class ValidatorSetError(ValueError):
    """A validator set that is empty, has a non-positive power, or names an account twice."""


@dataclass(frozen=True)
class ValidatorSet:
    """The validators of one height with their voting power (base units of bond, or 1 each on a chain whose
    set is fixed in genesis), sorted by account.

    Raises:
        ValidatorSetError: on construction, for an empty set, a power below 1 or a repeated account.
    """

    members: tuple[tuple[bytes, int], ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise ValidatorSetError("a validator set is never empty")
        accounts = [a for a, _ in self.members]
        if accounts != sorted(set(accounts)):
            raise ValidatorSetError("validators must be sorted and distinct")
        for a, p in self.members:
            if not (isinstance(a, bytes) and len(a) == 32 and isinstance(p, int) and not isinstance(p, bool)
                    and p >= 1):
                raise ValidatorSetError("each validator is a 32-byte account with a power >= 1")

    @classmethod
    def of(cls, powers: Mapping[bytes, int] | Iterable[tuple[bytes, int]]) -> ValidatorSet:
        """A set from ``{account: power}`` (or pairs); members with power 0 are left out."""
        items = powers.items() if isinstance(powers, Mapping) else powers
        return cls(tuple(sorted((bytes(a), int(p)) for a, p in items if p)))

    @classmethod
    def equal(cls, accounts: Iterable[bytes]) -> ValidatorSet:
        """One vote each (a genesis-fixed set)."""
        return cls.of({a: 1 for a in accounts})

    @property
    def accounts(self) -> tuple[bytes, ...]:
        return tuple(a for a, _ in self.members)

    @property
    def powers(self) -> dict[bytes, int]:
        return dict(self.members)

    @property
    def total(self) -> int:
        """Total voting power."""
        return sum(p for _, p in self.members)

    def power(self, account: bytes) -> int:
        return self.powers.get(account, 0)

    def __contains__(self, account: object) -> bool:
        return any(a == account for a, _ in self.members)

    def __len__(self) -> int:
        return len(self.members)

    def has_quorum(self, power: int) -> bool:
        """``power`` is more than 2/3 of the total."""
        return 3 * power > 2 * self.total

    def power_of(self, signers: Iterable[bytes]) -> int:
        """Total power of the distinct members among ``signers`` (non-members count 0)."""
        p = self.powers
        return sum(p.get(a, 0) for a in set(signers))

    def proposer(self, height: int, round_: int) -> bytes:
        """The proposer of ``(height, round)``: slot ``(height + round) mod len(schedule)`` of
        :func:`proposer_schedule`, a cycle in which each validator proposes in proportion to its power. Equal
        powers (every genesis-fixed set) give round-robin over the sorted accounts, ``(height + round) mod n``."""
        schedule = proposer_schedule(self.members)
        return self.members[schedule[(height + round_) % len(schedule)]][0]

    @property
    def hash(self) -> bytes:
        """RFC 9162 Merkle root over the members' ``pack([account, power])`` in account order, under a domain
        leaf (CometBFT's ``ValidatorsHash`` is the Merkle root of the validators' encodings)."""
        return merkle_root([VALSET_TAG] + [pack([a, p]) for a, p in self.members])

    def to_wire(self) -> list[list[Any]]:
        return [[a, p] for a, p in self.members]

    @classmethod
    def from_wire(cls, obj: Any) -> ValidatorSet:
        """Raises :class:`ValidatorSetError` for anything but a list of ``[account, power]``."""
        if not isinstance(obj, list) or not all(isinstance(x, list) and len(x) == 2 for x in obj):
            raise ValidatorSetError("a validator set is a list of [account, power]")
        return cls(tuple((bytes(a), p) for a, p in obj))

    def to_bytes(self) -> bytes:
        return pack(self.to_wire())

    @classmethod
    def from_bytes(cls, raw: bytes) -> ValidatorSet:
        return cls.from_wire(unpack(raw))


# ------------------------------------------------------------------ transactions


@dataclass(frozen=True)
class ValidatorJoin(SingleSigned):
    """Ask to validate from the height after next (CometBFT ``MsgCreateValidator``): the sender must be
    bonded with at least ``min_validator_bond`` base units and not already a member; per-account ``nonce``."""

    chain_id: str
    sender: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/validator-join/v1"
    KIND: ClassVar[str] = "validator_join"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "nonce": "int"}


@dataclass(frozen=True)
class ValidatorLeave(SingleSigned):
    """Stop validating from the height after next (the bond stays; unbond separately); per-account ``nonce``.
    Refused for the last validator."""

    chain_id: str
    sender: bytes
    nonce: int
    sig: bytes = b""

    TAG: ClassVar[bytes] = b"tally/validator-leave/v1"
    KIND: ClassVar[str] = "validator_leave"
    SIGS: ClassVar[tuple[str, ...]] = ("sig",)
    SCHEMA: ClassVar[dict[str, str]] = {"sender": "account", "nonce": "int"}


VALIDATOR_TXS = (ValidatorJoin, ValidatorLeave)


# ------------------------------------------------------------------ state rules


class _Bonds(Protocol):
    """What the rules read of the state (:class:`node.ledger.core.state.State`)."""

    @property
    def tables(self) -> dict[str, Any]: ...

    def bond_of(self, account: bytes) -> int: ...

    @property
    def min_validator_bond(self) -> int: ...


Row = tuple[int, int, int, int]  # (power at height, at height+1, at height+2, member)


def genesis_rows(validators: Iterable[bytes], bonds: Mapping[bytes, int]) -> dict[bytes, Row]:
    """The ``validators`` table of a genesis state: each genesis validator a member with its bond as power."""
    return {a: (bonds.get(a, 0), bonds.get(a, 0), bonds.get(a, 0), 1) for a in validators}


def check_genesis(validators: Iterable[bytes], bonds: Mapping[bytes, int], minimum: int) -> str | None:
    """Why a genesis with validator changes on (``minimum`` > 0) is unsafe, or None: each genesis validator
    needs at least ``minimum`` base units of bond (its power)."""
    short = [a for a in validators if bonds.get(a, 0) < minimum]
    if short:
        return (f"{len(short)} genesis validator(s) have less bond than min_validator_bond ({minimum} base units); "
                "with validator changes on, a validator's power is its bond")
    return None


def set_at(table: Mapping[bytes, Row], which: int) -> ValidatorSet:
    """The set at height (``which`` 0), height+1 (1) or height+2 (2) of the state after ``height`` blocks."""
    return ValidatorSet.of({a: row[which] for a, row in table.items()})


def apply_validator_tx(s: _Bonds, tx: ValidatorJoin | ValidatorLeave) -> None:
    """Apply a :class:`ValidatorJoin` / :class:`ValidatorLeave` to ``s`` (nonce checked by the caller).

    Raises:
        InvalidTx: validator changes are off on this chain, not enough bond, already (or not) a member, the
            last validator leaving. ``s`` is unchanged when raised.
    """
    minimum = s.min_validator_bond
    _check(minimum > 0, "this chain's validator set is fixed in genesis (min_validator_bond is 0)")
    table = s.tables["validators"]
    row: Row = table.get(tx.sender, (0, 0, 0, 0))
    if isinstance(tx, ValidatorJoin):
        bond = s.bond_of(tx.sender)
        _check(bond >= minimum, f"a validator needs a bond of at least {minimum} base units (min_validator_bond), "
                                f"this account has {bond}")
        _check(not row[3], "already a validator (or joining)")
        table[tx.sender] = (*row[:3], 1)
    else:
        _check(bool(row[3]), "not a validator")
        others = [a for a, r in table.items() if r[3] and a != tx.sender]
        _check(bool(others), "the last validator cannot leave")
        table[tx.sender] = (*row[:3], 0)


def leaves_none(s: _Bonds, account: bytes, bond_after: int) -> bool:
    """True when ``account`` bonding down to ``bond_after`` would leave no member of the validator set (an
    unbond that the state refuses)."""
    if s.min_validator_bond <= 0 or bond_after >= s.min_validator_bond:
        return False
    table = s.tables["validators"]
    row = table.get(account)
    if row is None or not row[3]:
        return False
    return not any(r[3] and s.bond_of(a) >= s.min_validator_bond for a, r in table.items() if a != account)


def end_block_validators(s: _Bonds) -> None:
    """Move every row of the ``validators`` table one height on (module docstring): O(rows). If no member
    would be left with power (every validator slashed below the minimum), the set for the height after next
    stays as it was, and its members stay members: a chain cannot lose its last validators by a transition."""
    minimum = s.min_validator_bond
    if minimum <= 0:
        return
    table = s.tables["validators"]
    rows: list[tuple[bytes, Row]] = list(table.items())
    new: dict[bytes, Row] = {}
    for a, (_last, now, nxt, member) in rows:
        bond = s.bond_of(a)
        keep = bool(member) and bond >= minimum
        new[a] = (now, nxt, bond if keep else 0, 1 if keep else 0)
    if not any(r[2] for r in new.values()):
        new = {a: (now, nxt, nxt, member) for a, (_last, now, nxt, member) in rows}
    for a, row in new.items():
        if row == (0, 0, 0, 0):
            del table[a]
        elif row != table[a]:
            table[a] = row


__all__ = [
    "VALIDATOR_TXS",
    "ValidatorJoin",
    "ValidatorLeave",
    "ValidatorSet",
    "ValidatorSetError",
    "apply_validator_tx",
    "check_genesis",
    "end_block_validators",
    "genesis_rows",
    "leaves_none",
    "set_at",
]
