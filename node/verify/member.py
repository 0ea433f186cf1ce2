"""A committee member at work: fetch a sampled session's tensors, re-execute it as one prefill, vote.

When a block makes this node a member of a receipt's committee (:mod:`node.ledger.core.state`), the member fetches
the session's step inputs and committed outputs by their Merkle roots — from the worker, or from the requester
if the worker does not answer; both must match the roots in the receipt — runs the span once over the
concatenated inputs, measures :func:`node.compute.compare.distance`, and signs a :class:`~node.ledger.core.tx.Vote`.
A member that cannot re-execute (blob unavailable, out of memory, unknown model) votes ABSTAIN, which never
penalises the worker.

Several models share one swarm, but the committee is drawn from every bonded account (the ledger does not know
which node holds which model). A member drawn for a receipt of another model than its own first fetches that
span's blocks by content hash from the peers announcing them (:mod:`node.verify.blockfetch`, each block checked
against the manifest whose Merkle root is the receipt's model id); when it cannot, it abstains. The ledger accepts
a receipt for any model id, so the fetcher asks for nothing unless enough bonded servers announce the model (genesis
``min_model_servers``), and stays within byte caps and a deadline: a receipt for a model nobody serves gets
ABSTAIN from every member without a byte downloaded or written (:class:`~node.verify.blockfetch.FetchRefused`).
An abstention counts toward neither verdict (:func:`node.ledger.core.committee.tally`); a round where every member
voted without a 2/3 quorum, or that ran ``verdict_timeout`` blocks, escalates to a committee twice as large, from
which members that sent no vote at all are left out (:mod:`node.ledger.core.state`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..blobs import BlobStore, BlobUnavailable, fetch_blob
from ..compute.budget import block_bytes
from ..compute.compare import DEFAULT_TOLERANCE, distance, is_valid, to_ppm
from ..compute.executor import load_torch
from ..compute.model import block_file
from ..duty.parts import NodeParts
from ..duty.seams import Executor, Host, Ledger, ReceiptChecker
from ..duty.verdict import CheckResult
from ..identity import Identity, account_to_str
from ..ledger.core.block import Block
from ..ledger.core.state import SAMPLED, State
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import ABSTAIN, INVALID, VALID, InvalidTx, Receipt, Verdict, Vote
from .blockfetch import BlockFetcher, BlockUnavailable

if TYPE_CHECKING:
    import torch

    from ..compute.offload import StreamedSpan
    from ..compute.span import SpanModel

log = logging.getLogger("tally.verify")
MAX_PENDING = 64  # committee checks waiting for a lane or running; more stay in the queue (1,000 at most)


class OverBudget(Exception):
    """Not even one block of a span fits the member's committee budget: it abstains."""


class CommitteeMember:
    """Watches blocks for committee duty and votes.

    Args:
        load_span: ``load_span(start, end) -> SpanModel`` for the receipt's model (an LRU of spans is kept here).
        model_id: the model this node holds. A receipt of another model is re-executed on blocks ``fetcher``
            brings from peers (checked against that model id), or gets ABSTAIN when there is no fetcher or the
            blocks cannot be had.
        fetcher: :class:`~node.verify.blockfetch.BlockFetcher`, or None (other models: ABSTAIN).
        tolerance: maximum honest distance (see :mod:`node.compute.compare`).
        checkers: receipt type -> :class:`~node.duty.seams.ReceiptChecker` for the receipts other capabilities
            define (fine-tune segments, training-run rounds and aggregates); an inference
            :class:`~node.ledger.core.tx.Receipt` is this member's own :meth:`check`, and a receipt of a type with no
            checker gets ABSTAIN.
        budget: bytes of weights committee duty may hold (:class:`node.compute.budget.MemoryBudget`'s committee
            share), or None (no budget: up to ``max_spans`` spans are kept). Within a budget a span that fits is
            loaded whole (kept spans are dropped, least recently used first, to make room), a larger one is run
            block by block from disk (:class:`node.compute.offload.StreamedSpan`), and one whose single block
            does not fit gets ABSTAIN.
    """

    def __init__(self, ident: Identity, ledger: Ledger, host: Host, blobs: BlobStore, executor: Executor,
                 load_span: Callable[[int, int], SpanModel], model_id: bytes, tolerance: float = DEFAULT_TOLERANCE,
                 max_spans: int = 2, model_dir: Path | None = None, fetcher: BlockFetcher | None = None,
                 checkers: Mapping[type, ReceiptChecker] | None = None, budget: int | None = None) -> None:
        self.ident, self.ledger, self.host, self.blobs, self.executor = ident, ledger, host, blobs, executor
        self.checkers: dict[type, ReceiptChecker] = dict(checkers or {})
        self.model_dir, self.fetcher = model_dir, fetcher
        self.load_span, self.model_id, self.tolerance = load_span, model_id, tolerance
        self._spans: OrderedDict[tuple[object, ...], tuple[SpanModel, int]] = OrderedDict()
        self.max_spans = max_spans
        self.budget = budget
        self._block_bytes: dict[str, int] = {}
        self.streamed = 0  # re-executions run block by block (a span over the budget)
        self.over_budget = 0  # abstentions because not even one block fits the budget
        self._seen: set[tuple[bytes, int]] = set()
        # (receipt, round): a receipt of any module's type (ReceiptRecord.receipt holds each module's own)
        self._send, self._recv = trio.open_memory_channel[tuple[Any, int]](1000)
        self.checked = 0
        self.last_distances: list[float] = []

    @classmethod
    def from_parts(cls, parts: NodeParts, load_span: Callable[[int, int], SpanModel], fetcher: BlockFetcher | None,
                   checkers: Mapping[type, ReceiptChecker], budget: int | None = None) -> CommitteeMember:
        """The node's committee member, built from its parts (:class:`node.duty.parts.NodeParts`: key, ledger,
        host, blobs, executor, model id and ``config.model_dir``) and what only the runtime has: the span loader,
        the block fetcher for other models, and the capabilities' receipt checkers."""
        return cls(parts.ident, parts.ledger, parts.host, parts.blobs, parts.executor, load_span, parts.model_id,
                   model_dir=parts.config.model_dir, fetcher=fetcher, checkers=checkers, budget=budget)

    def memory_view(self) -> dict[str, int]:
        """What committee duty holds now (``/v1/status``): bytes of the spans kept, re-executions run block by block,
        abstentions for want of budget."""
        return {"committee_held": sum(b for _, b in self._spans.values()), "streamed": self.streamed,
                "over_budget": self.over_budget}

    def on_block(self, block: Block, state: State) -> None:
        """Block listener: queue every sampled receipt of the current round that names us and we have not done."""
        for rid in state.open_receipts:
            rec = state.receipts[rid]
            if rec.status == SAMPLED and self.ident.account in rec.committee and (rid, rec.round) not in self._seen:
                self._seen.add((rid, rec.round))
                try:
                    self._send.send_nowait((rec.receipt, rec.round))
                except trio.WouldBlock:
                    log.warning("committee queue full; dropping %s", rid.hex()[:16])

    async def run(self) -> None:
        """Re-execute and vote on queued receipts, in two lanes of one check at a time each: receipts of this
        node's own model, and everything else (other models, whose blocks may have to be fetched, and training
        replays). A slow fetch of another model, up to the fetcher's deadline, never holds back votes on this
        node's own receipts. At most :data:`MAX_PENDING` checks wait or run; the queue holds the rest."""
        own, other, room = trio.Semaphore(1), trio.Semaphore(1), trio.Semaphore(MAX_PENDING)
        async with trio.open_nursery() as n:
            async for receipt, round_ in self._recv:
                await room.acquire()
                lane = own if isinstance(receipt, Receipt | TabReceipt) and receipt.model_id == self.model_id else other
                n.start_soon(self._check_and_vote, receipt, round_, lane, room)

    async def _check_and_vote(self, receipt: Any, round_: int, lane: trio.Semaphore, room: trio.Semaphore) -> None:
        """Check one receipt in ``lane`` (its type's checker, see ``checkers``) and submit the vote; releases
        ``room`` when done."""
        try:
            async with lane:
                try:
                    await load_torch(self.executor)  # the checks decode fetched tensors on the loop
                    result = await self._checker_for(receipt)(self, receipt)
                except Exception:
                    log.exception("re-execution of %s failed", receipt.id.hex()[:16])
                    result = CheckResult(ABSTAIN)
            vote = Vote(self.ledger.chain_id, receipt.id, self.ident.account, round_, result.verdict,
                        to_ppm(result.distance))
            try:
                await self.ledger.submit(vote.signed(self.ident))
            except InvalidTx as e:  # e.g. the round moved on (escalation) while re-executing: nothing to vote on
                log.info("vote on %s refused: %s", receipt.id.hex()[:16], e)
                return
            self.checked += 1
            log.info("voted %s on %s (distance %.3g)", Verdict(result.verdict).label,
                     receipt.id.hex()[:16], result.distance)
        finally:
            room.release()

    def _checker_for(self, receipt: object) -> Callable[[CommitteeMember, Any], Awaitable[CheckResult]]:
        """The check of ``receipt``: the registered checker of its type, this member's own :meth:`check` for an
        inference receipt, else one that raises (the member abstains)."""
        for kind, check in self.checkers.items():
            if isinstance(receipt, kind):
                return check
        return _check_inference

    async def model_dir_for(self, model_id: bytes, holders: Iterable[bytes]) -> Path | None:
        """The dir of ``model_id`` in which this member replays a receipt of another capability: its own model,
        or the whole model fetched by content hash (:meth:`BlockFetcher.ensure_model`, also asking ``holders``,
        accounts); None (the member abstains) without a fetcher or when no peer has it."""
        if model_id == self.model_id:
            return self.model_dir
        if self.fetcher is None:
            return None
        try:
            return await self.fetcher.ensure_model(model_id, [account_to_str(a) for a in holders])
        except (BlockUnavailable, ValueError) as e:
            log.info("abstain: model %s: %s", model_id.hex()[:16], e)
            return None

    async def fetch(self, receipt: Receipt, root: bytes) -> list[torch.Tensor]:
        """Tensors with Merkle root ``root``, from the worker then the requester, checked against the root.

        Raises:
            BlobUnavailable: nobody returned matching tensors.
        """
        return await fetch_blob(self.host, self.blobs, root, [receipt.worker, receipt.requester], timeout=30,
                                keep=False)

    def _span(self, start: int, end: int, model_dir: Path | None = None) -> SpanModel | StreamedSpan:
        """The span ``[start, end)`` of this node's model, or of the (fetched) model in ``model_dir``: a kept or
        newly loaded :class:`SpanModel` (LRU), or a :class:`StreamedSpan` when the budget holds one block of it
        but not all.

        Raises:
            OverBudget: not even one block of it fits the budget.
        """
        # local: compute.span and compute.offload import torch (~2 s); loaded only to re-execute
        from ..compute.offload import StreamedSpan
        from ..compute.span import SpanModel

        key: tuple[object, ...] = (start, end) if model_dir is None else (str(model_dir), start, end)
        if key in self._spans:
            self._spans.move_to_end(key)
            return self._spans[key][0]
        need = 0
        if self.budget is not None:
            where = model_dir if model_dir is not None else self.model_dir
            assert where is not None, "a member with a budget knows its model dir"
            block = self._block_bytes.get(str(where))
            if block is None:
                block = self._block_bytes[str(where)] = block_bytes(where)
            need = block * (end - start)
            if need > self.budget:
                if block > self.budget:
                    self.over_budget += 1
                    raise OverBudget(f"one block ({block >> 20} MiB) is over the committee budget "
                                     f"({self.budget >> 20} MiB)")
                self.streamed += 1
                return StreamedSpan(where, start, end)
            while self._spans and sum(b for _, b in self._spans.values()) + need > self.budget:
                self._spans.popitem(last=False)  # make room: least recently used first
        span = self.load_span(start, end) if model_dir is None else SpanModel(model_dir, start, end)
        self._spans[key] = (span, need)
        while len(self._spans) > self.max_spans:
            self._spans.popitem(last=False)
        return span

    def _holds(self, start: int, end: int) -> bool:
        """Whether this node's own model dir holds every block of ``[start, end)`` (a dir without a model counts
        as holding them: the span loader answers for it)."""
        if self.model_dir is None:
            return True
        return all((self.model_dir / block_file(i)).is_file() for i in range(start, end))

    async def check(self, receipt: Receipt) -> CheckResult:
        """Re-execute ``receipt``'s session and return its :class:`~node.duty.verdict.CheckResult` (the distance of
        :func:`node.compute.compare.distance` between the committed and the re-computed outputs).

        The committed inputs are every step the worker processed: a failover replacement's start with the
        replayed prefix it was not paid for, so they hold at least ``receipt.tokens`` (the billed, last)
        positions. The committed outputs cover the same steps. Tensors travel in the session's codec dtype
        (float16 with ``fp16`` compression): the span runs in float32 on the committed inputs and its output is
        rounded to the committed dtype before the comparison, as the worker's was.
        """
        import torch  # local: torch takes ~2 s to import; a member with nothing to check never loads it

        other = None
        if receipt.model_id != self.model_id or not self._holds(receipt.span_start, receipt.span_end):
            # another model, or this node's own model converted or fetched for one span only (node model add
            # --blocks, node model fetch --blocks): the blocks come from peers, checked against the model id
            if self.fetcher is None:
                return CheckResult(ABSTAIN)
            try:
                other = await self.fetcher.ensure(receipt.model_id, receipt.span_start, receipt.span_end,
                                                  [account_to_str(receipt.worker)])
            except (BlockUnavailable, ValueError) as e:
                log.info("abstain on %s: blocks of model %s: %s", receipt.id.hex()[:16], receipt.model_id.hex()[:16],
                         e)
                return CheckResult(ABSTAIN)
        try:
            inputs = await self.fetch(receipt, receipt.inputs_root)
            outputs = await self.fetch(receipt, receipt.outputs_root)
        except BlobUnavailable as e:
            log.info("abstain on %s: %s", receipt.id.hex()[:16], e)
            return CheckResult(ABSTAIN)
        if sum(t.shape[1] for t in inputs) < receipt.tokens or len(inputs) != len(outputs):
            return CheckResult(INVALID)
        x = torch.cat(inputs, dim=1)
        y = torch.cat(outputs, dim=1)
        if not (x.is_floating_point() and y.is_floating_point()):
            return CheckResult(INVALID)
        try:
            span = await self.executor.run(self._span, receipt.span_start, receipt.span_end, other)
        except OverBudget as e:
            log.info("abstain on %s: %s", receipt.id.hex()[:16], e)
            return CheckResult(ABSTAIN)
        try:
            y_hat = await self.executor.run(span.prefill, x.float())
            y_hat = y_hat.to(y.dtype)
        except (RuntimeError, MemoryError) as e:  # out of memory and the like: not the worker's fault
            log.warning("abstain on %s: %s", receipt.id.hex()[:16], e)
            return CheckResult(ABSTAIN)
        d = distance(y, y_hat)
        self.last_distances.append(d)
        return CheckResult(VALID if is_valid(d, self.tolerance) else INVALID, d)


async def _check_inference(member: CommitteeMember, receipt: Receipt, /) -> CheckResult:
    """The :class:`~node.duty.seams.ReceiptChecker` of an inference receipt: :meth:`CommitteeMember.check`.

    Raises:
        TypeError: ``receipt`` is of a type no checker was registered for (the member abstains on it).
    """
    if not isinstance(receipt, Receipt | TabReceipt):  # a revealed tab receipt is checked as any inference receipt
        raise TypeError(f"no committee check for {type(receipt).__name__}")
    return await member.check(receipt)
