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

What in :mod:`node.ledger.core.state`, :mod:`node.ledger.core.jobs` and :mod:`node.ledger.core.runs` advances only
with heights (``end_block``), read from their code:

* receipts (``end_block``): a PENDING receipt included at the head draws its sample from the next block's hash
  (the beacon); a PENDING unsampled one settles ``challenge_window`` blocks after inclusion; a SAMPLED one
  escalates or settles ``verdict_timeout`` blocks after its round opened (votes are transactions, but the
  timeout is counted in heights). A run's round receipt waiting, unsampled, for its round's commit phase to
  close is the one exception: its run moves it (below).
* jobs (``end_block_jobs``): an OPEN or ACCEPTED job expires after its ``deadline`` height; an ACCEPTED one
  without a segment returns to open after ``job_start_window`` blocks; a DELIVERED job settles at the first
  height at which all its segments are final.
* runs (``end_block_runs``): a WAITING or TRAINING run opens rounds, closes phases after ``round_timeout``
  blocks, draws aggregators and expires after its ``deadline`` height; a FINISHING or EXPIRED run returns its
  escrow at the first height at which nothing is held and all its receipts are final.

These deadlines are counted in blocks on purpose (a job's start window is a number of blocks the requester
agreed to); while any of them is open the chain keeps ``block_time_ms``, so they keep their meaning in seconds.
Everything else — accounts, bonds, sessions, evidence, terminal receipts, jobs and runs — changes only through
transactions. Every validator evaluates :func:`needs_height` on the same state, so they agree on it; mempools
and clocks differ, which is why the driver also starts round 0 as soon as any validator's signed proposal or
vote for that height arrives (a validator that saw a transaction first pulls the others in).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from .genesis import Params
from .jobs import ACCEPTED, DELIVERED, OPEN
from .runstate import RunStatus
from .runtx import RoundReceipt
from .status import FINAL, PENDING, SAMPLED

if TYPE_CHECKING:
    from .state import State


class Need(str, enum.Enum):
    """Why the state needs the next height (the first reason :func:`height_need` finds)."""

    BEACON = "beacon"  # a receipt included at the head draws its sample from the next block's hash
    CHALLENGE = "challenge_window"  # an unsampled receipt settles after challenge_window blocks
    VERDICT = "verdict_timeout"  # a sampled receipt's round escalates after verdict_timeout blocks
    JOB = "job"  # a job's deadline, start window, or settlement once its segments are final
    RUN = "run"  # a run's rounds, phase timeouts and deadline, or its escrow return once all is final
    BATCH = "batch"  # an open batch's items are assigned, decided and re-issued by heights (node.ledger.core.batch)
    PROOF = "proof"  # the state root after the head is in no header yet (also the first block of a chain)


def height_need(state: State) -> Need | None:
    """The first reason found why ``state`` needs another block to move on, or None when nothing in it advances
    with heights (only a transaction can change it). O(open receipts + open jobs + open runs), stopping at the
    first reason; reads ``state`` only.
    """
    for rid in state.open_receipts:
        rec = state.receipts[rid]
        if rec.status == PENDING:
            if isinstance(rec.receipt, RoundReceipt) and not rec.p_ppm:
                continue  # sampled when its round's commit phase closes: its run needs the heights
            return Need.BEACON if rec.height >= state.height else Need.CHALLENGE
        if rec.status == SAMPLED:
            return Need.VERDICT
        if rec.status not in FINAL:  # a status this module does not know: assume it moves with heights
            return Need.VERDICT
    for jid in state.open_jobs:
        job = state.jobs[jid]
        if job.status in (OPEN, ACCEPTED):
            return Need.JOB
        if job.status == DELIVERED and all(state.receipts[r].status in FINAL for r in job.segments):
            return Need.JOB
    for run_id in state.open_runs:
        run = state.runs[run_id]
        if run.status in (RunStatus.WAITING, RunStatus.TRAINING):
            return Need.RUN
        if (run.status in (RunStatus.FINISHING, RunStatus.EXPIRED) and not run.final_height and not run.held
                and not run.decided and all(state.receipts[x].status in FINAL for x in run.receipts)):
            return Need.RUN
    if state.open_batches:
        return Need.BATCH
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


__all__ = ["Need", "block_due", "height_need", "needs_height", "needs_proof"]
