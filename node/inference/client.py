"""The client side of inference: the swarm table, route planning and greedy generation through a route.

The client holds the embedding, final norm and LM head (:class:`~node.compute.head.ClientHead`) and sends hidden
states ``(1, tokens, hidden)`` through one session per hop. Each response is checked (dtype, shape, finite
values) before it is forwarded. At the end every server returns a worker-signed receipt; the client checks that
it commits to exactly the inputs it sent and the outputs it received, at the genesis price, and only then
countersigns it and submits it to the ledger.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
import trio

from ..blobs import BlobStore
from ..compute.shards import plan_route
from ..encoding import DecodeError, commitments_root, tensor_from_wire, tensor_to_wire, unpack
from ..identity import Identity, account_from_str
from ..ledger.tx import InvalidTx, Receipt, decode_tx
from ..p2p.framing import check_reply, read_msg, write_msg
from .server import INFERENCE_PROTOCOL, new_session_id

MAX_TTL = 300.0  # seconds; a longer announced ttl is clamped

log = logging.getLogger("tally.client")


class PromptTooLong(ValueError):
    """The prompt plus the tokens to generate exceed the model's maximum length."""


class HopFailed(RuntimeError):
    """A server returned an error, a malformed response or a bad receipt."""


@dataclass
class SwarmTable:
    """Span announcements heard on ``tally/<chain>/shards``: peer → (model_id, start, end, addrs, seen_at)."""

    entries: dict[str, dict] = field(default_factory=dict)
    clock: object = time.monotonic

    async def on_announcement(self, data: bytes, from_peer: str) -> None:
        try:
            a = unpack(data, max_size=1 << 14)
            if a.get("peer") != from_peer:  # gossip messages are signed: the sender must be the announcer
                return
            start, end = int(a["start"]), int(a["end"])
            ttl = min(MAX_TTL, max(0.0, float(a["ttl"])))
            prev = self.entries.get(from_peer)
            if prev is not None and int(a["seq"]) <= prev["seq"]:
                return  # stale or replayed announcement
            self.entries[from_peer] = {"model_id": bytes(a["model_id"]), "start": start, "end": end,
                                       "addrs": list(a.get("addrs", []))[:8], "seen": self.clock(), "ttl": ttl,
                                       "active": int(a.get("active", 0)), "seq": int(a["seq"]),
                                       "refreshes": (prev["refreshes"] + 1) if prev else 0}
        except (DecodeError, KeyError, TypeError, ValueError) as e:
            log.debug("bad announcement from %s: %s", from_peer, e)

    def live(self, model_id: bytes) -> list[tuple[str, int, int]]:
        now = self.clock()
        return [(p, e["start"], e["end"]) for p, e in sorted(self.entries.items())
                if e["model_id"] == model_id and now - e["seen"] < e["ttl"]]


@dataclass
class Hop:
    peer: str
    start: int
    end: int
    stream: object = None
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    session_id: bytes = b""
    opened_height: int = 0


@dataclass
class Generation:
    prompt_ids: list[int]
    tokens: list[int]
    receipts: list[Receipt]
    route: list[tuple[str, int, int]]
    seconds: float


class RouteClient:
    """Generates text through a route of span servers and settles each session with a countersigned receipt.

    Args:
        ident: the requester's identity. host: :class:`~node.p2p.host.P2PHost`. head: ClientHead.
        manifest: the model's manifest (model id, number of blocks, max length). ledger: LedgerService (for
        submitting receipts). executor: TorchExecutor. blobs: BlobStore. price_per_token_block: genesis price.
    """

    def __init__(self, ident: Identity, host, head, manifest, ledger, executor, blobs: BlobStore,
                 swarm: SwarmTable, step_timeout: float = 60.0):
        self.ident, self.host, self.head, self.manifest = ident, host, head, manifest
        self.ledger, self.executor, self.blobs, self.swarm = ledger, executor, blobs, swarm
        self.step_timeout = step_timeout

    def check_length(self, n_prompt: int, max_new_tokens: int) -> int:
        """Total session length; raises :class:`PromptTooLong` before any session is opened."""
        total = n_prompt + max_new_tokens
        if n_prompt < 1 or max_new_tokens < 1:
            raise PromptTooLong("need at least one prompt token and one new token")
        if total > self.manifest.max_length:
            raise PromptTooLong(f"prompt of {n_prompt} tokens + {max_new_tokens} new tokens = {total} "
                                f"exceeds the model's maximum length of {self.manifest.max_length} tokens")
        return total

    def route(self) -> list[tuple[str, int, int]]:
        return plan_route(self.swarm.live(self.manifest.model_id), self.manifest.num_blocks)

    async def _open(self, hop: Hop, max_length: int) -> None:
        hop.stream = await self.host.open_stream(hop.peer, INFERENCE_PROTOCOL)
        hop.session_id = new_session_id()
        await write_msg(hop.stream, {"type": "open", "session_id": hop.session_id,
                                     "model_id": self.manifest.model_id, "start": hop.start, "end": hop.end,
                                     "max_length": max_length})
        reply = check_reply(await read_msg(hop.stream, timeout=self.step_timeout))
        hop.opened_height = int(reply.get("height", 0))

    async def _step(self, hop: Hop, hidden: torch.Tensor) -> torch.Tensor:
        await write_msg(hop.stream, {"type": "step", "hidden": tensor_to_wire(hidden)})
        reply = check_reply(await read_msg(hop.stream, timeout=self.step_timeout))
        out = tensor_from_wire(reply.get("hidden"))
        if out.dtype != torch.float32 or out.shape != hidden.shape or not torch.isfinite(out).all():
            raise HopFailed(f"server {hop.peer[:16]} returned {out.dtype} {tuple(out.shape)} "
                            f"(expected float32 {tuple(hidden.shape)}, finite)")
        hop.inputs.append(hidden)
        hop.outputs.append(out)
        return out

    async def _close(self, hop: Hop) -> Receipt:
        await write_msg(hop.stream, {"type": "close"})
        reply = check_reply(await read_msg(hop.stream, timeout=self.step_timeout))
        try:
            r = decode_tx(reply.get("receipt"))
        except InvalidTx as e:
            raise HopFailed(f"malformed receipt from {hop.peer[:16]}: {e}") from None
        self._check_receipt(hop, r)
        self.blobs.put(hop.inputs)
        self.blobs.put(hop.outputs)
        return r.countersign(self.ident)

    def _check_receipt(self, hop: Hop, r) -> None:
        tokens = sum(t.shape[1] for t in hop.inputs)
        price = tokens * (hop.end - hop.start) * self.ledger.genesis.params.price_per_token_block
        expect = {
            "kind": (type(r), Receipt), "chain": (r.chain_id, self.ledger.chain_id),
            "session": (getattr(r, "session_id", None), hop.session_id),
            "worker": (getattr(r, "worker", None), account_from_str(hop.peer)),
            "requester": (getattr(r, "requester", None), self.ident.account),
            "model": (getattr(r, "model_id", None), self.manifest.model_id),
            "span": ((getattr(r, "span_start", None), getattr(r, "span_end", None)), (hop.start, hop.end)),
            "tokens": (getattr(r, "tokens", None), tokens), "price": (getattr(r, "price", None), price),
            "inputs": (getattr(r, "inputs_root", None), commitments_root(hop.inputs)),
            "outputs": (getattr(r, "outputs_root", None), commitments_root(hop.outputs)),
            "height": (getattr(r, "opened_height", None), hop.opened_height),
        }
        bad = [k for k, (got, want) in expect.items() if got != want]
        if bad:
            raise HopFailed(f"receipt from {hop.peer[:16]} does not match the session: {', '.join(bad)}")
        try:
            from ..identity import verify
            if not verify(r.worker, r.id, r.worker_sig):
                raise InvalidTx("bad worker signature")
        except InvalidTx as e:
            raise HopFailed(str(e)) from None

    async def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Generation:
        """Greedy generation of ``max_new_tokens`` tokens after ``prompt_ids`` through the swarm.

        Returns the new tokens and the countersigned receipts (already submitted to the ledger).

        Raises:
            PromptTooLong: checked before any session opens (no receipt, no charge).
            NoRouteError: the live announcements do not cover every block.
            HopFailed, RemoteError, StreamClosed, RequestTimeout: a hop failed.
        """
        total = self.check_length(len(prompt_ids), max_new_tokens)
        t0 = time.perf_counter()
        route = self.route()
        hops = [Hop(p, s, e) for p, s, e in route]
        try:
            async with trio.open_nursery() as n:
                for hop in hops:
                    n.start_soon(self._open, hop, total)
            ids = torch.tensor([prompt_ids], dtype=torch.long)
            hidden = await self.executor.run(self.head.embed, ids)
            new: list[int] = []
            while True:
                for hop in hops:
                    hidden = await self._step(hop, hidden)
                tok = await self.executor.run(self.head.next_token, hidden)
                new.append(tok)
                if len(new) >= max_new_tokens:
                    break
                hidden = await self.executor.run(self.head.embed, torch.tensor([[tok]], dtype=torch.long))
            receipts = [await self._close(hop) for hop in hops]
        finally:
            for hop in hops:
                if hop.stream is not None:
                    try:
                        await hop.stream.close()
                    except Exception:
                        pass
        for r in receipts:
            await self.ledger.submit(r)
        return Generation(list(prompt_ids), new, receipts, route, time.perf_counter() - t0)
