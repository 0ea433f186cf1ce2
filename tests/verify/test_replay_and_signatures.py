"""Replayed receipts, malleable signatures and skewed timestamps are refused, and change nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from node.identity import verify
from node.ledger.core.chain import propose
from node.ledger.core.state import apply_tx, genesis_state
from node.ledger.core.tx import InvalidTx

from ..ledger.helpers import CLIENT, VALIDATOR, W1, make_genesis, make_receipt

L = 2**252 + 27742317777372353535851937790883648493  # order of the Ed25519 base point (RFC 8032 §5.1)


def malleate(sig: bytes) -> bytes:
    """The same signature with S replaced by S + L: valid under a lax verifier, refused under RFC 8032."""
    s = int.from_bytes(sig[32:], "little") + L
    return sig[:32] + s.to_bytes(32, "little")


def test_signature_with_s_plus_l_is_refused_everywhere():
    g = make_genesis()
    r = make_receipt(g, W1)
    assert verify(W1.account, r.id, r.worker_sig) and not verify(W1.account, r.id, malleate(r.worker_sig))
    s = genesis_state(g)
    for bad in (replace(r, worker_sig=malleate(r.worker_sig)), replace(r, requester_sig=malleate(r.requester_sig))):
        before = dict(s.accounts)
        with pytest.raises(InvalidTx, match="signature"):
            apply_tx(s, bad)
        assert s.accounts == before and not s.receipts


def test_receipt_replays_are_refused_with_balances_unchanged():
    g = make_genesis()
    r = make_receipt(g, W1)
    _, s, _ = propose(genesis_state(g), [r], VALIDATOR, 0, ())
    snapshot = (dict(s.accounts), dict(s.receipts))
    same_session = replace(r, tokens=r.tokens + 1, price=r.price + 4 * g.params.price_per_token_block)
    cases = {
        "same receipt twice": r,
        "same work under another session id, old signatures": replace(r, session_id=b"\x01" * 16),
        "another receipt for the same session": same_session.sign_worker(W1).countersign(CLIENT),
        "another chain id": replace(r, chain_id="other-chain"),
    }
    for what, bad in cases.items():
        with pytest.raises(InvalidTx):
            apply_tx(s, bad)
        assert (s.accounts, s.receipts) == snapshot, what


def test_block_timestamps_outside_the_allowed_skew_are_refused():
    from node.ledger.core.chain import check_time

    now = 1_800_000_000_000
    check_time(now + 1000, now, parent_ms=now - 500)
    for t, parent in ((now + 31_000, now - 500), (now - 31_000, now - 40_000), (now - 1000, now - 500)):
        with pytest.raises(ValueError):
            check_time(t, now, parent_ms=parent)
