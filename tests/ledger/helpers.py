"""Shared builders for ledger tests: a small genesis with known keys, signed receipts and votes."""

from __future__ import annotations

import os

from node.identity import Identity, dev_seed
from node.ledger.core.tx import Receipt, Vote
from node.ledger.genesis import Genesis, Params

C = 10**9
KEYS = [Identity.from_seed(dev_seed(i)) for i in range(8)]
VALIDATOR, CLIENT, W1, W2, W3, W4 = KEYS[0], KEYS[0], KEYS[1], KEYS[2], KEYS[3], KEYS[4]


def make_genesis(**params) -> Genesis:
    p = Params(**{"block_time_ms": 100, "price_per_token_block": 1000, "max_receipt_price": C,
                  "slash_amount": 100 * C, **params})
    p.check()
    bal = [(KEYS[0].account, 1000 * C, 0)] + [(KEYS[i].account, 100 * C, 200 * C) for i in (1, 2, 3, 4)]
    return Genesis("test-chain", 0, (VALIDATOR.account,), tuple(bal), p)


def make_receipt(g: Genesis, worker: Identity, requester: Identity = CLIENT, tokens: int = 10,
                 span=(0, 4), height: int = 0, chain_id: str | None = None, sign=True,
                 rid: bytes | None = None) -> Receipt:
    r = Receipt(chain_id or g.domain, rid or os.urandom(16), worker.account, requester.account, b"m" * 32,
                span[0], span[1], tokens, b"i" * 32, b"o" * 32,
                tokens * (span[1] - span[0]) * g.params.price_per_token_block, height)
    return r.sign_worker(worker).countersign(requester) if sign else r


def vote(g: Genesis, rid: bytes, voter: Identity, verdict: int, round_: int = 0) -> Vote:
    return Vote(g.domain, rid, voter.account, round_, verdict, 0).signed(voter)
