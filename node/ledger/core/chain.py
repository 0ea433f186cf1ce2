"""Building and checking blocks on top of a :class:`~node.ledger.core.state.State` (pure).

``propose`` is what a validator does with its mempool; ``check_and_apply`` is what every node does with a
block and its commit, whether it came over gossip, from sync, or from its own store during replay.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ...keys import Identity
from .block import Block, Header, InvalidBlock, check_commit, sign_commit, tx_root
from .domain import mismatch
from .state import State, apply_block_body, apply_txs, finish_block
from .tx import InvalidTx, Tx


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector for one block's work, then restore it as it was (re-entrant).

    Applying and committing a 500-receipt block allocates ~10^5 objects, nearly all acyclic and freed by their
    reference counts; the cyclic collector still walks them every 700 allocations and promotes the ones still in
    use, so its older generations fill with the ledger's caches and a full pass over them runs every few blocks.
    Measured in bench/ledger_rate.py's blocks (10^4 live receipts): 20-60 ms of collector passes per block (a
    full one, 20-60 ms, every ~4 blocks), against ~1 ms (one young pass after the block) with it paused. Nothing
    is lost: reference cycles made during the block are collected by the next pass after it.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def propose(state: State, candidates: list[Tx], ident: Identity, time_ms: int,
            last_commit: tuple[Any, ...], verified: Callable[[Tx], bool] | None = None
            ) -> tuple[Block, State, list[tuple[Tx, str]]]:
    """Build block ``state.height + 1`` from the applicable ``candidates``. ``verified``: true for candidates
    whose exact signatures were already verified (the mempool's admission check); they are not verified again.

    Returns the block, the state after it and the rejected candidates with reasons.

    Each signature is checked once (by :func:`apply_txs`, in parallel, before any transaction is applied). When
    no candidate is rejected, the working state :func:`apply_txs` built holds exactly the block's transactions
    applied in order, so the block is finished on it (:func:`finish_block`) instead of applied a second time.
    The cyclic garbage collector is paused meanwhile (:func:`paused_gc`).
    """
    with paused_gc():
        return _propose(state, candidates, ident, time_ms, last_commit, verified)


def _propose(state: State, candidates: list[Tx], ident: Identity, time_ms: int, last_commit: tuple[Any, ...],
             verified: Callable[[Tx], bool] | None) -> tuple[Block, State, list[tuple[Tx, str]]]:
    work, accepted, rejected = apply_txs(state, candidates, verified)
    header = Header(state.chain_id, state.height + 1, state.last_hash, time_ms, ident.account,
                    tx_root(accepted), state.state_root(), *validator_hashes(state))
    block = Block(header, tuple(accepted), last_commit)
    if rejected:  # the accepted ones again on a fresh copy, their signatures not checked again
        new_state = apply_block_body(state, header.height, header.hash, accepted, lambda tx: True)
    else:
        new_state = finish_block(work, header.height, header.hash)
    return block, new_state, rejected


def validator_hashes(state: State) -> tuple[bytes, ...]:
    """``(validators_hash, next_validators_hash)`` for block ``state.height + 1`` — the hashes of the sets that
    sign it and the next one (:mod:`node.ledger.core.valset`) — or ``()`` on a chain whose set is fixed in
    genesis (its headers carry neither)."""
    if not state.params.min_validator_bond:
        return ()
    return state.valset().hash, state.next_valset().hash


MAX_CLOCK_SKEW_MS = 30_000  # a proposal's timestamp may differ from a validator's clock by at most this


def check_time(time_ms: int, now_ms: int, parent_ms: int | None = None, skew_ms: int = MAX_CLOCK_SKEW_MS) -> None:
    """A proposed block's timestamp must be within ``skew_ms`` of the validator's clock and not before its
    parent's (Tendermint's BFT time keeps block times monotonic).

    Raises:
        ValueError: the timestamp is outside the allowed skew or goes backwards.
    """
    if abs(time_ms - now_ms) > skew_ms:
        raise ValueError(f"block time {time_ms} is {abs(time_ms - now_ms)} ms from our clock (max {skew_ms} ms)")
    if parent_ms is not None and time_ms < parent_ms:
        raise ValueError("block time goes backwards")


def commit_block(ident: Identity, block: Block, round_: int = 0) -> tuple[Any, ...]:
    """A single validator's commit (its precommit) for ``block``: enough alone on a one-validator chain."""
    return (sign_commit(ident, block.header.chain_id, block.height, block.hash, round_),)


def check_and_apply(state: State, block: Block, commit: Any, verified: Callable[[Tx], bool] | None = None) -> State:
    """Verify ``block`` against ``state`` and its ``commit`` against the validator set; return the new state.
    ``verified``: as :func:`check_block`.

    Raises:
        InvalidBlock: wrong chain, height, parent, state root, proposer, last commit or commit, or a
            transaction that does not apply.
    """
    check_commit(block.header.chain_id, block.height, block.hash, commit, state.valset())
    return check_block(state, block, verified)


def check_block(state: State, block: Block, verified: Callable[[Tx], bool] | None = None) -> State:
    """Everything :func:`check_and_apply` checks except the block's own commit (a proposal being voted on).

    ``verified``: true for a transaction whose exact signed bytes (its id and every signature) this node already
    verified, at its mempool's admission (:meth:`node.ledger.mempool.Mempool.verified`); its signatures are not
    verified again, and every other transaction's are, in parallel, before any applies. A validator has most of a
    busy block's transactions in its mempool already, so its check of the proposal is not one signature check per
    transaction longer than the proposer's build (Tendermint's mempool cache does the same for CheckTx).

    Raises:
        InvalidBlock: as :func:`check_and_apply`.
    """
    with paused_gc():  # (see paused_gc)
        return _check_block(state, block, verified)


def _check_block(state: State, block: Block, verified: Callable[[Tx], bool] | None) -> State:
    h = block.header
    if h.chain_id != state.chain_id:
        raise InvalidBlock(mismatch(h.chain_id, state.chain_id, "block"))
    if h.height != state.height + 1:
        raise InvalidBlock(f"block {h.height} does not follow {state.height}")
    if h.prev_hash != state.last_hash:
        raise InvalidBlock("block does not link to our head")
    if h.state_root != state.state_root():
        raise InvalidBlock("state root differs from our state")
    vs = state.valset()
    if (h.validators_hash, h.next_validators_hash) != (validator_hashes(state) or (b"", b"")):
        raise InvalidBlock("validators_hash / next_validators_hash differ from our state's validator sets")
    if h.proposer not in vs:
        raise InvalidBlock("proposer is not a validator")
    if h.height > 1:
        check_commit(h.chain_id, h.height - 1, state.last_hash, block.last_commit, state.prev_valset())
    try:
        return apply_block_body(state, h.height, block.hash, list(block.txs), verified)
    except InvalidTx as e:
        raise InvalidBlock(f"transaction does not apply: {e}") from None
