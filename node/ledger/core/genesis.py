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
from .sampling import PPM
from .valset import check_genesis as check_genesis_validators

TREASURY = H(b"tally/treasury/v1")  # unspendable account that receives slashed bonds beyond rewards
MAX_HEARTBEAT_MS = 3_600_000  # the longest heartbeat_ms a genesis may set (1 hour)
OPTIONAL_PARAMS = ("heartbeat_ms", "retention_blocks",
                   "min_validator_bond",
                   "batch_slash", "batch_absent_penalty",
                   "min_replication", "batch_max_held",
                   "batch_audit_ppm", "min_model_servers",
                   "batch_min_token_price", "batch_max_open_items",
                   "batch_audit_pay_bps",
                   "epoch_blocks", "batch_samples", "reveal_window", "settle_window",
                   "tab_close_delay")  # left out of the genesis hash and document when 0


class GenesisError(ValueError):
    """A genesis file that is malformed or whose parameters are unsafe."""


@dataclass(frozen=True)
class Params:
    """Chain parameters. Amounts in base units; probabilities in ppm; windows in blocks. In a genesis file's
    ``params`` every one is a JSON integer in those units (not the decimal-credit strings of account balances);
    booleans, floats and strings are refused (:meth:`check`)."""

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
    # the job marketplace's liveness (node.ledger.core.jobs): an accepted job shows its first segment within
    # job_start_window blocks or returns to open, the worker's bond paying job_start_penalty (base units); a worker
    # that gives a job back before its first segment pays job_release_penalty; a post's deadline is at most
    # max_job_deadline blocks after its inclusion
    job_start_window: int = 600
    job_start_penalty: int = 2_000_000_000
    job_release_penalty: int = 500_000_000
    max_job_deadline: int = 100_000
    # quiet when idle (node.ledger.core.liveness): with nothing to include and nothing in the state that moves on with
    # heights, the next block comes heartbeat_ms after the last one instead of block_time_ms (Tendermint's
    # create_empty_blocks_interval). 0, the value of every genesis written before it existed: a block every
    # block_time_ms, as before; 0 is left out of the genesis hash and document, so those chains keep their hash.
    heartbeat_ms: int = 0
    # history that ends (node.ledger.core.history): a final inference receipt leaves the state retention_blocks
    # blocks after it became final (and not before it is too old to be replayed), its summary kept in the
    # state's RFC 9162 history log. 0: receipts stay forever, as before; 0 is left out of the genesis hash and
    # document, as heartbeat_ms is.
    retention_blocks: int = 0
    # validators that change (node.ledger.core.valset): a bonded account with at least min_validator_bond base units
    # of bond may join the validator set by a transaction, effective two heights later; voting power is the bond.
    # 0: the validator set is fixed in genesis with one vote each, as before; 0 is left out of the genesis hash and
    # document, as heartbeat_ms is.
    min_validator_bond: int = 0
    # batch jobs checked by majority vote (node.ledger.core.batch): a worker whose revealed result differs from the
    # quorum's loses min(bond, batch_slash), 0 meaning slash_amount; one that never committed or never revealed loses
    # min(bond, batch_absent_penalty), 0 meaning job_start_penalty (at most half the slash); with min_replication
    # > 0, workers with a run of adapt_step quorum agreements lower an item's replication toward min_replication
    # (BOINC adaptive replication), 0 meaning never. All three are left out of the genesis hash and document when 0, as
    # heartbeat_ms is.
    batch_slash: int = 0
    batch_absent_penalty: int = 0
    min_replication: int = 0
    # a worker holding batch_max_held undecided batch assignments is not drawn for more (BOINC's max_wus_in_progress):
    # items are then drawn as workers finish others, so an item's commit window need only hold a worker's share of
    # batch_max_held items, not the whole job, and a worker that dies strands at most that many. Each consecutive
    # absence halves the worker's limit (to 1; BOINC's quota cut for hosts that miss deadlines). 0: no limit (every
    # item is drawn within N / 64 blocks of the post); left out of the genesis hash and document when 0.
    batch_max_held: int = 0
    # the probability (ppm) that an accepted batch item is re-run by a committee (node.ledger.core.batchaudit): what
    # catches a colluding majority in the long run. 0: never; left out of the genesis hash and document when 0.
    batch_audit_ppm: int = 0
    # bounded model fetches (node.verify.blockfetch): a committee member drawn for a receipt of a model it does not
    # hold fetches that model only when at least this many distinct bonded peers announce it in the swarm; otherwise
    # it abstains without downloading anything. 0 means 1 (a model served by one bonded server stays verifiable);
    # left out of the genesis hash and document when 0.
    min_model_servers: int = 0
    # batch work is opted into and priced (issue 24 finding 2; node.ledger.core.batch): a batch post pays at least
    # batch_min_token_price base units per token of work per replica (BatchPost.tokens(); 0 means 1), and one
    # requester's batches not yet settled or cancelled hold at most batch_max_open_items items together (0 means
    # MAX_ITEMS, one full batch). Left out of the genesis hash and document when 0.
    batch_min_token_price: int = 0
    batch_max_open_items: int = 0
    # batch audit committees are paid (issue 24 finding 8; node.ledger.core.batchaudit): a post escrows
    # committee_size × price × batch_audit_pay_bps / 10^4 per item besides its replicas' escrow; each member of an
    # item's audit committee that voted the audit's outcome is paid price × batch_audit_pay_bps / 10^4, and the rest
    # returns to the requester (at once for an item that is not audited). 0: members are unpaid; left out of the
    # genesis hash and document when 0.
    batch_audit_pay_bps: int = 0
    # settlement by tabs and epoch batches (issue 37, node.ledger.core.tabs): epoch_blocks blocks per epoch (0: no
    # tabs on this chain), batch_samples receipts drawn from each epoch batch (scaled by the worker's record as p
    # is), reveal_window blocks to reveal them after the draw, settle_window blocks after the last verdict before
    # a batch's pending credits are spendable, tab_close_delay blocks from a tab's close to its unspent lock's
    # return. Left out of the genesis hash and document when 0.
    epoch_blocks: int = 0
    batch_samples: int = 0
    reveal_window: int = 0
    settle_window: int = 0
    tab_close_delay: int = 0

    def batch_token_floor(self) -> int:
        """Base units per token of work a batch must pay at least: ``batch_min_token_price``, 0 meaning 1."""
        return self.batch_min_token_price or 1

    def model_servers(self) -> int:
        """Bonded servers that must announce a model before a committee member fetches it (``min_model_servers``,
        0 meaning 1)."""
        return self.min_model_servers or 1

    def heartbeat(self) -> int:
        """The longest gap between two blocks in milliseconds: ``heartbeat_ms``, or ``block_time_ms`` when 0."""
        return self.heartbeat_ms or self.block_time_ms

    def consensus_fields(self) -> dict[str, int]:
        """The parameters as the genesis document and hash carry them: every one, but ``heartbeat_ms`` and
        ``retention_blocks`` only when set (a genesis from before they existed keeps its document and hash)."""
        return {k: v for k, v in self.__dict__.items() if not (k in OPTIONAL_PARAMS and v == 0)}

    def check(self) -> None:
        """Raise :class:`GenesisError` for unsafe or nonsensical parameters."""
        for name, v in self.__dict__.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise GenesisError(f"parameter {name} must be a non-negative integer")
        if not 0 < self.sample_floor_ppm <= self.sample_base_ppm <= PPM:
            raise GenesisError("need 0 < sample_floor_ppm <= sample_base_ppm <= 1e6")
        if self.committee_size < 1 or self.committee_fee_bps > 10_000 or self.block_time_ms < 10:
            raise GenesisError("committee_size >= 1, committee_fee_bps <= 10000, block_time_ms >= 10")
        p, s, g = self.sample_floor_ppm, self.slash_amount, self.max_receipt_price
        if p * s <= (PPM - p) * g:
            raise GenesisError(
                f"cheating is profitable: p·S = {p * s / PPM:.0f} <= (1-p)·G = {(PPM - p) * g / PPM:.0f} "
                "base units; raise slash_amount or sample_floor_ppm, or lower max_receipt_price")
        if self.min_bond < 1:
            raise GenesisError("min_bond must be positive")
        if not 0 <= self.job_release_penalty < self.job_start_penalty <= self.min_bond:
            raise GenesisError("need 0 <= job_release_penalty < job_start_penalty <= min_bond (a bonded worker can "
                               "always pay the start penalty of one job, and releasing costs less than holding)")
        if not 1 <= self.job_start_window <= self.max_job_deadline:
            raise GenesisError("need 1 <= job_start_window <= max_job_deadline (a job can start before its deadline)")
        if self.heartbeat_ms and not self.block_time_ms <= self.heartbeat_ms <= MAX_HEARTBEAT_MS:
            raise GenesisError(f"heartbeat_ms must be 0 (a block every block_time_ms) or between block_time_ms "
                               f"({self.block_time_ms}) and {MAX_HEARTBEAT_MS} (1 h: a follower that sees no header "
                               "for longer cannot tell a quiet chain from a halted one)")
        if self.batch_absent_penalty and not self.batch_absent_penalty < (self.batch_slash or self.slash_amount):
            raise GenesisError("need batch_absent_penalty < batch_slash (0 meaning slash_amount): an absent "
                               "batch worker must lose less than an out-voted one")
        if self.min_replication > 16:
            raise GenesisError("min_replication must be 0 (no adaptive replication) or in 1..16")
        if self.batch_audit_ppm > PPM:
            raise GenesisError("batch_audit_ppm must be in 0..1000000 (a probability in parts per million)")
        if self.min_model_servers > 1_000:
            raise GenesisError("min_model_servers must be 0 (meaning 1) or in 1..1000 bonded servers")
        if self.batch_min_token_price > 10**15:
            raise GenesisError("batch_min_token_price must be 0 (meaning 1) or at most 10^15 base units per token")
        if self.batch_max_open_items > 10**9:
            raise GenesisError("batch_max_open_items must be 0 (one full batch) or at most 10^9 items")
        if self.batch_audit_pay_bps > 100_000:
            raise GenesisError("batch_audit_pay_bps must be in 0..100000 (at most 10 times an item's price per "
                               "member)")
        if self.batch_max_held > 1_000_000:
            raise GenesisError("batch_max_held must be 0 (no limit) or in 1..1000000 undecided assignments")
        if self.epoch_blocks and not (2 <= self.batch_samples <= 1_000_000 and 1 <= self.reveal_window <= 10_000
                                      and 1 <= self.settle_window <= 100_000
                                      and self.tab_close_delay >= 2 * self.epoch_blocks + self.reveal_window):
            raise GenesisError("with epoch_blocks set, need 2 <= batch_samples (any m >= 2 makes faking a receipt a "
                               "loss), 1 <= reveal_window <= 10000, 1 <= settle_window <= 100000, and "
                               "tab_close_delay >= 2 × epoch_blocks + reveal_window (a worker can still redeem "
                               "a closing tab's last epoch)")


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
