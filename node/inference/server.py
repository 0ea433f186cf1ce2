"""Serving a span: the inference-session protocol, running receipts, span announcements and the blob protocol.

Inference session (``/tally/inference/2.0.0``), one stream per session, every message a framed msgpack map:

  client → ``{"type": "open", "session_id": 16 B, "model_id": 32 B, "start", "end", "max_length",
             "compression": "none" | "fp16" | "zstd" | "fp16+zstd", "replay": P}``
  server → ``{"status": "ok", "height": opened_height, "inline_acks": true}``
  client → ``{"type": "step", "hidden": wire (1, t, hidden), "ack": {"steps": n, "sig": 64 B}}``   (repeated)
  server → ``{"status": "ok", "hidden": wire (1, t, hidden), "sig": 64 B}``
  client → ``{"type": "ack", "steps": n, "sig": 64 B}``                                (no reply)
  client → ``{"type": "close", "ack": {"steps": n, "sig": 64 B}}``
  server → ``{"status": "ok", "steps": n}``

``sig`` in a step reply is the worker's signature over the id of the receipt for the session so far
(:mod:`node.inference.receipts`); it is absent while only replayed positions (``P``, a failover's prefix that
was billed to another server) have been processed. ``ack`` carries the requester's countersignature over the
receipt after step ``n``. A server that says ``inline_acks`` in its open reply also takes that acknowledgement
as an ``ack`` field of the next ``step`` or of ``close`` (it is taken before the step runs): a client then sends
no separate ``ack`` message while it generates: one message fewer per hop per token, of three (a message through
py-libp2p 0.8.1's Noise + Yamux on trio costs about 0.5 ms of CPU at each end on loopback, ~20 trio scheduler
passes, measured with a 2.3 KB echo between two processes). A client that pauses between tokens sends its
acknowledgements at once as ``ack`` messages; so does every client of a server without ``inline_acks`` (the field is
optional both ways: older clients and servers keep working). Wire tensors and codecs: :mod:`node.inference.wire`.

The requester is the authenticated remote peer (its Noise-verified peer ID is its account). When a session ends
— closed, or the client vanished (EOF, reset, or no message within ``step_timeout``), or a bad message — the
server frees the KV cache at once, keeps the session's step tensors as blobs for committee re-execution
(``/tally/blob/1.0.0``) and submits the countersigned receipt for exactly the steps the client acknowledged.
A bad message gets an error frame and the peer a lower score (:mod:`node.p2p.scoring`); the server keeps
serving everyone else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import trio

from ..blobs import BlobStore
from ..discovery.publisher import SpanFields
from ..duty.seams import Executor
from ..encoding import DecodeError, pack
from ..identity import Identity, account_from_str, verify
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import Receipt
from ..p2p.framing import FrameError, RequestTimeout, StreamClosed, error_reply, read_msg, write_msg
from ..p2p.scoring import BAD_REQUEST, BAD_SIGNATURE, MALFORMED_FRAME
from .receipts import CLOCK, ReceiptState, RunningReceipt, SessionTerms, TabTerms, store_blob, wire_commitment
from .seams import AnnounceHost, Height, Penalize, SessionStream, Submit, TabWait
from .tabseam import WorkerTabs
from .wire import CODECS, decode_hidden, encode_hidden

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache

    from ..compute.span import SpanModel

log = logging.getLogger("tally.inference")

INFERENCE_PROTOCOL = "/tally/inference/2.0.0"
ANNOUNCE_PERIOD = 5.0  # seconds between span announcements
TTL_PERIODS = 3  # an announcement expires after this many periods (expiry strictly longer than the refresh)
ADDR_CHECK = 0.5  # seconds between checks for a changed address, announced at once (node.net: relay reservations)
CONTROL_MAX = 1 << 12  # bytes: open, ack and close messages
VERIFY_EVERY = 32  # check a client's countersignature eagerly every this many acks (and always at the end)
EWMA = 0.2


class SessionError(ValueError):
    """A request that cannot be served; carries an error ``code`` for the reply."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def check_announce_timing(period: float, ttl: float) -> None:
    """Raise ValueError unless ``0 < period < ttl``: an announcement must outlive the refresh that replaces it."""
    if not (period > 0 and ttl > period):
        raise ValueError(f"announcement ttl ({ttl} s) must be strictly longer than the refresh period ({period} s)")


@dataclass
class ServerStats:
    """Measured speed of this span, announced to clients. Seconds; EWMA over one-token steps."""

    latency: float = 0.0  # a one-token step from request read to reply written, queueing included
    compute: float = 0.0  # the span's forward of one token

    def observe(self, latency: float, compute: float) -> None:
        self.latency = latency if self.latency == 0 else (1 - EWMA) * self.latency + EWMA * latency
        self.compute = compute if self.compute == 0 else (1 - EWMA) * self.compute + EWMA * compute

    @property
    def throughput(self) -> float:
        """Tokens per second through the whole span in decoding steps (0 until measured)."""
        return 1.0 / self.compute if self.compute > 0 else 0.0


@dataclass
class Settled:
    """A session that ended: its countersigned receipt (None if nothing billed was acknowledged), how it ended
    (``closed``, ``vanished``, ``error``), the steps processed and the steps the receipt covers."""

    session_id: bytes
    requester: str
    receipt: Receipt | TabReceipt | None
    reason: str
    steps: int
    acked: int


@dataclass
class _Session:
    sid: bytes
    peer: str
    max_length: int
    codec: str
    rr: RunningReceipt
    cache: DynamicCache | None  # None once the session ended (freed)
    inputs: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    history: list[ReceiptState] = field(default_factory=list)  # per step: (billed, inputs_root, outputs_root)
    acks: dict[int, bytes] = field(default_factory=dict)  # steps -> requester signature
    verified: int = 0  # steps covered by the latest ack whose signature verified
    bad_acks: int = 0


class SpanServer:
    """Serves one :class:`~node.compute.span.SpanModel` to clients, with a running receipt per session.

    Args:
        ident: the worker's identity (signs receipts).  chain_id: the ledger's signing domain (``genesis.domain``:
        chain id and genesis hash, :mod:`node.ledger.core.domain`), which every receipt binds.
        span: the loaded span.  executor: :class:`~node.compute.executor.TorchExecutor`.
        blobs: where session inputs/outputs are kept.  height: callable returning the ledger height.
        price_per_token_block: base units per token × block (genesis parameter).
        step_timeout: seconds a session may wait for the client's next message before it is ended and its
            cache freed.
        max_sessions: sessions open at once.  cache_tokens: KV-cache positions reserved by open sessions at
            most (each session reserves its ``max_length``); default ``max_sessions × span.max_length``.
        submit: ``async submit(receipt)`` (the ledger); None: receipts are only kept in :attr:`settled`.
        penalize: ``penalize(peer_id, weight)`` (the host's peer scoring); None: no scoring.
        max_batch: concurrent one-token steps of different sessions run as one batch (:mod:`.batching`).
        inline_acks: offer clients to carry acknowledgements in ``step`` and ``close`` messages (see the
            module docstring; False: answer as a server that predates them, for tests of older peers).

    Attributes (counters): ``ack_messages`` (separate ``ack`` messages read), ``inline_acks_read`` (acks
    carried by a ``step`` or ``close``).
    """

    def __init__(self, ident: Identity, chain_id: str, span: SpanModel, executor: Executor, blobs: BlobStore,
                 height: Height, price_per_token_block: int, step_timeout: float = 60.0, max_sessions: int = 32,
                 cache_tokens: int | None = None, submit: Submit | None = None, penalize: Penalize | None = None,
                 max_batch: int = 8, inline_acks: bool = True, tabs: WorkerTabs | None = None,
                 tab_wait: TabWait | None = None):
        self.ident, self.chain_id, self.span, self.executor, self.blobs = ident, chain_id, span, executor, blobs
        self.height = height
        self.price = price_per_token_block
        self.step_timeout = step_timeout
        self.max_sessions = max_sessions
        self.cache_tokens = cache_tokens if cache_tokens is not None else max_sessions * span.max_length
        self.submit, self.penalize = submit, penalize
        self.tabs = tabs  # sessions paid through tabs (node.inference.tabseam): checked at open, receipts kept
        # ``await tab_wait(height)``: until this node holds block ``height`` (bounded): a tab just included reaches
        # this node a little after the requester saw it, so a tab unknown here is looked for again once it has
        self.tab_wait = tab_wait
        self.active = 0
        self.reserved = 0
        self.sessions_served = 0
        self.tokens_served = 0
        self.stats = ServerStats()
        # local: batching imports torch (~2 s); a node imports this module to name the protocol, serving no span
        from .batching import StepBatcher

        self.batcher = StepBatcher(span, executor, max_batch=max_batch)
        self.settled: deque[Settled] = deque(maxlen=256)
        self.inline_acks = inline_acks
        self.ack_messages = 0
        self.inline_acks_read = 0

    @property
    def free_cache(self) -> int:
        """KV-cache positions still available to new sessions (tokens)."""
        return max(0, self.cache_tokens - self.reserved)

    async def measure(self, repeats: int = 3) -> float:
        """Time one-token forwards on a fresh cache to seed :attr:`stats` before any client arrives.

        Returns the measured seconds per one-token forward.
        """
        def bench() -> float:
            import torch  # local: torch takes ~2 s to import; only a node that serves a span measures one

            cache = self.span.new_cache()
            x = torch.zeros(1, 1, self.span.hidden_size)
            self.span.forward(x, cache)  # warm-up
            t0 = time.perf_counter()
            for _ in range(repeats):
                self.span.forward(x, cache)
            return (time.perf_counter() - t0) / repeats

        sec = await self.executor.run(bench)
        self.stats.observe(sec, sec)
        return sec

    def announcement(self, addrs: list[str], seq: int, period: float, ttl: float | None = None) -> dict[str, Any]:
        """A span announcement: who serves which blocks, measured ``throughput`` (tokens/s through the span),
        ``latency`` (s per one-token step, queueing included) and ``free_cache`` (tokens). ``seq`` grows with
        every refresh: gossip de-duplicates identical content, so a refresh must never repeat the last one."""
        return {"peer": self.ident.peer_id, "model_id": self.span.model_id, "start": self.span.start,
                "end": self.span.end, "addrs": addrs, "active": self.active, "seq": seq,
                "ttl": period * TTL_PERIODS if ttl is None else ttl, "throughput": self.stats.throughput,
                "latency": self.stats.latency, "free_cache": self.free_cache}

    def record_fields(self) -> SpanFields:
        """What this server's DHT record says (:func:`node.discovery.publisher.publish_loop`): the announcement's
        model, span and measurements."""
        return SpanFields(self.span.model_id, self.span.start, self.span.end, float(self.stats.throughput),
                          float(self.stats.latency), int(self.free_cache))

    async def announce_loop(self, host: AnnounceHost, period: float = ANNOUNCE_PERIOD,
                            ttl: float | None = None) -> None:
        """Publish this span on ``tally/<chain>/shards`` every ``period`` seconds, each announcement valid for
        ``ttl`` seconds (default ``TTL_PERIODS × period``).

        Raises:
            ValueError: at start, unless ``ttl > period`` (:func:`check_announce_timing`).
        """
        ttl = period * TTL_PERIODS if ttl is None else ttl
        check_announce_timing(period, ttl)
        seq = 0
        while True:
            seq = max(seq + 1, time.time_ns() // 1_000_000)  # grows across restarts too
            sent = list(host.addrs)
            await host.publish(host.topic("shards"), pack(self.announcement(sent, seq, period, ttl)))
            due = trio.current_time() + period
            # a changed address (a relay reservation made or lost) is announced at once, not a period later
            while trio.current_time() < due and list(host.addrs) == sent:
                await trio.sleep(min(ADDR_CHECK, max(due - trio.current_time(), 0)))

    # ------------------------------------------------------------------ session protocol

    def _open(self, msg: dict[str, Any], peer: str) -> _Session:
        if msg.get("type") != "open":
            raise SessionError("bad_request", "first message must be open")
        sid = msg.get("session_id")
        if not (isinstance(sid, bytes) and len(sid) == 16):
            raise SessionError("bad_request", "session_id must be 16 bytes")
        if msg.get("model_id") != self.span.model_id:
            raise SessionError("wrong_model", "this server holds another model")
        if (msg.get("start"), msg.get("end")) != (self.span.start, self.span.end):
            raise SessionError("wrong_span", f"this server holds blocks [{self.span.start}, {self.span.end})")
        max_length = msg.get("max_length")
        if not isinstance(max_length, int) or isinstance(max_length, bool) or \
                not 0 < max_length <= self.span.max_length:
            raise SessionError("too_long", f"max_length must be in 1..{self.span.max_length}")
        codec = msg.get("compression", "none")
        if codec not in CODECS:
            raise SessionError("bad_request", f"compression must be one of {', '.join(CODECS)}")
        replay = msg.get("replay", 0)
        if not isinstance(replay, int) or isinstance(replay, bool) or not 0 <= replay < max_length:
            raise SessionError("bad_request", "replay must be in 0..max_length-1")
        if self.active >= self.max_sessions or self.reserved + max_length > self.cache_tokens:
            raise SessionError("busy", "too many sessions or no KV cache left")
        requester = account_from_str(peer)
        tab = None
        if self.tabs is not None:  # this chain pays through tabs: the session opens on one (issue 37)
            tab_id = msg.get("tab")
            if not (isinstance(tab_id, bytes) and len(tab_id) == 32):
                raise SessionError("no_tab", "this chain pays through tabs: open the session on one (32-byte id)")
            max_price = max_length * (self.span.end - self.span.start) * self.price
            try:
                nonce, before = self.tabs.open(requester, tab_id, max_price)
            except ValueError as e:
                raise SessionError(getattr(e, "code", "no_tab"), str(e)) from None
            tab = TabTerms(tab_id, nonce, before)
        terms = SessionTerms(self.chain_id, sid, self.ident.account, requester, self.span.model_id,
                             self.span.start, self.span.end, self.height(), codec, replay, self.price, tab)
        return _Session(sid, peer, max_length, codec, RunningReceipt(terms), self.span.new_cache())

    def _offence(self, peer: str, weight: float) -> None:
        if self.penalize is not None:
            self.penalize(peer, weight)

    async def _refuse(self, stream: SessionStream, peer: str, e: Exception) -> None:
        """Answer a bad message with an error frame and penalize its sender (best effort, bounded)."""
        weight = MALFORMED_FRAME if isinstance(e, FrameError) else BAD_REQUEST
        self._offence(peer, weight)
        code = getattr(e, "code", "bad_frame" if isinstance(e, FrameError) else "bad_request")
        with trio.move_on_after(2.0):
            with contextlib.suppress(StreamClosed, RequestTimeout, FrameError):
                await write_msg(stream, error_reply(code, str(e)))

    async def handle(self, stream: SessionStream, peer: str) -> None:
        """Serve one session on ``stream`` from ``peer`` (the requester); see the module docstring."""
        try:
            opening = await read_msg(stream, timeout=self.step_timeout, max_message=CONTROL_MAX)
            try:
                sess = self._open(opening, peer)
            except SessionError as e:
                seen = opening.get("tab_height")  # the requester saw its tab (or top-up) in this block
                if e.code not in ("no_tab", "tab_low") or self.tab_wait is None or not (
                        isinstance(seen, int) and not isinstance(seen, bool) and seen > self.height()):
                    raise
                await self.tab_wait(seen)
                sess = self._open(opening, peer)
        except (SessionError, FrameError, DecodeError, ValueError) as e:
            await self._refuse(stream, peer, e)
            return
        self.active += 1
        self.reserved += sess.max_length
        reason = "error"
        try:
            opened: dict[str, Any] = {"status": "ok", "height": sess.rr.terms.opened_height}
            tab = sess.rr.terms.tab
            if tab is not None:
                opened["tab"] = [tab.nonce, tab.before]
            if self.inline_acks:
                opened["inline_acks"] = True
            await write_msg(stream, opened)
            reason = await self._serve(stream, sess)
        except (StreamClosed, RequestTimeout) as e:
            reason = "vanished"
            log.info("session %s from %s ended without close: %s", sess.sid.hex()[:12], peer[:16], e)
        except (SessionError, FrameError, DecodeError) as e:
            await self._refuse(stream, peer, e)
        except Exception as e:  # our fault (out of memory, a bug): no penalty, but the session still settles
            log.exception("session %s from %s failed", sess.sid.hex()[:12], peer[:16])
            with trio.move_on_after(2.0):
                with contextlib.suppress(StreamClosed, RequestTimeout, FrameError):
                    await write_msg(stream, error_reply("internal", f"{type(e).__name__}: {e}"))
        finally:
            self.active -= 1
            self.reserved -= sess.max_length
            sess.cache = None  # the KV cache is freed here, whatever happened
        receipt = self._settle(sess, reason)
        try:
            if receipt is not None and self.submit is not None:
                try:
                    await self.submit(receipt)  # to the ledger, or (tabs) into the epoch book
                except Exception as e:  # noqa: BLE001 - the requester may submit the same receipt; never crash here
                    log.warning("could not submit receipt %s: %s", receipt.id.hex()[:16], e)
        finally:
            if sess.rr.terms.tab is not None and self.tabs is not None:
                self.tabs.close(sess.rr.terms.tab.tab_id)  # after its receipt is kept: the next session's before

    async def _serve(self, stream: SessionStream, sess: _Session) -> str:
        """The step/ack/close loop; returns how the session ended. Raises on a bad or missing message."""
        hidden_size = self.span.hidden_size
        step_max = sess.max_length * hidden_size * 4 * 101 // 100 + 4096
        while True:
            msg = await read_msg(stream, timeout=self.step_timeout, max_message=step_max)
            kind = msg.get("type")
            if kind in ("step", "close") and "ack" in msg and self.inline_acks:  # (an older server ignores it)
                if not isinstance(msg["ack"], dict):
                    raise SessionError("bad_request", "the ack field must be a map of steps and sig")
                self._take_ack(sess, msg["ack"])
                self.inline_acks_read += 1
            if kind == "step":
                t0 = time.perf_counter()
                hidden, in_parts = decode_hidden(msg.get("hidden"), sess.codec, hidden_size,
                                                 sess.max_length - sess.rr.positions, commit=False)
                n = hidden.shape[1]
                t1 = time.perf_counter()
                assert sess.cache is not None  # freed only when the session ends
                out = await self.batcher.forward(hidden.float(), sess.cache)
                t2 = time.perf_counter()
                wire, sent, out_parts = encode_hidden(out, sess.codec, commit=False)
                reply: dict[str, Any] = {"status": "ok", "hidden": wire}
                with CLOCK:  # all of a step's receipt work in one go: after the first hash, caches are warm
                    rid = sess.rr.append(wire_commitment(*in_parts), wire_commitment(*out_parts), n)
                    if rid is not None:
                        reply["sig"] = self.ident.sign(rid)
                sess.history.append(sess.rr.state)
                sess.inputs.append(hidden)
                sess.outputs.append(sent)
                self.tokens_served += n
                await write_msg(stream, reply)
                if n == 1:
                    self.stats.observe(time.perf_counter() - t0, t2 - t1)
            elif kind == "ack":
                self._take_ack(sess, msg)
                self.ack_messages += 1
            elif kind == "close":
                n = self._best_ack(sess)
                await write_msg(stream, {"status": "ok", "steps": n})
                self.sessions_served += 1
                return "closed"
            else:
                raise SessionError("bad_request", f"unknown message type {kind!r}")

    def _take_ack(self, sess: _Session, ack: dict[str, Any]) -> None:
        """Record the requester's countersignature ``{"steps": n, "sig": 64 B}`` over the receipt after step ``n``
        (an ``ack`` message, or the ``ack`` field of a ``step`` or ``close``); every ``VERIFY_EVERY`` acks the
        newest is verified at once.

        Raises:
            SessionError: ``bad_request`` (steps not in 1..processed, an unbilled step, not a 64-byte
                signature) or ``bad_ack`` (a countersignature that does not verify).
        """
        n, sig = ack.get("steps"), ack.get("sig")
        if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= sess.rr.steps
                and isinstance(sig, bytes) and len(sig) == 64 and sess.history[n - 1][0] > 0):
            raise SessionError("bad_request", "ack needs steps in 1..steps processed (billed) and a "
                                              "64-byte signature")
        sess.acks[n] = sig
        if len(sess.acks) % VERIFY_EVERY == 0 and self._best_ack(sess) < n:
            raise SessionError("bad_ack", "countersignature does not match this session's receipt")

    def _receipt_at(self, sess: _Session, steps: int) -> Receipt | TabReceipt | None:
        state = sess.history[steps - 1]
        return sess.rr.receipt_of(*state) if state[0] > 0 else None

    def _best_ack(self, sess: _Session) -> int:
        """Steps covered by the newest acknowledgement whose countersignature verifies (0 if none)."""
        requester = sess.rr.terms.requester
        for n in sorted(sess.acks, reverse=True):
            if n <= sess.verified:
                break
            state = sess.history[n - 1]
            with CLOCK:
                ok = state[0] > 0 and verify(requester, sess.rr.id_of(*state), sess.acks[n])
            if ok:
                sess.verified = n
                break
            sess.bad_acks += 1
            del sess.acks[n]
            self._offence(sess.peer, BAD_SIGNATURE)
        return sess.verified

    def _settle(self, sess: _Session, reason: str) -> Receipt | TabReceipt | None:
        """Bookkeeping at the end of a session: the countersigned receipt for the acknowledged steps, its blobs."""
        n = self._best_ack(sess)
        receipt = None
        if n > 0:
            r = self._receipt_at(sess, n)
            if r is not None:
                with CLOCK:
                    receipt = replace(r.sign_worker(self.ident), requester_sig=sess.acks[n])
                store_blob(self.blobs, r.inputs_root, sess.inputs[:n])
                store_blob(self.blobs, r.outputs_root, sess.outputs[:n])
        self.settled.append(Settled(sess.sid, sess.peer, receipt, reason, sess.rr.steps, n))
        log.info("session %s from %s settled (%s): %d steps processed, %d acknowledged, receipt %s",
                 sess.sid.hex()[:12], sess.peer[:16], reason, sess.rr.steps, n,
                 receipt.id.hex() if receipt is not None else "none")
        sess.inputs.clear()
        sess.outputs.clear()
        return receipt


async def blob_handler(blobs: BlobStore, stream: SessionStream, peer: str) -> None:
    """``{"type": "get", "root": 32 B}`` → ``{"status": "ok", "tensors": [...]}`` or ``not_found``."""
    msg = await read_msg(stream, timeout=10, max_message=1 << 12)
    root = msg.get("root")
    wire = blobs.get_wire(root) if isinstance(root, bytes) else None
    if wire is None:
        await write_msg(stream, error_reply("not_found", "no such blob"))
    else:
        await write_msg(stream, {"status": "ok", "tensors": wire})


def new_session_id() -> bytes:
    """A fresh random 16-byte session id."""
    return os.urandom(16)
