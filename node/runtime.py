"""One Tally node: a libp2p host, the ledger, a span server, a client, a committee member, the capabilities and
the HTTP API, all on one trio event loop (DESIGN.md, Runtime). torch runs in a worker thread, never on the loop.

:class:`Node` is the composition root. It builds the node's services, bundles them as one typed
:class:`~node.duty.parts.NodeParts` (key, settings, ledger, host, blobs, executor, model id), and builds each
capability from that bundle by the capability's own record (:data:`node.capabilities.CAPABILITIES`, built in
:meth:`Node._build_services` in the order they start). Each capability's receipt checks are registered with the
committee member; its services run in the node's nursery, its stream handlers are set on the host.
"""

from __future__ import annotations

import json
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .api.deps import NodeAPI
from .api.serve import serve_api
from .batch.offer import OfferKeeper
from .batch.worker import BatchWorker
from .blobs import BLOB_PROTOCOL, BlobStore, serve_blob
from .capabilities import CAPABILITIES
from .compute.executor import TorchExecutor
from .compute.lazyhead import LazyHead, chat_token_ids
from .compute.model import load_manifest
from .compute.shards import choose_blocks
from .config import NodeConfig
from .discovery.publisher import TTL_PERIODS as RECORD_TTL_PERIODS, check_record_timing, publish_loop
from .discovery.service import Discovery, Mode, check_discovery, with_lookup
from .disputes.duty import DisputeDuty
from .duty.capability import Built
from .duty.parts import NodeParts, Service
from .duty.seams import ReceiptChecker
from .encoding import DecodeError, H, pack, unpack
from .identity import Identity, ensure_api_token, load_or_create
from .inference.client import Generation, RouteClient
from .inference.dhtfeed import DhtFeed
from .inference.redundant import RedundantClient, check_redundancy
from .inference.server import INFERENCE_PROTOCOL, TTL_PERIODS, SpanServer, check_announce_timing
from .inference.swarm import SwarmTable
from .keys import account_to_str
from .ledger.core.block import Block
from .ledger.core.capture import capture_risk
from .ledger.core.state import State
from .ledger.core.tx import Receipt
from .ledger.service import LedgerService
from .ledger.statesync import SnapshotServer, sync_or_replay
from .ledger.store import LedgerStore
from .ledger.syncfetch import SyncLimits
from .market.worker import JobWorker
from .models.lookup import find_model_dir
from .net.service import NetworkService, RelayMode
from .p2p.host import P2PHost
from .p2p.wirelimits import READ_BUDGET
from .settle.book import EpochBook
from .settle.tabs import TabBook, TabGate
from .training.worker import RunWorker
from .verify.blockfetch import BLOCK_PROTOCOL, BlockFetcher, HeldModels, bonded_peers
from .verify.member import CommitteeMember

if TYPE_CHECKING:
    from .compute.span import SpanModel

log = logging.getLogger("tally.node")
T = TypeVar("T")

INFO_FILE = "node.json"
__all__ = ["Node", "api_view"]

class Node:
    """Composes the services of one node; :meth:`run` runs them until cancelled.

    The services that :meth:`run` builds are None until then: ``client``, ``member``, ``jobs`` (None also without
    ``accept_jobs``), ``runs``, ``batches``, ``offers``; and ``server`` until its span is loaded, on the executor
    while the ledger already runs (None also when the node serves no span). Building a node imports no torch: a
    node that serves no span and builds its head at first use (``warm_head`` False) never does (issue 35).
    """

    def __init__(self, cfg: NodeConfig) -> None:
        check_announce_timing(cfg.announce_period, cfg.announce_ttl or cfg.announce_period * TTL_PERIODS)
        check_discovery(cfg.discovery)
        check_record_timing(cfg.record_period, cfg.record_ttl or cfg.record_period * RECORD_TTL_PERIODS)
        self.cfg = cfg
        if cfg.read_pool_bytes is not None:  # one node per process: the pool is the process's
            READ_BUDGET.configure(cfg.read_pool_bytes)
        self.ident: Identity = load_or_create(cfg.data_dir, cfg.seed)
        self.api_token = ensure_api_token(cfg.data_dir)
        self.genesis = cfg.genesis
        self.manifest = load_manifest(cfg.model_dir)
        self.held = HeldModels(cfg.model_dir, cfg.data_dir / "models")  # blocks served over BLOCK_PROTOCOL
        self.executor = TorchExecutor(cfg.threads)
        self.blobs = BlobStore(cfg.data_dir)
        self.store = LedgerStore(cfg.data_dir / "ledger", cfg.genesis, prune_bodies=cfg.prune_bodies)
        if cfg.prune_bodies:
            log.info("pruning block bodies: keeping the last %d (headers and commits kept); bodies held from "
                     "height %d; this node cannot re-verify from genesis nor serve older blocks",
                     cfg.prune_bodies, max(self.store.pruned_below, 1))
        self.host = P2PHost(self.ident, cfg.p2p_port, cfg.genesis.chain_id, listen=cfg.listen,
                            announce=cfg.announce, genesis_hash=cfg.genesis.hash, limits=cfg.limits)
        self.host.reserve(peers=[account_to_str(v) for v in cfg.genesis.validators])  # validators keep their slots
        self.net = NetworkService(self.host, cfg.genesis.hash, cfg.bootstrap, cfg.data_dir, RelayMode(cfg.relay))
        self.ledger = LedgerService(self.store, cfg.genesis, self.ident, self.host,
                                    consensus_fault="equivocate" if cfg.fault == "equivocate" else None)
        snapdir = cfg.data_dir / "snapshots"  # files: kept and served again after a restart (node.ledger.snapstore)
        self.snapshots = SnapshotServer(self.store, cfg.snapshot_every,
                                        directory=snapdir if cfg.snapshot_every or snapdir.exists() else None)
        log.info("ledger opened: head %d (%s)", self.ledger.state.height,
                 self.ledger.state.last_hash.hex()[:16])
        self.reply_budget = self.snapshots.budget  # shared by snapshot, block, batch, blob and sync replies
        # what every capability is built from (node.duty.parts): the services above, typed by what they offer
        self.parts = NodeParts(self.ident, cfg, self.ledger, self.host, self.blobs, self.executor,
                               self.manifest.model_id, self.reply_budget)
        self.server: SpanServer | None = None
        self.client: RouteClient[LazyHead] | None = None
        self.clients: dict[bytes, RouteClient[LazyHead]] = {}  # model id -> its RouteClient (one per model used)
        self.swarm = SwarmTable()
        self.discovery: Discovery | None = None  # cfg.discovery "dht": span records in Kademlia (issue 39)
        self.dht_feed: DhtFeed | None = None
        self.member: CommitteeMember | None = None
        self.built: dict[str, Built] = {}  # capability name -> what it runs here (_build_services)
        self.duties: tuple[Service, ...] = ()  # the member's and the capabilities' services, in the order they start
        self.api_url = ""
        self.started = trio.Event()

    def _load_span(self, start: int, end: int, fault: str | None = None) -> SpanModel:
        # local: compute.span imports torch and transformers (~4 s); a node that serves and checks nothing never does
        from .compute.span import SpanModel

        return SpanModel(self.cfg.model_dir, start, end, device=self.cfg.device, fault=fault)

    def _build_services(self) -> None:
        """Build the capabilities, the route client and the committee member (on the event loop: none of them
        loads a model or imports torch here; :meth:`_serve_span` loads the span, on the executor)."""
        cfg = self.cfg
        self.built = {cap.name: cap.build(self.parts) for cap in CAPABILITIES}  # node.capabilities, in order
        self.net.on_rtt = self.swarm.observe_rtt  # ping round trips weigh routes: direct paths win (issue 25)
        if cfg.discovery == "dht":  # servers and validators hold records; other nodes only ask
            serves = cfg.span is not None or self.ident.account in self.genesis.validators
            self.discovery = Discovery(self.host, Mode.SERVER if serves else Mode.CLIENT)
            self.dht_feed = DhtFeed(self.discovery, self.swarm, self._learn)
            assert self.host.dial_hint is not None  # the network service's
            self.host.dial_hint = with_lookup(self.host.dial_hint, self.discovery.find_peer_addrs, self._learn,
                                              self.net.dial_peer)
        head = LazyHead(cfg.model_dir, device=cfg.device)  # built at the first generation
        self.client = RouteClient(self.ident, self.host, head, self.manifest, self.ledger, self.executor,
                                  self.blobs, self.swarm, step_timeout=cfg.step_timeout, compression=cfg.compression,
                                  tabs=self.tab_book, disputes=self.disputes, discover=self.dht_feed)
        self.clients[self.manifest.model_id] = self.client
        self.member = self._committee_member()
        self.ledger.on_block(self.member.on_block)
        self.ledger.on_block(self._vouch_for_work)
        self.duties = (self.member, *(svc for b in self.built.values() for svc in b.services))

    def _committee_member(self) -> CommitteeMember:
        """This node's committee member: re-executes its own model's inference receipts and those of models it
        fetches by content hash (:class:`~node.verify.blockfetch.BlockFetcher`), and checks the capabilities'
        receipts with the checkers their records register (:data:`node.capabilities.CAPABILITIES`)."""
        cfg = self.cfg
        fetcher = BlockFetcher(self.host, self.held.fetched_root,
                               lambda mid, i: [p for p, s, e in self.swarm.live(mid) if i < 0 or s <= i < e],
                               bonded=bonded_peers(lambda: self.ledger.state), keep=[self.manifest.model_id],
                               min_servers=self.genesis.params.model_servers(),
                               max_model_bytes=cfg.fetch_model_bytes, max_total_bytes=cfg.fetch_total_bytes)
        checkers: dict[type, ReceiptChecker] = {}
        for cap in CAPABILITIES:
            if cap.checkers is not None:
                checkers.update(cap.checkers())
        return CommitteeMember.from_parts(self.parts, lambda s, e: self._load_span(s, e), fetcher, checkers,
                                          budget=None if self.cfg.budget is None else self.cfg.budget.committee)

    def _make_server(self, start: int, end: int) -> SpanServer:
        from .compute.cheats import FAULTS  # local: it imports torch (~2 s); only a node serving a span needs it

        cfg = self.cfg
        span = self._load_span(start, end, fault=cfg.fault if cfg.fault in FAULTS else None)
        return SpanServer(self.ident, self.genesis.domain, span, self.executor, self.blobs,
                          lambda: self.ledger.state.height, self.genesis.params.price_per_token_block,
                          step_timeout=cfg.step_timeout, cache_tokens=cfg.cache_tokens,
                          submit=self.ledger.submit if self.service(EpochBook) is None else self._keep_receipt,
                          penalize=self.host.penalize, tabs=self.service(TabGate), tab_wait=self._next_block)

    async def _next_block(self, height: int) -> None:
        """Until block ``height`` is stored here, or ten seconds at most."""
        with trio.move_on_after(10):
            while self.ledger.state.height < height:
                await self.ledger.new_block.wait()

    async def _keep_receipt(self, receipt: Any) -> None:
        """A session's receipt on a chain with tabs: into the epoch book (the worker batches it), not the ledger."""
        book = self.service(EpochBook)
        assert book is not None
        await trio.to_thread.run_sync(book.add, receipt)  # a synced LevelDB write

    async def _choose_span(self) -> tuple[int, int]:
        """``--span auto``: listen to the swarm's announcements for 1.5 announcement periods (plus an offset
        derived from this node's key, so servers started together choose one after another), then choose the
        weakest-covered blocks (:func:`node.compute.shards.choose_blocks`)."""
        total = self.manifest.num_blocks
        n = self.cfg.auto_blocks or -(-total // 3)
        period = self.cfg.announce_period
        await trio.sleep(period * (1.5 + int.from_bytes(H(self.ident.account)[:4], "big") / 2**32))
        if self.dht_feed is not None:  # the servers of every block, asked for once
            await self.dht_feed.every_block(self.manifest.model_id, total)
        start, end = choose_blocks(n, total, self.swarm.infos(self.manifest.model_id), me=self.ident.peer_id)
        log.info("span auto: serving blocks [%d, %d), the weakest covered", start, end)
        self.cfg.span = (start, end)
        return start, end

    async def _serve_span(self, nursery: trio.Nursery) -> None:
        """Load this node's span (``cfg.span``, or the one :meth:`_choose_span` picks for ``auto``) on the executor
        and serve it: its handler, one measured step, then its announcements. :meth:`run` calls it with the ledger
        already running: loading imports torch and reads the weights, seconds that the chain does not wait for."""
        span = self.cfg.span
        if span is None:
            return
        start, end = span if isinstance(span, tuple) else await self._choose_span()
        server = self.server = await self.executor.run(self._make_server, start, end)
        self.host.set_handler(INFERENCE_PROTOCOL, server.handle)
        await server.measure()
        if self.discovery is not None:
            nursery.start_soon(publish_loop, self.discovery, self.ident, server.record_fields,
                               lambda: list(self.host.addrs), self.cfg.record_period, self.cfg.record_ttl)
        else:
            nursery.start_soon(server.announce_loop, self.host, self.cfg.announce_period, self.cfg.announce_ttl)

    def _vouch_for_work(self, block: Block, _state: State) -> None:
        """Keep connection slots (for :data:`node.p2p.host.VOUCH_TTL` seconds) for the worker and requester of
        every receipt in a committed block: peers that did useful work, paid for on the ledger, are served before
        unknown ones when the node is flooded (issue 23, "Limits before the handshake")."""
        peers = {account_to_str(a) for tx in block.txs if isinstance(tx, Receipt) for a in (tx.worker, tx.requester)}
        peers.discard(self.host.peer_id)
        if peers:
            self.host.vouch(peers)

    def info(self) -> dict[str, Any]:
        """What ``node.json`` holds: peer id, addresses, API URL, genesis hash, chain id, span, process id."""
        return {"peer_id": self.ident.peer_id, "addrs": self.host.addrs, "bound": self.host.bound_addrs(),
                "api": self.api_url, "genesis": self.genesis.hash.hex(), "chain_id": self.genesis.chain_id,
                "span": list(self.cfg.span) if isinstance(self.cfg.span, tuple) else None, "pid": os.getpid()}

    async def run(self) -> None:
        """Run every service until cancelled; writes ``node.json`` (addresses, API URL) once listening."""
        self._build_services()
        head_ready = trio.Event()
        try:
            async with self.host.running():
                if self.cfg.warm_head:  # built while the node connects; the API opens once it is ready
                    self.host.spawn(self._warm_head, head_ready)
                else:
                    head_ready.set()
                # bulk replies: streamed from disk under one per-peer and node-wide budget (node.p2p.budget)
                self.ledger.reply_budget = self.reply_budget
                self.host.set_handler(BLOB_PROTOCOL, partial(serve_blob, self.blobs, self.reply_budget))
                self.host.set_handler(BLOCK_PROTOCOL, self.held.stream_handler(self.reply_budget))
                for b in self.built.values():  # the capabilities' protocols (batch content, ...)
                    for protocol, handler in b.handlers.items():
                        self.host.set_handler(protocol, handler)
                await self.host.subscribe(self.host.topic("shards"), self._on_shards)
                await self.host.start_service(self.net.run)
                if self.discovery is not None:  # before the bootstrap dials: their peers join the routing table
                    await self.host.start_service(self.discovery.run)
                    self.discovery.follow_connections()
                self.snapshots.install(self.host)  # answers "no snapshot" while it has none
                if self.cfg.snapshot_every:
                    self.ledger.on_block(lambda block, _st: self.host.spawn(self.snapshots.on_block, block.height))
                if self.cfg.bootstrap:
                    n = await self.host.connect(self.cfg.bootstrap)
                    log.info("connected to %d of %d bootstrap peers", n, len(self.cfg.bootstrap))
                if self.discovery is not None:
                    self.host.spawn(self.discovery.join)
                if self.cfg.state_sync and self.store.head == 0:
                    synced = await sync_or_replay(self.store, self.host, self.host.connected_peers(),
                                                  SyncLimits.capped(self.cfg.state_sync_max_bytes), self.cfg.data_dir)
                    if synced is not None:
                        self.ledger.reset_to(synced)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.ledger.run)
                    nursery.start_soon(self._presence_loop)
                    for duty in self.duties:  # the committee member and the capabilities (_build_services)
                        nursery.start_soon(duty.run)
                    if self._warms_route():
                        nursery.start_soon(self._route_client().keep_route_connected)
                    await self._serve_span(nursery)  # the ledger runs meanwhile
                    await head_ready.wait()
                    self.api_url = await nursery.start(serve_api, api_view(self), self.cfg.api_host,
                                                       self.cfg.api_port)
                    self._write_info()
                    self.started.set()
                    log.info("node %s up: p2p %s, api %s, ledger height %d", self.ident.peer_id,
                             self.host.addrs[0], self.api_url, self.ledger.state.height)
                    self._warn_small_network()
        finally:
            self.store.close()
            for b in self.built.values():
                b.close()

    def _warms_route(self) -> bool:
        """Whether this node keeps its route's servers connected ahead of a generation: ``cfg.warm_route``, by
        default a node that generates (its head is warmed) and serves no span of its own. Servers leave it off: a
        mesh of servers dialling one another's routes would only add connections nobody generates through."""
        if self.cfg.warm_route is not None:
            return self.cfg.warm_route
        return self.cfg.warm_head and self.cfg.span is None

    async def _warm_head(self, done: trio.Event) -> None:
        """Build this node's client head (embeddings, final norm, LM head; the first build imports transformers,
        about 4 CPU-seconds) and run it once (:meth:`ClientHead.warm_up`) on the executor while the node connects
        (one torch call at a time there: no two threads race through transformers' lazy imports), then set
        ``done``: the API opens (and ``node.json`` is written) only after it, so that the first generation pays
        only the network and the servers (issue 25: the first token in seconds). ``--lazy-head`` turns it off. A
        head that cannot be built is logged here and raises again, with its reason, at the first generation."""
        try:
            t0 = time.monotonic()
            head = self._route_client().head
            await self.executor.run(lambda: head.built().warm_up())  # one torch call at a time
            log.debug("client head built in %.1f s", time.monotonic() - t0)
        except (OSError, ValueError, KeyError) as e:
            log.warning("client head not built at start (generation will fail): %s: %s", type(e).__name__, e)
        finally:
            done.set()

    def _warn_small_network(self) -> None:
        """Log once, at start, when two colluders can fill every receipt committee of this network
        (:func:`node.ledger.core.capture.capture_risk`; ``/v1/status`` says the same as ``committee_warning``)."""
        st = self.ledger.state
        why = capture_risk(len(st.eligible()), st.params)
        if why:
            log.warning("small network at height %d: %s", st.height, why)

    async def _on_shards(self, data: bytes, from_peer: str) -> None:
        """``tally/<chain>/shards``: span announcements, and presence messages that tell every node how to
        dial every other (committee members fetch blobs from workers they were never connected to)."""
        try:
            msg = unpack(data, max_size=1 << 14)
        except DecodeError:
            return
        if isinstance(msg, dict) and from_peer in (msg.get("presence"), msg.get("peer")):
            addrs = msg.get("addrs")
            if isinstance(addrs, list):
                self._learn(from_peer, [a for a in addrs[:16]
                                        if isinstance(a, str) and a.endswith("/p2p/" + from_peer)])
        await self.swarm.on_announcement(data, from_peer)

    def _learn(self, peer: str, addrs: list[str]) -> None:
        """Remember a peer's addresses (direct ones for the host, all for the network service's dialling)."""
        self.host.remember([a for a in addrs if "/p2p-circuit" not in a])
        self.net.learn(peer, addrs)

    async def _presence_loop(self) -> None:
        """Every ``announce_period``: publish this node's addresses on ``tally/<chain>/shards`` (unless it serves a
        span: its announcements carry them, and twice the messages cost an idle server about a tenth of its CPU,
        bench/idle.py; nor with ``--discovery dht``: a peer is looked up when needed) and rewrite ``node.json`` when
        they changed."""
        seq = 0
        written = self.host.addrs
        while True:
            seq += 1  # distinct bytes each time: gossip de-duplicates identical content
            if self.host.addrs != written:  # a relay reservation or a dial-back changed what we announce
                written = self.host.addrs
                log.info("announcing %s", ", ".join(written))
                self._write_info()
            # a server's span announcements carry the same; with a DHT, a peer is looked up when it is needed
            if self.server is None and self.discovery is None:
                await self.host.publish(self.host.topic("shards"),
                                        pack({"presence": self.ident.peer_id, "addrs": self.host.addrs, "seq": seq}))
            await trio.sleep(self.cfg.announce_period)

    def _write_info(self) -> None:
        path = self.cfg.data_dir / INFO_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.info(), indent=2))
        os.replace(tmp, path)

    def _route_client(self) -> RouteClient[LazyHead]:
        """This node's own model's route client.

        Raises:
            RuntimeError: called before :meth:`run` built it.
        """
        if self.client is None:
            raise RuntimeError("the node's services are not built yet (Node.run builds them)")
        return self.client

    def service(self, kind: type[T]) -> T | None:
        """This node's running part of type ``kind`` — a capability's worker, keeper or book (``JobWorker``,
        ``BatchWorker``, ``TabBook``, ``EpochBook``, ...), the span server or the committee member — or None when
        this node runs none (a capability's settings leave it off, or :meth:`run` has not built it yet). What a
        capability's API router reaches of the node, typed, without naming the runtime."""
        for part in (self.member, self.server, *(x for b in self.built.values() for x in (*b.services, *b.parts))):
            if isinstance(part, kind):
                return part
        return None

    @property
    def jobs(self) -> JobWorker | None:
        """The fine-tune job worker (:mod:`node.market`), None without ``accept_jobs``."""
        return self.service(JobWorker)

    @property
    def runs(self) -> RunWorker | None:
        """The training-run worker (:mod:`node.training`)."""
        return self.service(RunWorker)

    @property
    def batches(self) -> BatchWorker | None:
        """The batch worker (:mod:`node.batch`)."""
        return self.service(BatchWorker)

    @property
    def offers(self) -> OfferKeeper | None:
        """This node's batch offer keeper (:mod:`node.batch.offer`)."""
        return self.service(OfferKeeper)

    @property
    def tab_book(self) -> TabBook | None:
        """On a chain with tabs: this node's tabs as a requester (:mod:`node.settle.tabs`)."""
        return self.service(TabBook)

    @property
    def disputes(self) -> DisputeDuty | None:
        """The requester's disputes (:mod:`node.disputes`): plain receipts' at once, tab receipts' queued."""
        return self.service(DisputeDuty)

    def client_for(self, model: str | None = None) -> RouteClient[LazyHead]:
        """The :class:`~node.inference.client.RouteClient` of ``model`` (a name or id; None or "": this node's
        model). Its routes use only servers announcing that model id. Built on first use from the model dir in
        ``cfg.model_cache`` (:func:`node.models.lookup.find_model_dir`; its head is loaded at the first generation).

        Raises:
            node.models.lookup.UnknownModel: this node holds no such model.
        """
        if not model or model == self.manifest.name or (
                len(model) >= 8 and self.manifest.model_id.hex().startswith(model.lower())):
            return self._route_client()
        model_dir = find_model_dir(model, self.cfg.model_cache or Path(self.cfg.model_dir).parent)
        m = load_manifest(model_dir)
        if m.model_id not in self.clients:
            self.clients[m.model_id] = RouteClient(
                self.ident, self.host, LazyHead(model_dir, device=self.cfg.device), m, self.ledger, self.executor,
                self.blobs, self.swarm, step_timeout=self.cfg.step_timeout, compression=self.cfg.compression,
                tabs=self.tab_book, disputes=self.disputes, discover=self.dht_feed)
        return self.clients[m.model_id]

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, model: str | None = None,
                       redundancy: int | None = None, **kw: Any) -> Generation:
        """Greedy generation through the swarm's servers of ``model`` (name or id; default: this node's model;
        see :meth:`client_for`, :meth:`RouteClient.generate`; ``compression``, ``on_token``). ``redundancy`` 2
        (default: ``cfg.redundancy``) runs every step on two disjoint routes and compares them, paying both
        (:class:`~node.inference.redundant.RedundantClient`; raises ValueError for another value)."""
        client = self.client_for(model)
        if check_redundancy(self.cfg.redundancy if redundancy is None else redundancy) == 2:
            return await RedundantClient(client).generate(prompt_ids, max_new_tokens, **kw)
        return await client.generate(prompt_ids, max_new_tokens, **kw)

    def encode_prompt(self, text: str, model: str | None = None) -> list[int]:
        """Token ids of ``text`` with ``model``'s tokenizer (:meth:`client_for`).

        Raises:
            ValueError: the model has no tokenizer (the caller passes ``prompt_ids``).
        """
        tok = self.client_for(model).head.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer; pass prompt_ids")
        ids: list[int] = tok.encode(text)
        return ids

    def encode_chat(self, messages: list[dict[str, str]], model: str | None = None) -> list[int]:
        """Token ids of a chat (``[{"role", "content"}, ...]``) through ``model``'s own chat template (its
        tokenizer's, rendered by transformers in Jinja2's sandbox), ending with the assistant's turn to speak.

        Raises:
            ValueError: the model has no tokenizer or no chat template (the caller passes ``prompt``), or the
                template refuses the chat (e.g. roles out of order).
        """
        return chat_token_ids(self.client_for(model).head.tokenizer, messages)

    def decode(self, ids: list[int], model: str | None = None) -> str | None:
        """``ids`` as text with ``model``'s tokenizer, special tokens skipped; None when it has none."""
        tok = self.client_for(model).head.tokenizer
        return None if tok is None else tok.decode(ids, skip_special_tokens=True)


def api_view(node: Node) -> NodeAPI:
    """``node`` as the HTTP API sees it (:class:`node.api.deps.NodeAPI`): mypy checks here that a Node is one."""
    return node
