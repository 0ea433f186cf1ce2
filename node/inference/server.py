"""Serving a span: the inference-session protocol, span announcements and the blob protocol.

Inference session (``/tally/inference/1.0.0``), one stream per session, every message a framed msgpack map:

  client → ``{"type": "open", "session_id": 16 B, "model_id": 32 B, "start", "end", "max_length"}``
  server → ``{"status": "ok", "height": opened_height}``
  client → ``{"type": "step", "hidden": tensor (1, t, hidden) float32}``  (repeated)
  server → ``{"status": "ok", "hidden": tensor (1, t, hidden)}``; the server keeps the KV cache
  client → ``{"type": "close"}``
  server → ``{"status": "ok", "receipt": receipt wire signed by the worker}``

The requester of a session is the authenticated remote peer (its Noise-verified peer ID is its account). Any bad
frame gets an error reply and ends the session; the node keeps serving others. The session's step inputs and
outputs are kept as content-addressed blobs for committee re-execution (``/tally/blob/1.0.0``).
"""

from __future__ import annotations

import logging
import os
import time

import torch
import trio

from ..blobs import BlobStore
from ..encoding import DecodeError, tensor_from_wire, tensor_to_wire
from ..identity import Identity, account_from_str
from ..ledger.tx import Receipt
from ..p2p.framing import error_reply, read_msg, write_msg
from ..encoding import pack

log = logging.getLogger("tally.inference")

INFERENCE_PROTOCOL = "/tally/inference/1.0.0"
BLOB_PROTOCOL = "/tally/blob/1.0.0"
ANNOUNCE_PERIOD = 5.0  # seconds between span announcements
TTL_PERIODS = 3  # an announcement expires after this many periods (expiry strictly longer than the refresh)


class SessionError(ValueError):
    """A request that cannot be served; carries an error ``code`` for the reply."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class SpanServer:
    """Serves one :class:`~node.compute.span.SpanModel` to clients and signs a receipt per session.

    Args:
        ident: the worker's identity (signs receipts).
        chain_id: the ledger's chain id.
        span: the loaded span.
        executor: :class:`~node.compute.executor.TorchExecutor` (torch never runs on the event loop).
        blobs: where session inputs/outputs are kept.
        height: callable returning the current ledger height (recorded in receipts).
        price_per_token_block: base units per token × block (genesis parameter).
        step_timeout: seconds a session may wait for the next message before its cache is freed.
    """

    def __init__(self, ident: Identity, chain_id: str, span, executor, blobs: BlobStore, height,
                 price_per_token_block: int, step_timeout: float = 60.0, max_sessions: int = 32):
        self.ident, self.chain_id, self.span, self.executor, self.blobs = ident, chain_id, span, executor, blobs
        self.height = height
        self.price = price_per_token_block
        self.step_timeout = step_timeout
        self.max_sessions = max_sessions
        self.active = 0
        self.sessions_served = 0
        self.tokens_served = 0

    def announcement(self, addrs: list[str], seq: int, period: float) -> dict:
        """A span announcement. ``seq`` grows with every refresh: gossip de-duplicates identical content, so
        a refresh must never be byte-identical to the last one."""
        return {"peer": self.ident.peer_id, "model_id": self.span.model_id, "start": self.span.start,
                "end": self.span.end, "addrs": addrs, "active": self.active, "seq": seq,
                "ttl": period * TTL_PERIODS}

    async def announce_loop(self, host, period: float = ANNOUNCE_PERIOD) -> None:
        """Publish this span on ``tally/<chain>/shards`` every ``period`` seconds; each announcement is valid
        for ``TTL_PERIODS × period`` seconds."""
        seq = 0
        while True:
            seq = max(seq + 1, time.time_ns() // 1_000_000)  # grows across restarts too
            await host.publish(host.topic("shards"), pack(self.announcement(host.addrs, seq, period)))
            await trio.sleep(period)

    def _check_open(self, msg: dict) -> tuple[bytes, int]:
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
        if not isinstance(max_length, int) or not 0 < max_length <= self.span.max_length:
            raise SessionError("too_long", f"max_length must be in 1..{self.span.max_length}")
        if self.active >= self.max_sessions:
            raise SessionError("busy", "too many sessions")
        return sid, max_length

    def _check_step(self, msg: dict, tokens: int, max_length: int) -> torch.Tensor:
        hidden = tensor_from_wire(msg.get("hidden"))
        if hidden.dtype != torch.float32 or hidden.dim() != 3 or hidden.shape[0] != 1 \
                or hidden.shape[2] != self.span.hidden_size or hidden.shape[1] < 1:
            raise SessionError("bad_tensor", f"hidden states must be float32 (1, tokens, {self.span.hidden_size})")
        if tokens + hidden.shape[1] > max_length:
            raise SessionError("too_long", f"session would exceed its max_length {max_length}")
        if not torch.isfinite(hidden).all():
            raise SessionError("bad_tensor", "hidden states must be finite")
        return hidden

    async def handle(self, stream, peer: str) -> None:
        """Serve one session on ``stream`` from ``peer`` (the requester)."""
        try:
            msg = await read_msg(stream, timeout=self.step_timeout)
            sid, max_length = self._check_open(msg)
        except (SessionError, DecodeError) as e:
            await write_msg(stream, error_reply(getattr(e, "code", "bad_request"), str(e)))
            return
        requester = account_from_str(peer)
        opened = self.height()
        self.active += 1
        cache = self.span.new_cache()
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        tokens = 0
        try:
            await write_msg(stream, {"status": "ok", "height": opened})
            while True:
                msg = await read_msg(stream, timeout=self.step_timeout)
                kind = msg.get("type")
                if kind == "step":
                    try:
                        hidden = self._check_step(msg, tokens, max_length)
                    except (SessionError, DecodeError) as e:
                        await write_msg(stream, error_reply(getattr(e, "code", "bad_tensor"), str(e)))
                        return
                    out = await self.executor.run(self.span.forward, hidden, cache)
                    inputs.append(hidden)
                    outputs.append(out)
                    tokens += hidden.shape[1]
                    self.tokens_served += hidden.shape[1]
                    await write_msg(stream, {"status": "ok", "hidden": tensor_to_wire(out)})
                elif kind == "close":
                    if tokens == 0:
                        await write_msg(stream, error_reply("empty", "no tokens processed"))
                        return
                    receipt = self._receipt(sid, requester, tokens, inputs, outputs, opened)
                    await write_msg(stream, {"status": "ok", "receipt": receipt.to_wire()})
                    self.sessions_served += 1
                    return
                else:
                    await write_msg(stream, error_reply("bad_request", f"unknown message type {kind!r}"))
                    return
        finally:
            self.active -= 1
            del cache

    def _receipt(self, sid: bytes, requester: bytes, tokens: int, inputs, outputs, opened: int) -> Receipt:
        in_root = self.blobs.put(inputs)
        out_root = self.blobs.put(outputs)
        blocks = self.span.end - self.span.start
        r = Receipt(self.chain_id, sid, self.ident.account, requester, self.span.model_id, self.span.start,
                    self.span.end, tokens, in_root, out_root, tokens * blocks * self.price, opened)
        return r.sign_worker(self.ident)


async def blob_handler(blobs: BlobStore, stream, peer: str) -> None:
    """``{"type": "get", "root": 32 B}`` → ``{"status": "ok", "tensors": [...]}`` or ``not_found``."""
    msg = await read_msg(stream, timeout=10, max_message=1 << 12)
    root = msg.get("root")
    wire = blobs.get_wire(root) if isinstance(root, bytes) else None
    if wire is None:
        await write_msg(stream, error_reply("not_found", "no such blob"))
    else:
        await write_msg(stream, {"status": "ok", "tensors": wire})


def new_session_id() -> bytes:
    return os.urandom(16)
