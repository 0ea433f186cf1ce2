"""Genesis files: chain id, validator set, initial accounts and the parameters they fix.

The devnet genesis is embedded (``genesis/devnet.json``) and uses the well-known devnet keys
(:func:`node.identity.dev_seed`). A node refuses a genesis whose parameters make cheating profitable:
with sampling floor ``p`` and slash ``S``, a cheater's expected loss ``p · S`` must exceed its expected gain
``(1 − p) · G`` on a receipt worth at most ``G = max_receipt_price`` (DESIGN.md, Verification §4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..encoding import H, pack
from ..identity import account_from_str
from ..verify.sampling import PPM

TREASURY = H(b"tally/treasury/v1")  # unspendable account that receives slashed bonds beyond rewards


class GenesisError(ValueError):
    """A genesis file that is malformed or whose parameters are unsafe."""


@dataclass(frozen=True)
class Params:
    """Chain parameters. Amounts in base units; probabilities in ppm; windows in blocks."""

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


@dataclass(frozen=True)
class Genesis:
    chain_id: str
    genesis_time_ms: int
    validators: tuple[bytes, ...]
    balances: tuple[tuple[bytes, int, int], ...]  # (account, balance, bond)
    params: Params = field(default_factory=Params)

    @property
    def hash(self) -> bytes:
        return H(b"tally/genesis/v1", pack([self.chain_id, self.genesis_time_ms, list(self.validators),
                                            [list(b) for b in self.balances], list(self.params.__dict__.values())]))

    @property
    def supply(self) -> int:
        return sum(b + bo for _, b, bo in self.balances)


def parse_genesis(doc: dict) -> Genesis:
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
        for a in doc["accounts"]:
            bal, bond = int(a.get("balance", 0)), int(a.get("bond", 0))
            if bal < 0 or bond < 0:
                raise GenesisError("negative genesis balance")
            balances.append((account_from_str(a["account"]), bal, bond))
        known = set(Params.__dataclass_fields__)
        unknown = set(doc.get("params", {})) - known
        if unknown:
            raise GenesisError(f"unknown parameters: {sorted(unknown)}")
        params = Params(**doc.get("params", {}))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, GenesisError):
            raise
        raise GenesisError(f"malformed genesis: {e}") from None
    params.check()
    return Genesis(chain_id, int(doc.get("genesis_time_ms", 0)), validators, tuple(balances), params)


def load_genesis(path: Path | None = None) -> Genesis:
    """Load a genesis file, or the embedded devnet genesis when ``path`` is None."""
    if path is None:
        text = resources.files("genesis").joinpath("devnet.json").read_text()
    else:
        text = Path(path).read_text()
    where = "embedded devnet genesis" if path is None else str(path)
    try:
        return parse_genesis(json.loads(text))
    except json.JSONDecodeError as e:
        raise GenesisError(f"{where} is not JSON: {e}") from None
    except GenesisError as e:
        raise GenesisError(f"{where}: {e}") from None
