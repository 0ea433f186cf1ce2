"""Genesis documents: chain id, validator set, initial accounts and the parameters they fix.

The devnet genesis is embedded (``genesis/devnet.json``) and uses the well-known devnet keys
(:func:`node.identity.dev_seed`). A node refuses a genesis whose parameters make cheating profitable:
with sampling floor ``p`` and slash ``S``, a cheater's expected loss ``p · S`` must exceed its expected gain
``(1 − p) · G`` on a receipt worth at most ``G = max_receipt_price`` (DESIGN.md, Verification §4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from multiaddr import Multiaddr

from ...encoding import AMOUNT_FORM, H, format_amount, pack, parse_amount
from ...keys import account_from_str, account_to_str
from . import domain as signing_domain
from .batchparams import BATCH_PART, BatchParams
from .historyparams import HISTORY_PART, HistoryParams
from .jobparams import JOB_PART, JobParams
from .params import (
    CORE_PART,
    FETCH_PART,
    IDLE_PART,
    MAX_HEARTBEAT_MS,
    CoreParams,
    FetchParams,
    GenesisError,
    IdleParams,
    ParamPart,
)
from .stakingparams import STAKING_PART, StakingParams
from .tabparams import TAB_PART, TabParams
from .valset import check_genesis as check_genesis_validators

TREASURY = H(b"tally/treasury/v1")  # unspendable account that receives slashed bonds beyond rewards

# The parts of Params, in the order of the genesis document and hash: the core's, then each ledger module's (a
# module names its part as its ``params``; node.ledger.core.modules checks that every part is some module's or the
# core's, and every module's is here). One line per part; a new module's part goes last (its fields are left out
# of the hash when 0, so the chains before it keep theirs). The order is the parameters' order before modules
# declared them, but for min_model_servers, which followed batch_audit_ppm there: only a genesis that sets it and
# one of batch_min_token_price, batch_max_open_items or batch_audit_pay_bps hashes differently.
PARTS: tuple[ParamPart, ...] = (
    CORE_PART,  # blocks, prices, sampling, committees, bonds, windows (node.ledger.core.params)
    JOB_PART,  # the job marketplace (node.ledger.core.jobparams)
    IDLE_PART,  # quiet when idle: heartbeat_ms (node.ledger.core.params)
    HISTORY_PART,  # history that ends: retention_blocks (node.ledger.core.historyparams)
    STAKING_PART,  # validators that change: min_validator_bond (node.ledger.core.stakingparams)
    BATCH_PART,  # batch jobs (node.ledger.core.batchparams)
    FETCH_PART,  # bounded model fetches: min_model_servers (node.ledger.core.params)
    TAB_PART,  # tabs and epoch batches (node.ledger.core.tabparams)
)
OPTIONAL_PARAMS = frozenset(n for part in PARTS for n in part.optional)


@dataclass(frozen=True)
class Params(TabParams, FetchParams, BatchParams, StakingParams, HistoryParams, IdleParams, JobParams, CoreParams):
    """Chain parameters: every part's fields (:data:`PARTS`; a dataclass's fields run from its last base to its
    first, hence the bases in reverse). Amounts in base units; probabilities in ppm; windows in blocks. In a
    genesis file's ``params`` every one is a JSON integer in those units (not the decimal-credit strings of
    account balances); booleans, floats and strings are refused (:meth:`check`)."""

    def heartbeat(self) -> int:
        """The longest gap between two blocks in milliseconds: ``heartbeat_ms``, or ``block_time_ms`` when 0."""
        return self.heartbeat_ms or self.block_time_ms

    def consensus_fields(self) -> dict[str, int]:
        """The parameters as the genesis document and hash carry them: every one, but the optional ones
        (:data:`OPTIONAL_PARAMS`) only when set (a genesis from before they existed keeps its document and hash)."""
        return {k: v for k, v in self.__dict__.items() if not (k in OPTIONAL_PARAMS and v == 0)}

    def check(self) -> None:
        """Raise :class:`GenesisError` for unsafe or nonsensical parameters: each a non-negative integer, then
        each part's own bounds (its ``check``), in :data:`PARTS` order."""
        for name, v in self.__dict__.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise GenesisError(f"parameter {name} must be a non-negative integer")
        for part in PARTS:
            if part.check is not None:
                part.check(self)


assert Params.__mro__[len(PARTS):0:-1] == tuple(p.fields for p in PARTS), "Params' bases: PARTS' fields, reversed"


@dataclass(frozen=True)
class Genesis:
    """A chain's starting point. ``balances`` are ``(account, balance, bond)`` in base units; ``genesis_time_ms``
    is milliseconds since the Unix epoch; ``bootstrap`` lists multiaddrs (each ending in ``/p2p/<peer ID>``) that
    a node dials at start when ``node start`` is given no ``--bootstrap``.

    :attr:`hash` covers the chain id, genesis time, validators, balances and parameters — the chain's consensus
    identity — and **not** ``bootstrap``: bootstrap addresses are hints for finding peers, which change as
    machines come and go, so a genesis file with an updated bootstrap list names the same chain.
    """

    chain_id: str
    genesis_time_ms: int
    validators: tuple[bytes, ...]
    balances: tuple[tuple[bytes, int, int], ...]  # (account, balance, bond)
    params: Params = field(default_factory=Params)
    bootstrap: tuple[str, ...] = ()  # not part of the hash (see the class docstring)

    def to_doc(self) -> dict[Any, Any]:
        """The JSON document that :func:`parse_genesis` reads back into an equal :class:`Genesis` (same hash)."""
        return {"chain_id": self.chain_id, "genesis_time_ms": self.genesis_time_ms,
                "validators": [account_to_str(v) for v in self.validators],
                "accounts": [{"account": account_to_str(a), "balance": _amount_doc(bal), "bond": _amount_doc(bond)}
                             for a, bal, bond in self.balances],
                "params": self.params.consensus_fields(), "bootstrap": list(self.bootstrap)}

    @cached_property
    def hash(self) -> bytes:
        """32-byte BLAKE2b-256 of the consensus identity (see the class docstring), computed once."""
        return H(b"tally/genesis/v1", pack([self.chain_id, self.genesis_time_ms, list(self.validators),
                                            [list(b) for b in self.balances],
                                            list(self.params.consensus_fields().values())]))

    @cached_property
    def domain(self) -> str:
        """The signing domain ``"<chain id>/<genesis hash hex>"`` (:mod:`node.ledger.core.domain`): the value of
        every signed object's ``chain_id`` field and of every header, vote and manifest of this network."""
        return signing_domain.make(self.chain_id, self.hash)

    @property
    def supply(self) -> int:
        return sum(b + bo for _, b, bo in self.balances)


def _amount_doc(units: int) -> str:
    """An account amount as :func:`parse_genesis` reads it: decimal credits (``1_500_000_000`` -> ``"1.5"``)."""
    return format_amount(units)


ACCOUNT_KEYS = ("account", "balance", "bond", "note")


def _genesis_account(entry: Any) -> tuple[bytes, int, int]:
    """One entry of a genesis file's ``accounts``: ``{"account": peer ID, "balance": "1000", "bond": "200",
    "note": "..."}``. ``balance`` and ``bond`` are decimal credits in the one amount syntax of the API and CLI
    (:data:`node.encoding.AMOUNT_GRAMMAR`, absent means 0); a JSON number is refused, so that no reader has to
    guess whether ``1000`` meant credits or base units. Returns ``(account, balance, bond)`` in base units.

    Raises:
        GenesisError: not an object, an unknown key, a bad account, or a bad amount (the message shows the form).
    """
    if not isinstance(entry, dict) or "account" not in entry:
        raise GenesisError("an account entry is an object with \"account\", \"balance\" and \"bond\", got "
                           f"{json.dumps(entry)[:80]}")
    unknown = sorted(set(entry) - set(ACCOUNT_KEYS))
    if unknown:
        raise GenesisError(f"account {entry['account']}: unknown key(s) {unknown} (known: {', '.join(ACCOUNT_KEYS)})")
    try:
        account = account_from_str(entry["account"])
    except ValueError as e:
        raise GenesisError(f"bad account in accounts: {e}") from None
    amounts = []
    for key in ("balance", "bond"):
        v = entry.get(key, "0")
        if not isinstance(v, str):
            raise GenesisError(f"account {entry['account']}: {key} must be a JSON string of decimal credits such "
                               f"as \"1000\", not {json.dumps(v)[:40]}; write {AMOUNT_FORM}")
        try:
            amounts.append(parse_amount(v, allow_zero=True))
        except ValueError as e:
            raise GenesisError(f"account {entry['account']}: {key}: {e}") from None
    return account, amounts[0], amounts[1]


def check_bootstrap_addr(text: str) -> str:
    """Return ``text`` if it is a multiaddr that ends in ``/p2p/<Ed25519 peer ID>`` (the peer to dial, as every
    Tally node's ID is) and has a transport address before it, e.g. ``/ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...``
    or ``/dns4/boot.example.org/tcp/4001/p2p/12D3KooW...``.

    Raises:
        GenesisError: not such a multiaddr, or a wildcard address (``0.0.0.0``, ``::``) nobody can dial.
    """
    example = "e.g. /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW..."
    try:
        if not isinstance(text, str) or not text.startswith("/"):
            raise ValueError
        ma = Multiaddr(text)
        protos = [p.name for p in ma.protocols()]
        peer = text.rsplit("/p2p/", 1)[1] if "/p2p/" in text else ""
        account_from_str(peer)
    except Exception:  # noqa: BLE001  (multiaddr raises many kinds; every one means: not an address)
        raise GenesisError(f"bootstrap address {text!r} is not a multiaddr ending in /p2p/<peer ID>, "
                           f"{example}") from None
    if len(protos) < 2 or protos[-1] != "p2p":
        raise GenesisError(f"bootstrap address {text!r} must be a transport address followed by /p2p/<peer ID>, "
                           f"{example}")
    for proto in ("ip4", "ip6"):
        if proto in protos and ma.value_for_protocol(proto) in ("0.0.0.0", "::"):
            raise GenesisError(f"bootstrap address {text!r} is a wildcard address that nobody can dial")
    return text


def parse_genesis(doc: dict[Any, Any]) -> Genesis:
    """Build and check a :class:`Genesis` from its JSON document.

    Raises:
        GenesisError: missing fields, bad accounts, unsafe parameters.
    """
    if not isinstance(doc, dict):
        raise GenesisError("a genesis file is a JSON object")
    missing = [k for k in ("chain_id", "validators", "accounts") if k not in doc]
    if missing:
        raise GenesisError(f"missing field(s): {', '.join(missing)}")
    try:
        chain_id = doc["chain_id"]
        if not isinstance(chain_id, str) or not 0 < len(chain_id) <= 64:
            raise GenesisError("chain_id must be a string of 1..64 characters")
        validators = tuple(account_from_str(v) for v in doc["validators"])
        if not validators:
            raise GenesisError("the validator set is empty")
        balances = []
        if not isinstance(doc["accounts"], list):
            raise GenesisError("accounts must be a list of {\"account\", \"balance\", \"bond\"} objects")
        for a in doc["accounts"]:
            balances.append(_genesis_account(a))
        known = set(Params.__dataclass_fields__)
        unknown = set(doc.get("params", {})) - known
        if unknown:
            raise GenesisError(f"unknown parameters: {sorted(unknown)}")
        params = Params(**doc.get("params", {}))
        boot = doc.get("bootstrap", [])
        if not isinstance(boot, list):
            raise GenesisError("bootstrap must be a list of multiaddrs")
        bootstrap = tuple(check_bootstrap_addr(b) for b in boot)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, GenesisError):
            raise
        raise GenesisError(f"malformed genesis: {e}") from None
    params.check()
    if params.min_validator_bond:
        bonds: dict[bytes, int] = {}
        for a, _bal, bond in balances:
            bonds[a] = bonds.get(a, 0) + bond
        why = check_genesis_validators(validators, bonds, params.min_validator_bond)
        if why:
            raise GenesisError(why)
    return Genesis(chain_id, int(doc.get("genesis_time_ms", 0)), validators, tuple(balances), params, bootstrap)


__all__ = ["ACCOUNT_KEYS", "MAX_HEARTBEAT_MS", "OPTIONAL_PARAMS", "PARTS", "TREASURY", "Genesis", "GenesisError",
           "Params", "check_bootstrap_addr", "parse_genesis"]
