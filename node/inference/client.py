"""The client side of inference: routing (over the swarm table, :mod:`node.inference.swarm`), failover and greedy
generation through a route.

The client holds the embedding, final norm and LM head (:class:`~node.compute.head.ClientHead`) and sends hidden
states ``(1, tokens, hidden)`` through one session per hop (protocol: :mod:`node.inference.server`). Every reply
is checked (dtype, shape, finite values) before it is forwarded. After each step the client computes the
session's running receipt from what it sent and received (:mod:`node.inference.receipts`), countersigns it and
acknowledges it: in the ``ack`` field of the next step (or of ``close``) where the server offers ``inline_acks``,
which saves one message per hop per token, else at once in an ``ack`` message; before it pauses for ``on_token``
or gives up a session, every acknowledgement is sent at once. It keeps the server's signature over the same
receipt.

Routing: :func:`~node.compute.shards.choose_route` over the live announcements (measured throughput, latency,
free cache) plus the client's own measured round trips; deterministic for equal inputs.

Failover: when a hop fails (EOF or reset, timeout, error reply, malformed or non-finite output) the client
retires it — keeping the worker-signed receipt for every output it received, which it countersigns and submits
— and routes around it: a replacement chain covering the same blocks, excluding the failed peer, is opened with
``replay = P`` (the positions the dead server processed), fed those ``P`` positions' inputs as one unbilled
step, then the step that failed. Generation continues at the right position, and no position is paid twice.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from ..blobs import BlobStore
from ..compute.shards import NoRouteError, SpanInfo, choose_route
from ..encoding import DecodeError
from ..identity import Identity, account_from_str, verify
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import Receipt
from ..p2p.framing import FrameError, RemoteError, RequestTimeout, StreamClosed, check_reply, read_msg, write_msg
from ..p2p.host import PeerUnreachable
from ..p2p.quirks import exception_leaves
from .receipts import CLOCK, ReceiptState, RunningReceipt, SessionTerms, TabTerms, store_blob, wire_commitment
from .seams import ClientHost, ClientLedger, ClientStream, Executor, Head
from .server import CONTROL_MAX, INFERENCE_PROTOCOL, new_session_id
from .swarm import SwarmTable
from .tabseam import RequesterTabs, tab_reply
from .wire import WireParts, check_codec, decode_hidden, encode_hidden

if TYPE_CHECKING:
    import torch

    from ..compute.model import Manifest

ROUTE_WARM_PERIOD = 2.0  # seconds between re-plans of the route kept connected (RouteClient.keep_route_connected)
ROUTE_WARM_MAX = 8  # servers of one route kept connected ahead of a generation
# A new generation whose route is not covered waits this long (seconds) for announcements before NoRouteError: an
# announcement lives 3 refresh periods, and on a loaded machine a refresh can arrive after its predecessor lapsed
ROUTE_WAIT = 5.0
ROUTE_POLL = 0.1  # seconds between two looks at the swarm table meanwhile

log = logging.getLogger("tally.client")

Route = list[tuple[str, int, int]]  # [(peer, start, end), ...] of a generation's hops, in order
# ``await on_token(index, token, route)`` after each new token (index from 1)
OnToken = Callable[[int, int, Route], Awaitable[object]]


class PromptTooLong(ValueError):
    """The prompt plus the tokens to generate exceed the model's maximum length."""


class HopFailed(RuntimeError):
    """A server returned an error, a malformed response or a bad receipt, or no replacement could be found."""


HOP_ERRORS = (StreamClosed, RequestTimeout, FrameError, RemoteError, PeerUnreachable, HopFailed, DecodeError)


@dataclass
class Hop:
    """One session with one server. ``inputs``/``outputs``: the step tensors as they travelled (codec dtype).
    ``signed``: ``((billed, inputs_root, outputs_root), receipt id, worker_sig, requester_sig)`` for the newest
    billed step, covering ``signed_steps``."""

    peer: str
    start: int
    end: int
    codec: str = "none"
    replay: int = 0
    stream: ClientStream | None = None  # the session's stream (py-libp2p's or in-memory); None once closed
    session_id: bytes = b""
    opened_height: int = 0
    rr: RunningReceipt | None = None
    tab_id: bytes | None = None  # the tab this session is paid through, held until it is settled
    inputs: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    signed: tuple[ReceiptState, bytes, bytes, bytes] | None = None
    signed_steps: int = 0
    broken: Exception | None = None
    acking: trio.Event | None = None  # set when the last acknowledgement has been written
    inline_acks: bool = False  # the server takes acknowledgements inside step and close messages
    pending_ack: tuple[int, bytes] | None = None  # (steps, countersignature) for the next step or close to carry
    sent_positions: int = 0  # positions whose output was received (receipts may lag until the round's end)

    @property
    def positions(self) -> int:
        return self.sent_positions


@dataclass
class Failover:
    """One hop replaced: while generating token ``token`` (1-based), ``dead`` serving ``span`` failed with
    ``error``; ``replacement`` peers took over after replaying ``replayed`` positions."""

    token: int
    dead: str
    span: tuple[int, int]
    replacement: list[str]
    replayed: int
    error: str


@dataclass
class Generation:
    prompt_ids: list[int]
    tokens: list[int]
    receipts: list[Receipt | TabReceipt]
    route: list[tuple[str, int, int]]
    seconds: float
    failovers: list[Failover] = field(default_factory=list)
    compression: str = "none"
    first_token_s: float | None = None  # seconds from the call to the first new token (None: not measured)


# a step whose receipt work waits for the round's end: (hop, input parts, output parts, positions, worker signature;
# None for an unbilled step)
_Pending = tuple[Hop, WireParts, WireParts, int, bytes | None]


@dataclass
class _Run:
    total: int
    codec: str
    hops: list[Hop]
    retired: list[Hop] = field(default_factory=list)
    failovers: list[Failover] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)
    pending: list[_Pending] = field(default_factory=list)  # steps whose receipt work waits for the round's end
    bg: trio.Nursery | None = None  # nursery for acknowledgements


OPEN_TIMEOUT = 10.0  # seconds to open a session's stream to a server before failing over


# the client's head: a RouteClient[LazyHead] (the node's) or RouteClient[ClientHead] keeps its head's own type
HeadT = TypeVar("HeadT", bound=Head, covariant=True)


class RouteClient(Generic[HeadT]):
    """Generates text through a route of span servers and settles each session with a countersigned receipt.

    Args:
        ident: the requester's identity. host: :class:`~node.p2p.host.P2PHost`. head: ClientHead.
        manifest: the model's manifest. ledger: anything with ``chain_id``, ``genesis.params`` and
        ``async submit(tx)`` (LedgerService). executor: TorchExecutor. blobs: BlobStore. swarm: SwarmTable.
        step_timeout: seconds to wait for each reply. compression: default codec (:mod:`node.inference.wire`).
        max_failovers: replacements allowed per generation. submit: submit receipts to the ledger.
        open_timeout: seconds to wait for a session's stream to a server (then it fails over).
    """

    def __init__(self, ident: Identity, host: ClientHost, head: HeadT, manifest: Manifest, ledger: ClientLedger,
                 executor: Executor, blobs: BlobStore, swarm: SwarmTable, step_timeout: float = 60.0,
                 compression: str = "none", max_failovers: int = 4, submit: bool = True,
                 tabs: RequesterTabs | None = None, open_timeout: float = OPEN_TIMEOUT):
        self.ident, self.host, self.head, self.manifest = ident, host, head, manifest
        self.open_timeout = open_timeout
        self.tabs = tabs  # sessions paid through tabs (node.inference.tabseam), or None: one receipt each
        self.ledger, self.executor, self.blobs, self.swarm = ledger, executor, blobs, swarm
        self.step_timeout = step_timeout
        self.compression = check_codec(compression)
        self.max_failovers = max_failovers
        self.submit = submit
        self._dialing: dict[str, trio.Event] = {}  # peer -> set when the dial in flight to it ends

    def check_length(self, n_prompt: int, max_new_tokens: int) -> int:
        """Total session length; raises :class:`PromptTooLong` before any session is opened."""
        total = n_prompt + max_new_tokens
        if n_prompt < 1 or max_new_tokens < 1:
            raise PromptTooLong("need at least one prompt token and one new token")
        if total > self.manifest.max_length:
            raise PromptTooLong(f"prompt of {n_prompt} tokens + {max_new_tokens} new tokens = {total} "
                                f"exceeds the model's maximum length of {self.manifest.max_length} tokens")
        return total

    def _plan(self, need: int, start: int = 0, end: int | None = None,
              exclude: Collection[str] = frozenset()) -> list[SpanInfo]:
        return choose_route(self.swarm.infos(self.manifest.model_id), self.manifest.num_blocks, start, end,
                            exclude=set(exclude) | {self.host.peer_id}, need_cache=need, rtt=self.swarm.rtt)

    async def _first_plan(self, need: int, wait: float = ROUTE_WAIT) -> list[SpanInfo]:
        """The route of a new generation (``need`` tokens of cache per hop). While the live announcements do not
        cover every block, look again every :data:`ROUTE_POLL` seconds for up to ``wait`` seconds: a server whose
        refresh arrived late is back within a period (failover mid-generation does not wait: it excludes the
        dead hop and plans at once).

        Raises:
            NoRouteError: still no route after ``wait`` seconds (the blocks nobody serves named).
        """
        deadline = trio.current_time() + wait
        while True:
            try:
                return self._plan(need)
            except NoRouteError:
                if trio.current_time() >= deadline:
                    raise
            await trio.sleep(ROUTE_POLL)

    def route(self) -> list[tuple[str, int, int]]:
        """The route a generation would take now, ``[(peer, start, end), ...]`` (raises NoRouteError)."""
        return [(s.peer, s.start, s.end) for s in self._plan(0)]

    async def keep_route_connected(self, period: float = ROUTE_WARM_PERIOD) -> None:
        """Keep a connection open to each server of the route a generation would take now, re-planned every
        ``period`` seconds and whenever a server announces a new span, so that the first generation after the
        swarm is covered opens its sessions on connections that exist (issue 25: a dial through a relay — TCP,
        Noise, yamux and the hello, several round trips — otherwise lands on the first token). Dials are in
        parallel, at most :data:`ROUTE_WARM_MAX` peers, each bounded by ``step_timeout``; a failed dial is one
        DEBUG line and is retried at the next period. Runs until cancelled."""
        while True:
            try:
                peers = list(dict.fromkeys(s.peer for s in self._plan(0)))[:ROUTE_WARM_MAX]
            except NoRouteError:
                peers = []
            connected = set(self.host.connected_peers())
            missing = [p for p in peers if p not in connected]
            if missing:
                async with trio.open_nursery() as n:
                    for peer in missing:
                        n.start_soon(self._warm_dial, peer)
            with trio.move_on_after(period):
                await self.swarm.changed.wait()

    async def _warm_dial(self, peer: str) -> None:
        try:
            with trio.move_on_after(self.step_timeout):
                await self._dial(peer)
        except HOP_ERRORS as e:
            log.debug("could not connect ahead to route server %s: %s: %s", peer[:16], type(e).__name__, e)

    # ------------------------------------------------------------------ one hop

    async def _dial(self, peer: str) -> None:
        """Connect to ``peer`` at the addresses it announced (only addresses naming it) if not connected. A dial
        to ``peer`` already in flight (:meth:`keep_route_connected`'s, or another generation's) is waited for, not
        raced by a second one: through a relay each dial costs several round trips and a circuit."""
        if peer in self.host.connected_peers():
            return
        pending = self._dialing.get(peer)
        if pending is not None:
            with trio.move_on_after(self.step_timeout):
                await pending.wait()
            if peer in self.host.connected_peers():
                return
        e = self.swarm.entries.get(peer)
        addrs = [a for a in (e["addrs"] if e else []) if isinstance(a, str) and a.endswith("/p2p/" + peer)]
        if not addrs:
            return
        done = self._dialing[peer] = trio.Event()
        try:
            await self.host.connect(addrs[:4], timeout=self.step_timeout)
        finally:
            done.set()
            if self._dialing.get(peer) is done:
                del self._dialing[peer]

    async def _open(self, hop: Hop, max_length: int) -> None:
        if self.tabs is None:
            return await self._open_session(hop, max_length)
        price = self.ledger.genesis.params.price_per_token_block
        worker = account_from_str(hop.peer)
        hop.tab_id = await self.tabs.acquire(worker, max_length * (hop.end - hop.start) * price)
        try:
            await self._open_session(hop, max_length)
        except BaseException:
            self.tabs.release(worker, hop.tab_id, None)
            hop.tab_id = None
            raise

    async def _open_session(self, hop: Hop, max_length: int) -> None:
        t0 = time.perf_counter()
        await self._dial(hop.peer)
        t1 = time.perf_counter()
        hop.stream = await self.host.open_stream(hop.peer, INFERENCE_PROTOCOL, timeout=self.open_timeout)
        t2 = time.perf_counter()
        hop.session_id = new_session_id()
        opening: dict[str, Any] = {"type": "open", "session_id": hop.session_id, "model_id": self.manifest.model_id,
                                   "start": hop.start, "end": hop.end, "max_length": max_length,
                                   "compression": hop.codec, "replay": hop.replay}
        if hop.tab_id is not None:
            opening["tab"] = hop.tab_id
            opening["tab_height"] = self.ledger.state.height  # the worker waits for this block if it lacks the tab
        await write_msg(hop.stream, opening)
        reply = check_reply(await read_msg(hop.stream, timeout=self.step_timeout, max_message=CONTROL_MAX))
        log.debug("session on %s opened: dial %.3f s, stream %.3f s, open %.3f s", hop.peer[:16], t1 - t0,
                  t2 - t1, time.perf_counter() - t2)
        height = reply.get("height")
        if not isinstance(height, int) or isinstance(height, bool) or height < 0:
            raise HopFailed(f"server {hop.peer[:16]} sent a bad opened height")
        hop.opened_height = height
        hop.inline_acks = reply.get("inline_acks") is True
        price = self.ledger.genesis.params.price_per_token_block
        tab = None
        if hop.tab_id is not None:
            got = tab_reply(reply.get("tab"))
            if got is None:
                raise HopFailed(f"server {hop.peer[:16]} did not name the session's tab nonce and amount owed")
            if self.tabs is not None and not self.tabs.check_before(hop.tab_id, got[1]):
                raise HopFailed(f"server {hop.peer[:16]} claims {got[1]} owed on the tab, more than was signed")
            tab = TabTerms(hop.tab_id, got[0], got[1])
        hop.rr = RunningReceipt(SessionTerms(self.ledger.chain_id, hop.session_id, account_from_str(hop.peer),
                                             self.ident.account, self.manifest.model_id, hop.start, hop.end,
                                             height, hop.codec, hop.replay, price, tab))

    async def _ack(self, hop: Hop, steps: int, sig: bytes, done: trio.Event) -> None:
        try:
            assert hop.stream is not None  # an abandoned hop sends nothing more
            await write_msg(hop.stream, {"type": "ack", "steps": steps, "sig": sig})
        except Exception as e:  # noqa: BLE001 - the next step fails over; the output is already ours and signed
            hop.broken = hop.broken or e
        finally:
            done.set()

    async def _step(self, hop: Hop, hidden: torch.Tensor, run: _Run) -> torch.Tensor:
        """Send ``hidden`` ``(1, t, hidden)`` through ``hop``; returns its float32 output of the same shape.

        The step's receipt work (commitments, running receipt, countersignature, acknowledgement) is queued in
        ``run.pending`` and done by :meth:`_flush` at the end of the round, for all hops together."""
        if hop.acking is not None:
            await hop.acking.wait()  # one writer per stream at a time; in practice long done
        if hop.broken is not None:
            raise hop.broken
        t0 = time.perf_counter()
        wire, sent, in_parts = encode_hidden(hidden, hop.codec, commit=False)
        n = sent.shape[1]
        msg: dict[str, Any] = {"type": "step", "hidden": wire}
        if hop.pending_ack is not None:
            steps, sig = hop.pending_ack
            msg["ack"] = {"steps": steps, "sig": sig}
        assert hop.stream is not None  # open from the session's open until the hop is abandoned
        await write_msg(hop.stream, msg)
        hop.pending_ack = None
        reply = check_reply(await read_msg(hop.stream, timeout=self.step_timeout))
        out, out_parts = decode_hidden(reply.get("hidden"), hop.codec, self.manifest.hidden_size, n, positions=n,
                                       commit=False)
        billed = hop.sent_positions + n > hop.replay
        wsig = reply.get("sig")
        if billed and not (isinstance(wsig, bytes) and len(wsig) == 64):
            raise HopFailed(f"server {hop.peer[:16]} did not sign its receipt")
        hop.inputs.append(sent)
        hop.outputs.append(out)
        hop.sent_positions += n
        run.pending.append((hop, in_parts, out_parts, n, wsig if isinstance(wsig, bytes) else None))
        if n == 1:
            e = self.swarm.entries.get(hop.peer)
            self.swarm.observe_rtt(hop.peer, time.perf_counter() - t0 - (e["latency"] if e else 0.0))
        return out.float()

    async def _flush(self, run: _Run, inline: bool = True) -> None:
        """The receipt work of the steps queued since the last flush, for all hops at once (it then runs with warm
        caches): commitments (a hop's input is the previous hop's output: hashed once), running receipts,
        countersignatures. Each hop's acknowledgement then waits for its next step or close where the server
        takes them inline and ``inline`` is true; otherwise it is written at once (:meth:`_send_ack`).
        """
        pending, run.pending = run.pending, []
        acks = []
        with CLOCK:
            prev_parts: WireParts | None = None  # the previous hop's output: this hop's input, already hashed
            prev_c = b""
            for hop, in_parts, out_parts, n, wsig in pending:
                c_in = prev_c if in_parts == prev_parts else wire_commitment(*in_parts)
                c_out = wire_commitment(*out_parts)
                prev_parts, prev_c = out_parts, c_out
                assert hop.rr is not None  # set when the session opened, before its first step
                rid = hop.rr.append(c_in, c_out, n)
                if rid is not None:
                    assert wsig is not None  # a billed step's reply is signed (checked by _step)
                    csig = self.ident.sign(rid)
                    hop.signed, hop.signed_steps = (hop.rr.state, rid, wsig, csig), hop.rr.steps
                    acks.append((hop, hop.rr.steps, csig))
        for hop, steps, csig in acks:
            if inline and hop.inline_acks:
                hop.pending_ack = (steps, csig)  # the newest countersignature covers every earlier step
            else:
                hop.pending_ack = None
                await self._send_ack(run, hop, steps, csig)

    async def _send_ack(self, run: _Run, hop: Hop, steps: int, csig: bytes) -> None:
        """Write ``hop``'s acknowledgement as an ``ack`` message: in the background (``run.bg``) or inline."""
        hop.acking = trio.Event()
        if run.bg is not None:
            run.bg.start_soon(self._ack, hop, steps, csig, hop.acking)
        else:
            await self._ack(hop, steps, csig, hop.acking)

    async def _release_acks(self, run: _Run) -> None:
        """Send every acknowledgement still waiting for a step or close as an ``ack`` message now (before the
        client pauses, or gives up its sessions)."""
        for hop in run.hops:
            if hop.pending_ack is not None and hop.stream is not None and hop.broken is None:
                (steps, csig), hop.pending_ack = hop.pending_ack, None
                await self._send_ack(run, hop, steps, csig)

    async def _close(self, hop: Hop) -> None:
        if hop.acking is not None:
            await hop.acking.wait()
        try:
            msg: dict[str, Any] = {"type": "close"}
            if hop.pending_ack is not None:
                steps, sig = hop.pending_ack
                msg["ack"] = {"steps": steps, "sig": sig}
                hop.pending_ack = None
            assert hop.stream is not None  # the hops closed are those still open
            await write_msg(hop.stream, msg)
            reply = check_reply(await read_msg(hop.stream, timeout=self.step_timeout, max_message=CONTROL_MAX))
            if reply.get("steps") != hop.signed_steps:
                log.warning("server %s holds our countersignature for %s of %d steps", hop.peer[:16],
                            reply.get("steps"), hop.signed_steps)
        except HOP_ERRORS as e:  # the server has our acks already; its receipt is unaffected
            log.info("close of session with %s failed: %s", hop.peer[:16], e)

    def _settle(self, hop: Hop) -> Receipt | TabReceipt | None:
        """The countersigned receipt for every output received from ``hop`` (None if none was billed or the
        server's signature does not match); stores the session's blobs for the committee; releases its tab."""
        r = self._settled(hop)
        if hop.tab_id is not None and self.tabs is not None:
            self.tabs.release(account_from_str(hop.peer), hop.tab_id,
                              r.cumulative if isinstance(r, TabReceipt) else None)
            hop.tab_id = None
        return r

    def _settled(self, hop: Hop) -> Receipt | TabReceipt | None:
        if hop.signed is None or hop.rr is None:  # rr is set with the session, before anything is signed
            return None
        state, rid, wsig, csig = hop.signed
        r = hop.rr.receipt_of(*state)
        with CLOCK:
            ok = verify(r.worker, rid, wsig)
        if not ok:
            log.warning("server %s signed a receipt other than the session's; not paying it", hop.peer[:16])
            return None
        store_blob(self.blobs, r.inputs_root, hop.inputs[:hop.signed_steps])
        store_blob(self.blobs, r.outputs_root, hop.outputs[:hop.signed_steps])
        return replace(r, worker_sig=wsig, requester_sig=csig)

    # ------------------------------------------------------------------ routes and failover

    async def _open_all(self, run: _Run) -> None:
        async def one(hop: Hop) -> None:
            try:
                await self._open(hop, run.total)
            except HOP_ERRORS as e:
                hop.broken = e

        async with trio.open_nursery() as n:
            for hop in run.hops:
                n.start_soon(one, hop)
        i = 0
        while i < len(run.hops):
            broken = run.hops[i].broken
            if broken is not None:
                i += await self._replace(run, i, broken, 0)
            else:
                i += 1

    async def _replace(self, run: _Run, i: int, err: Exception, token: int) -> int:
        """Replace the failed ``run.hops[i]`` by a chain covering its blocks, opened and replayed; returns the
        number of hops spliced in.

        Raises:
            HopFailed: more than ``max_failovers`` replacements in this generation.
            NoRouteError: no other server covers those blocks.
        """
        dead = run.hops[i]
        log.warning("hop %s [%d, %d) failed at token %d: %s: %s", dead.peer[:16], dead.start, dead.end, token,
                    type(err).__name__, err)
        run.excluded.add(dead.peer)
        await _abort(dead)
        run.retired.append(dead)
        prefix, positions = list(dead.inputs), dead.positions
        while True:
            if len(run.failovers) >= self.max_failovers:
                raise HopFailed(f"gave up after {len(run.failovers)} failovers; last error: {err}") from err
            sub = self._plan(run.total, dead.start, dead.end, run.excluded)
            new = [Hop(s.peer, s.start, s.end, run.codec, replay=positions) for s in sub]
            run.failovers.append(Failover(token, dead.peer, (dead.start, dead.end), [h.peer for h in new],
                                          positions, f"{type(err).__name__}: {err}"))
            current = None
            try:
                for current in new:
                    await self._open(current, run.total)
                x = _cat(prefix)
                for current in new:
                    if x is not None:
                        x = await self._step(current, x, run)  # the replayed prefix: unbilled
            except HOP_ERRORS as e:
                if current is not None:
                    run.excluded.add(current.peer)
                for h in new:
                    await _abort(h)
                err = e
                continue
            run.hops[i:i + 1] = new
            log.info("replaced %s by %s after replaying %d positions", dead.peer[:16],
                     ", ".join(h.peer[:16] for h in new), positions)
            return len(new)

    async def _forward(self, run: _Run, hidden: torch.Tensor, token: int) -> torch.Tensor:
        """One round: ``hidden`` through every hop (failing over as needed). The round's receipt work is left in
        ``run.pending`` for the caller to flush."""
        i = 0
        while i < len(run.hops):
            try:
                hidden = await self._step(run.hops[i], hidden, run)
                i += 1
            except HOP_ERRORS as e:
                await self._flush(run)  # the failed hop's receipt covers every output received from it
                await self._replace(run, i, e, token)  # then step through the replacement at the same index
        return hidden

    def _next(self, hidden: torch.Tensor, embed: bool) -> tuple[int, torch.Tensor | None]:
        """Executor thread: the greedy next token after ``hidden`` (1, t, hidden) and, if ``embed``, its
        embedding (1, 1, hidden) for the next round (one thread hop for both)."""
        tok = self.head.next_token(hidden)
        return tok, self.head.embed_ids([tok]) if embed else None

    async def _finish(self, run: _Run, close: bool) -> list[Receipt | TabReceipt]:
        """Close (or abort) every session, settle and submit the receipts of all hops, retired ones included."""
        run.bg = None
        await self._flush(run, inline=close)  # closing: the last acknowledgements ride on the close messages
        if not close:
            await self._release_acks(run)
        if close:
            for hop in run.hops:
                await self._close(hop)
        retired = {id(h) for h in run.retired}
        hops = run.retired + [h for h in run.hops if id(h) not in retired]  # a failed hop not yet replaced
        for hop in hops:
            await _abort(hop)
        receipts = [r for r in (self._settle(h) for h in hops) if r is not None]
        if self.submit:
            for r in receipts:
                if isinstance(r, TabReceipt):
                    continue  # paid through its tab: the worker commits to it in its epoch batch
                try:
                    await self.ledger.submit(r)
                except Exception as e:  # noqa: BLE001 - one receipt that fails to submit must not lose the others
                    log.warning("could not submit receipt %s: %s", r.id.hex()[:16], e)
        return receipts

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, compression: str | None = None,
                       on_token: OnToken | None = None) -> Generation:
        """Greedy generation of ``max_new_tokens`` tokens after ``prompt_ids`` through the swarm.

        Args:
            compression: codec for this generation (default: the client's), recorded in every receipt.
            on_token: optional ``async on_token(index, token, route)`` called after each new token (index from
                1; ``route`` the current ``[(peer, start, end), ...]``).

        Returns the new tokens, the countersigned receipts (already submitted to the ledger, replaced hops'
        included), the failovers, ``seconds`` (the whole call) and ``first_token_s`` (seconds until the first new
        token; the rest is later tokens and settling the sessions).

        Raises:
            PromptTooLong: checked before any session opens (no receipt, no charge).
            ValueError: unknown compression.
            NoRouteError: the live announcements do not cover every block (at the start after waiting up to
                :data:`ROUTE_WAIT` seconds for them; when failing over, at once).
            HopFailed: too many failovers. Work received before a failure is still settled and paid.
        """
        total = self.check_length(len(prompt_ids), max_new_tokens)
        codec = check_codec(compression or self.compression)
        t0 = time.perf_counter()
        run = _Run(total, codec, [Hop(s.peer, s.start, s.end, codec) for s in await self._first_plan(total)])
        first: float | None = None
        try:
            # a lazy head: built there. None after the last token (the next round's input is not embedded)
            hidden: torch.Tensor | None = await self.executor.run(lambda: self.head.embed_ids(prompt_ids))
            t_embed = time.perf_counter()
            await self._open_all(run)  # then the first step follows at once (servers time out idle sessions)
            t_open = time.perf_counter()
            new: list[int] = []
            try:
                async with trio.open_nursery() as run.bg:  # acknowledgements, written off the critical path
                    while True:
                        assert hidden is not None  # None only once the last token is generated (loop ended)
                        hidden = await self._forward(run, hidden, len(new) + 1)
                        await self._flush(run)  # the round's receipt work, before the LM head (no GIL contention)
                        tok, hidden = await self.executor.run(self._next, hidden, len(new) + 1 < max_new_tokens)
                        new.append(tok)
                        if first is None:
                            first = time.perf_counter() - t0
                            log.debug("first token after %.3f s: embed %.3f s, open %d sessions %.3f s, "
                                      "first step %.3f s", first, t_embed - t0, len(run.hops), t_open - t_embed,
                                      first - (t_open - t0))
                        if on_token is not None:
                            await self._release_acks(run)  # the caller may pause: acknowledge everything now
                            for h in run.hops:  # this token's acknowledgements are on the wire first
                                if h.acking is not None:
                                    await h.acking.wait()
                            await on_token(len(new), tok, [(h.peer, h.start, h.end) for h in run.hops])
                        if len(new) >= max_new_tokens:
                            break
            except BaseExceptionGroup as eg:  # the nursery wraps even a lone error: surface it as itself
                leaves = exception_leaves(eg)
                if len(leaves) == 1:
                    raise leaves[0] from None
                raise
        except Exception:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                await self._finish(run, close=False)  # pay for what was received
            raise
        receipts = await self._finish(run, close=True)
        return Generation(list(prompt_ids), new, receipts, [(h.peer, h.start, h.end) for h in run.hops],
                          time.perf_counter() - t0, run.failovers, codec, first)


async def _abort(hop: Hop) -> None:
    if hop.stream is None:
        return
    stream, hop.stream = hop.stream, None
    # the hop is abandoned: a reset that fails changes nothing
    with trio.CancelScope(shield=True), trio.move_on_after(1.0), contextlib.suppress(Exception):
        await stream.reset()


def _cat(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """``parts`` (each ``(1, tokens, hidden)``) as one tensor along the positions; None when there are none."""
    import torch  # local: torch takes ~2 s to import; a node that never generates never loads it

    return torch.cat(parts, dim=1) if parts else None
