"""Consensus messages on the wire (``tally/<chain>/consensus``, :mod:`node.ledger.driver`): a signed proposal or
vote from gossip decoded and checked (:func:`decode_message`), and this validator's own signed
(:func:`sign_message`).

Wire maps (msgpack): a proposal ``{"k": "proposal", "h": height, "r": round, "v": block hash (32 bytes), "vr":
valid round (-1: none), "from": account, "sig", "block": block wire}``; a vote ``{"k": "prevote" | "precommit",
"h", "r", "v": block hash or b"" (nil), "from", "sig"}``. Signatures are over
:func:`~node.ledger.core.block.proposal_digest` and :func:`~node.ledger.core.txbase.vote_digest` with the
network's signing domain. (Gossip adds an unsigned ``"t"``, which keeps re-broadcasts distinct.)
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import Any

from ..identity import Identity, verify
from .core.block import Block, proposal_digest
from .core.consensus import PRECOMMIT, PREVOTE, Proposal, Vote
from .core.txbase import vote_digest

MAX_ROUND = 10_000  # rounds a message may name (a bound on what a peer can make us hold)


def decode_message(msg: dict[str, Any], chain_id: str, senders: Callable[[], Set[bytes]]) -> Proposal | Vote:
    """The proposal or vote of wire map ``msg``, its signature checked. ``senders()``: the accounts whose messages
    are kept (called once the fields are well-formed).

    Raises:
        ValueError: malformed, from a sender not in ``senders()``, an unknown kind, or a bad signature.
    """
    kind, h, r = msg.get("k"), msg.get("h"), msg.get("r")
    sender, sig = msg.get("from"), msg.get("sig")
    if not (isinstance(h, int) and isinstance(r, int) and h >= 1 and 0 <= r < MAX_ROUND
            and isinstance(sender, bytes) and sender in senders() and isinstance(sig, bytes)):
        raise ValueError("malformed consensus message")
    if kind == "proposal":
        value, vr = msg.get("v"), msg.get("vr")
        if not (isinstance(value, bytes) and len(value) == 32 and isinstance(vr, int) and -1 <= vr < r):
            raise ValueError("malformed proposal")
        if not verify(sender, proposal_digest(chain_id, h, r, value, vr), sig):
            raise ValueError("bad proposal signature")
        return Proposal(h, r, value, vr, sender)
    if kind in (PREVOTE, PRECOMMIT):
        value = msg.get("v")
        if not (isinstance(value, bytes) and len(value) in (0, 32)):
            raise ValueError("malformed vote")
        if not verify(sender, vote_digest(kind, chain_id, h, r, value or None), sig):
            raise ValueError("bad vote signature")
        return Vote(kind, h, r, value or None, sender)
    raise ValueError(f"unknown consensus message {kind!r}")


def sign_message(ident: Identity, chain_id: str, m: Proposal | Vote, block: Block | None = None) -> dict[str, Any]:
    """The signed wire map of this validator's proposal (with its ``block``) or vote ``m``.

    Raises:
        ValueError: a proposal without its block.
    """
    if isinstance(m, Proposal):
        if block is None:
            raise ValueError("a proposal is sent with its block")
        sig = ident.sign(proposal_digest(chain_id, m.height, m.round, m.value, m.valid_round))
        return {"k": "proposal", "h": m.height, "r": m.round, "v": m.value, "vr": m.valid_round,
                "from": ident.account, "sig": sig, "block": block.to_wire()}
    value = m.value or b""
    sig = ident.sign(vote_digest(m.kind, chain_id, m.height, m.round, m.value))
    return {"k": m.kind, "h": m.height, "r": m.round, "v": value, "from": ident.account, "sig": sig}


__all__ = ["MAX_ROUND", "decode_message", "sign_message"]
