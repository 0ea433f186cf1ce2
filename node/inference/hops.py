"""One hop of a route, as the client runs it: the session with one span server (protocol:
:mod:`node.inference.server`) opened, stepped, acknowledged, closed and settled, and the state a generation keeps
per hop (:class:`Hop`) and per route (:class:`RouteRun`).

:class:`HopSessions` is the base of :class:`~node.inference.client.RouteClient` (routing, failover and generation
build on it). Every reply is checked (dtype, shape, finite values) before it is forwarded. After each step the
client computes the session's running receipt from what it sent and received (:mod:`node.inference.receipts`),
countersigns it and acknowledges it: in the ``ack`` field of the next step (or of ``close``) where the server offers
``inline_acks``, which saves one message per hop per token, else at once in an ``ack`` message; before it pauses or
gives up a session, every acknowledgement is sent at once. It keeps the server's signature over the same receipt:
the worker-signed receipt for every output received is what the client countersigns and submits when a hop fails.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import trio

from ..blobs import BlobStore
from ..encoding import DecodeError
from ..identity import Identity, account_from_str, verify
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import Receipt
from ..p2p.framing import FrameError, RemoteError, RequestTimeout, StreamClosed, check_reply, read_msg, write_msg
from ..p2p.host import PeerUnreachable
from .receipts import CLOCK, ReceiptState, RunningReceipt, SessionTerms, TabTerms, store_blob, wire_commitment
from .seams import ClientHost, ClientLedger, ClientStream
from .server import CONTROL_MAX, INFERENCE_PROTOCOL, new_session_id
from .swarm import SwarmTable
from .tabseam import RequesterTabs, tab_reply
from .wire import WireParts, decode_hidden, encode_hidden

if TYPE_CHECKING:
    import torch

    from ..compute.model import Manifest

OPEN_TIMEOUT = 10.0  # seconds to open a session's stream to a server before failing over

log = logging.getLogger("tally.client")  # the client's logger: its lines keep their name


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
        """Positions this hop's server processed (replay included)."""
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


# a step whose receipt work waits for the round's end: (hop, input parts, output parts, positions, worker signature;
# None for an unbilled step)
PendingStep = tuple[Hop, WireParts, WireParts, int, bytes | None]


@dataclass
class RouteRun:
    """One generation's route as it runs: ``total`` positions per session, the ``codec``, the ``hops`` in order,
    the ``retired`` (failed and replaced) hops, the ``failovers``, the peers ``excluded`` from replacements, the
    steps whose receipt work waits for the round's end (``pending``) and the nursery acknowledgements are written
    in (``bg``; None: written inline)."""

    total: int
    codec: str
    hops: list[Hop]
    retired: list[Hop] = field(default_factory=list)
    failovers: list[Failover] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)
    pending: list[PendingStep] = field(default_factory=list)  # steps whose receipt work waits for the round's end
    bg: trio.Nursery | None = None  # nursery for acknowledgements


class HopSessions:
    """The client's sessions with span servers, one per :class:`Hop`: dialling, opening (on a tab when the chain pays
    through tabs), steps, acknowledgements, closing and settling (the module docstring). The base of
    :class:`~node.inference.client.RouteClient`, which holds the rest of its arguments.

    Args:
        ident: the requester's identity.  host: the host (:class:`~node.inference.seams.ClientHost`).
        manifest: the model's manifest.  ledger: the ledger (:class:`~node.inference.seams.ClientLedger`).
        blobs: where sessions' tensors are kept for the committee.  swarm: the swarm table (announced addresses,
        measured round trips).  step_timeout: seconds to wait for each reply.  tabs: the requester's tabs
        (:mod:`node.inference.tabseam`), or None: every session is paid by its own receipt.
        open_timeout: seconds to wait for a session's stream to a server (then it fails over).
    """

    def __init__(self, ident: Identity, host: ClientHost, manifest: Manifest, ledger: ClientLedger, blobs: BlobStore,
                 swarm: SwarmTable, step_timeout: float = 60.0, tabs: RequesterTabs | None = None,
                 open_timeout: float = OPEN_TIMEOUT):
        self.ident, self.host, self.manifest = ident, host, manifest
        self.open_timeout = open_timeout
        self.tabs = tabs  # sessions paid through tabs (node.inference.tabseam), or None: one receipt each
        self.ledger, self.blobs, self.swarm = ledger, blobs, swarm
        self.step_timeout = step_timeout
        self._dialing: dict[str, trio.Event] = {}  # peer -> set when the dial in flight to it ends

    async def _dial(self, peer: str) -> None:
        """Connect to ``peer`` at the addresses it announced (only addresses naming it) if not connected. A dial
        to ``peer`` already in flight (:meth:`RouteClient.keep_route_connected`'s, or another generation's) is
        waited for, not raced by a second one: through a relay each dial costs several round trips and a circuit."""
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

    async def _step(self, hop: Hop, hidden: torch.Tensor, run: RouteRun) -> torch.Tensor:
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

    async def _flush(self, run: RouteRun, inline: bool = True) -> None:
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

    async def _send_ack(self, run: RouteRun, hop: Hop, steps: int, csig: bytes) -> None:
        """Write ``hop``'s acknowledgement as an ``ack`` message: in the background (``run.bg``) or inline."""
        hop.acking = trio.Event()
        if run.bg is not None:
            run.bg.start_soon(self._ack, hop, steps, csig, hop.acking)
        else:
            await self._ack(hop, steps, csig, hop.acking)

    async def _release_acks(self, run: RouteRun) -> None:
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


async def abort_hop(hop: Hop) -> None:
    """Abandon ``hop``'s session: its stream is reset (best effort, bounded, shielded) and forgotten."""
    if hop.stream is None:
        return
    stream, hop.stream = hop.stream, None
    # the hop is abandoned: a reset that fails changes nothing
    with trio.CancelScope(shield=True), trio.move_on_after(1.0), contextlib.suppress(Exception):
        await stream.reset()
