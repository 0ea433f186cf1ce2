"""The transaction registry: every kind, by name (:data:`TX_KINDS`), and :func:`decode_tx`.

The kinds are every module's, in the module tuple's order (:data:`node.ledger.core.modules.MODULES`: the bank's
transfers, bonds and unbonds, the receipts' inference receipts and votes, then each extension's): the registry
is derived from that tuple, never written to at import. The base classes and the core modules' kinds are
re-exported here, so ``from node.ledger.core.tx import Receipt, decode_tx`` keeps working; a capability's own
``*tx`` module imports :mod:`~node.ledger.core.txbase` instead (this module imports every capability).

See :mod:`node.ledger.core.txbase` for the canonical bytes, ids, signatures and the wire form.
"""

from __future__ import annotations

from typing import Any

from .domain import MAX_DOMAIN, is_domain
from .modules import KINDS
from .txbase import (
    ABSTAIN,
    INVALID,
    PRECOMMIT_TAG,
    PREVOTE_TAG,
    VALID,
    VERDICT_NAMES,
    Bond,
    Evidence,
    FeeParams,
    InvalidTx,
    Receipt,
    SingleSigned,
    Transfer,
    Tx,
    Unbond,
    Verdict,
    Vote,
    _check,
    _check_field,
    _is_bytes,
    arity_fits,
    build_tx,
    vote_digest,
)

TX_KINDS: dict[str, type[Tx]] = {c.KIND: c for c in KINDS}  # kind name -> class, in registry order


def decode_tx(obj: Any) -> Tx:
    """Build a transaction from its wire map, checking kind, arity, every field's type and size, signature sizes,
    and that every account field is a valid Ed25519 public key.

    Does not check signatures (see :meth:`Tx.check_signatures`) or state, nor which network the transaction is
    for (the mempool and the state transition compare its domain with their own).

    Raises:
        InvalidTx: anything malformed, a chain id that is not a signing domain (an older version's transaction),
            or an account field that no key could spend from.
    """
    _check(isinstance(obj, dict), "a transaction is a map")
    cls = TX_KINDS.get(obj.get("t"))
    if cls is None:
        raise InvalidTx(f"unknown transaction kind {obj.get('t')!r}")
    chain_id, f, s = obj.get("c"), obj.get("f"), obj.get("s")
    _check(isinstance(chain_id, str) and 0 < len(chain_id) <= MAX_DOMAIN, "bad chain id")
    if not is_domain(chain_id):
        raise InvalidTx(f"transaction for chain {chain_id!r} not bound to a genesis (signed by an older version: a "
                        "signing domain is '<chain id>/<genesis hash hex>')")
    _check(isinstance(f, list) and arity_fits(cls, len(f)), "wrong number of fields")
    _check(isinstance(s, list) and len(s) == len(cls.SIGS), "wrong number of signatures")
    for (name, kind), v in zip(cls.SCHEMA.items(), f, strict=False):  # an optional tail may be left out
        _check_field(name, kind, v)
    for sig in s:
        _check(_is_bytes(sig, 64) or sig == b"", "a signature is 64 bytes (or empty while unsigned)")
    return build_tx(cls, chain_id, f, s)  # the kind's own fields, checked above


__all__ = [
    "ABSTAIN",
    "INVALID",
    "PRECOMMIT_TAG",
    "PREVOTE_TAG",
    "TX_KINDS",
    "VALID",
    "VERDICT_NAMES",
    "Bond",
    "Evidence",
    "FeeParams",
    "InvalidTx",
    "Receipt",
    "SingleSigned",
    "Transfer",
    "Tx",
    "Unbond",
    "Verdict",
    "Vote",
    "decode_tx",
    "vote_digest",
]
