"""When the chain needs its next block: quiet when idle (pure; no I/O, no clock).

Tendermint makes a block every ``timeout_commit`` unless ``create_empty_blocks = false``; then a height's round 0
waits for transactions, or for ``create_empty_blocks_interval`` to pass, or for a *proof block* (the first
height, or an app hash changed by the last block that no header carries yet) before it enters its propose step
(tendermint/consensus/state.go, ``enterNewRound``/``needProofBlock``/``handleTxsAvailable``; docs "Configuration:
create_empty_blocks_interval"). Tally does the same with one more reason, because its ledger has work that
moves on only with heights. A validator starts round 0 of the next height when :func:`block_due` says so:

* ``block_time_ms`` has passed since the head block's header time, **and** one of
* a transaction is ready in its mempool;
* the state needs a height (:func:`needs_height`, below): a timeout or beacon that only a new block advances;
* the state root after the head is not yet in a header (:func:`needs_proof`): the block after a block that
  changed accounts proves the new balances to light clients (Tendermint's proof block);
* ``heartbeat_ms`` (genesis) has passed since the head block's header time.

What advances only with heights is each ledger module's to say (its ``height_need``, asked in the module tuple's
order, :data:`node.ledger.core.modules.MODULES`), read from its ``end_block``:

* receipts: a PENDING receipt included at the head draws its sample from the next block's hash (``beacon``); a
  PENDING unsampled one settles ``challenge_window`` blocks after inclusion; a SAMPLED one escalates or settles
  ``verdict_timeout`` blocks after its round opened (votes are transactions, but the timeout is counted in
  heights). A receipt whose kind samples it later (a run's round receipt waiting for its round's commit phase)
  is its own module's to move on;
* jobs (``job``): an OPEN or ACCEPTED job expires after its ``deadline``; an ACCEPTED one without a segment
  returns to open after ``job_start_window`` blocks; a DELIVERED job settles once all its segments are final;
* runs (``run``): a WAITING or TRAINING run opens rounds, closes phases after ``round_timeout`` blocks, draws
  aggregators and expires after its deadline; a FINISHING or EXPIRED run returns its escrow once nothing is held
  and all its receipts are final;
* batches (``batch``): an open batch's items are assigned, decided and re-issued by heights;
* tabs (``tab``): an epoch batch's draw, reveal window and settlement window, and a closing tab's delay.

These deadlines are counted in blocks on purpose (a job's start window is a number of blocks the requester
agreed to); while any of them is open the chain keeps ``block_time_ms``, so they keep their meaning in seconds.
Everything else changes only through transactions. Every validator evaluates :func:`needs_height` on the same state,
so they agree on it; mempools and clocks differ, which is why the driver also starts round 0 as soon as any
validator's signed proposal or vote for that height arrives (a validator that saw a transaction first pulls the
others in).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .genesis import Params
from .modules import MODULES

if TYPE_CHECKING:
    from .state import State

def height_need(state: State) -> str | None:
    """The first reason found why ``state`` needs another block to move on — a module's (``beacon``,
    ``challenge_window``, ``verdict_timeout``, ``job``, ``run``, ``batch``, ``tab``), asked in the module tuple's
    order — or None when nothing in it advances with heights (only a transaction can change it). Each module
    stops at its first reason: O(its open items) at most; reads ``state`` only."""
    for m in MODULES:
        why = m.height_need(state)
        if why is not None:
            return why
    return None


def needs_height(state: State) -> bool:
    """True when something in ``state`` advances only with heights (see the module docstring): a receipt's
    beacon, challenge window or verdict timeout, a job's or a run's deadline, timeouts or settlement."""
    return height_need(state) is not None


def needs_proof(state: State, head_state_root: bytes | None) -> bool:
    """True when the state root after the head differs from ``head_state_root``, the root the head header
    carries (None before the first block: a chain's first block is always made, as Tendermint's initial proof
    block). The next header would carry the new root, proving the last block's balances to light clients."""
    return head_state_root is None or state.state_root() != head_state_root


def block_due(params: Params, now_ms: int, head_time_ms: int, txs_ready: bool, need: bool) -> bool:
    """Whether a validator starts round 0 of the next height now.

    Args:
        params: the genesis parameters (``block_time_ms``, ``heartbeat_ms``).
        now_ms: this validator's clock, ms since the Unix epoch.
        head_time_ms: the head block's header time (the genesis time before the first block), ms.
        txs_ready: the mempool holds a transaction that applies on the head.
        need: :func:`needs_height` or :func:`needs_proof` holds for the head state.

    Returns:
        True once ``block_time_ms`` has passed since the head and there is a reason (``txs_ready``, ``need``, or
        ``heartbeat_ms`` passed since the head). With ``heartbeat_ms`` 0 (genesis files from before it) this is
        True once ``block_time_ms`` has passed: a block every block time, as before.
    """
    gap = now_ms - head_time_ms
    if gap < params.block_time_ms:
        return False
    return txs_ready or need or gap >= params.heartbeat()


__all__ = ["block_due", "height_need", "needs_height", "needs_proof"]
