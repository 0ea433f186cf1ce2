"""The pure JSON helpers every router shares: amounts as ``{"base_units": str, "credits": str}``, accounts as peer
IDs (the treasury is ``"treasury"``), other bytes as lower-case hex; and parsing them back from a path, refused
with :class:`~node.web.errors.ApiError` (400). The views of whole ledger objects build on these
(:mod:`node.api.views`, and each capability's own in its ``api`` module)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..encoding import format_amount
from ..identity import account_from_str, account_to_str
from ..ledger.genesis import TREASURY
from .errors import ApiError

Json = dict[str, Any]  # a JSON object as the routes answer it (shaped like its model in node.api.models)


def amount(units: int) -> dict[str, str]:
    """``{"base_units": "1500000000", "credits": "1.5"}``."""
    return {"base_units": str(units), "credits": format_amount(units)}


@lru_cache(maxsize=8192)
def acct(a: bytes) -> str:
    """An account as its peer ID string; the treasury as ``"treasury"``."""
    return "treasury" if a == TREASURY else account_to_str(a)


def hexid(b: bytes | None) -> str | None:
    """``b`` as lower-case hex; None for None (or anything that is not bytes)."""
    return b.hex() if isinstance(b, bytes) else None


def hex_id(text: str, n: int = 32) -> bytes | None:
    """``text`` as an id of ``n`` bytes, or None when it is not ``2n`` hex characters."""
    try:
        b = bytes.fromhex(text)
    except ValueError:
        return None
    return b if len(b) == n else None


def parse_id(text: str, what: str, n: int = 32) -> bytes:
    """Hex id of ``n`` bytes. Raises ApiError 400 ``bad_id``."""
    b = hex_id(text, n)
    if b is None:
        raise ApiError(400, "bad_id", f"{what} must be {2 * n} hex characters")
    return b


def parse_account(text: str) -> bytes:
    """A peer ID (or 64 hex characters) as a 32-byte account. Raises ApiError 400 ``bad_account``."""
    if len(text) > 128:
        raise ApiError(400, "bad_account", "not a peer ID")
    try:
        return _account_from_str(text)
    except ValueError as e:
        raise ApiError(400, "bad_account", str(e)) from None


@lru_cache(maxsize=4096)
def _account_from_str(text: str) -> bytes:
    return account_from_str(text)  # base58 and multihash decoding: ~40 µs, worth remembering


__all__ = ["Json", "acct", "amount", "hex_id", "hexid", "parse_account", "parse_id"]
