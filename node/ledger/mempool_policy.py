"""The mempool's policy (:mod:`node.ledger.mempool` holds the pool): its bounds (:class:`Limits`), the eviction
classes (:class:`Priority`), and what it asks of each transaction: its class, its payer, its cost, whether it is
free, and the key of its signed object.

**Caps.** At most ``max_per_sender`` queued transactions per account (the sender of a nonced transaction, the
requester of a receipt, the worker of a training receipt, the voter of a vote, the accused validator of
evidence); of those, at most ``max_free_per_sender`` that carry no work and move no credits (ACCOUNT class with
:func:`cost` 0: run joins and leaves, cancellations, unbonds, validator joins and leaves), so an account cannot
fill the pool with fee-free toggles. Per peer (the gossip originator or direct submitter; local callers are not
capped): at most ``max_queued_per_peer`` queued transactions, and once ``max_refusals_per_peer`` of its
transactions were refused within ``peer_window_s`` seconds, every further one is refused at once (without
decoding it) until the window slides past them. Memory: at most ``max_txs`` transactions and ``max_bytes``
bytes of their msgpack wire form.

**Priority when full.** Two classes (:class:`Priority`): WORK (receipts, training receipts, votes, evidence, job
accepts, deliveries and releases, round receipts, reveals and aggregates, disputes, batch commits, reveals and
audit votes: the current work of the network) and ACCOUNT (transfers, bonds, unbonds, posts of jobs, runs and
batches, joining or leaving a run, cancellations, validator joins and leaves). A run join or leave is account
business, not work: as WORK a bonded account could queue a toggle per nonce, fee-free, and evict transfers
(issue 24 finding 6). ACCOUNT transactions never hold more than ``account_share_pct`` % of the pool's slots or bytes,
so WORK always has the rest; a WORK transaction that finds the pool full evicts ACCOUNT transactions (gapped ones
first, then the last queued transaction of a sender: the sender with the most queued transactions loses its
highest nonce first, and nothing that a queued WORK transaction of the same sender follows). A ready ACCOUNT
transaction may evict gapped ACCOUNT ones of other senders; a gapped one evicts nothing. There is no fee market:
within a class the pool is first come, first served. So receipts and votes are refused as "mempool full" only
when the pool is full of other receipts and votes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..encoding import H
from .core.genesis import Params
from .core.modules import WORK_KINDS
from .core.tx import Tx


class Priority(enum.IntEnum):
    """Eviction class of a queued transaction: ACCOUNT is evicted for WORK, never the other way round."""

    ACCOUNT = 0
    WORK = 1


@dataclass(frozen=True)
class Limits:
    """Bounds of one node's mempool: counts of transactions, bytes of their msgpack wire form, seconds, blocks."""

    max_txs: int = 10_000
    max_bytes: int = 8 << 20
    account_share_pct: int = 50  # ACCOUNT transactions use at most this share of max_txs and of max_bytes
    max_per_sender: int = 64
    max_free_per_sender: int = 4  # of those, ACCOUNT transactions of cost 0 (joins, leaves, cancels, unbonds)
    nonce_window: int = 16  # a gapped nonce is at most next nonce + nonce_window - 1
    future_ttl_blocks: int = 20  # a gapped transaction waits at most this many blocks for its predecessors
    max_queued_per_peer: int = 512
    max_refusals_per_peer: int = 128
    peer_window_s: float = 10.0
    remember: int = 10_000  # reasons kept in Mempool.rejected (the oldest forgotten first)
    max_tracked_peers: int = 1024  # peers whose recent refusals are remembered


def priority(tx: Tx) -> Priority:
    """The class of ``tx`` (see the module docstring)."""
    return Priority.WORK if tx.KIND in WORK_KINDS else Priority.ACCOUNT


def payer(tx: Tx) -> bytes:
    """The account whose per-sender cap ``tx`` counts against: :attr:`~node.ledger.core.txbase.Tx.payer`."""
    return tx.payer


def cost(tx: Tx, params: Params | None = None) -> int:
    """Base units ``tx`` takes from its payer's balance when it applies, escrows included:
    :meth:`~node.ledger.core.txbase.Tx.cost` (transfer, bond: amount; receipt, job post: price, escrowed; run
    post: budget, escrowed; batch post: its replicas' escrow and, under the chain's ``params``, its audit fee;
    anything else 0)."""
    return tx.cost(params)


def is_free(tx: Tx) -> bool:
    """Whether ``tx`` carries no work and moves no credits (ACCOUNT class, :func:`cost` 0): what
    ``Limits.max_free_per_sender`` caps."""
    return priority(tx) is Priority.ACCOUNT and cost(tx) == 0


def sig_key(tx: Tx) -> bytes:
    """BLAKE2b-256 of the id and the signature bytes: two objects with one key are the same signed object."""
    return H(tx.id, *[getattr(tx, s) for s in tx.SIGS])


__all__ = ["WORK_KINDS", "Limits", "Priority", "cost", "is_free", "payer", "priority", "sig_key"]
