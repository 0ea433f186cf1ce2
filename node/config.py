"""What ``node start`` decides: :class:`NodeConfig`, the node's base settings and each capability's part (issue 38).

The base's settings are :class:`BaseConfig`; each capability declares its own part (its record's ``settings``,
:data:`node.capabilities.CAPABILITIES`) and reads it with :func:`node.duty.capability.settings_of`. A part missing
from :class:`NodeConfig`'s bases is refused at import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .batch.settings import BatchSettings
from .capabilities import CAPABILITIES
from .compute.budget import MemoryBudget
from .ledger.genesis import Genesis
from .market.settings import MarketSettings
from .p2p.limits import Limits
from .settle.settings import SettleSettings
from .verify.fetchstore import MAX_MODEL_BYTES, MAX_TOTAL_BYTES


@dataclass
class BaseConfig:
    """What ``node start`` decides for the node's base (ports 0 mean "any free port"); each capability's part is
    its own settings class (:class:`NodeConfig`'s other bases)."""

    data_dir: Path
    genesis: Genesis
    model_dir: Path
    span: tuple[int, int] | str | None = None  # None: client / committee only; "auto": choose (see auto_blocks)
    bootstrap: list[str] = field(default_factory=list)
    p2p_port: int = 0
    listen: list[str] | None = None  # libp2p multiaddrs to bind (None: 127.0.0.1 with p2p_port)
    announce: list[str] = field(default_factory=list)  # addresses reachable from outside, announced first
    relay: str = "auto"  # relay for others: auto (when listening beyond loopback), on, off
    limits: Limits | None = None  # per-peer connection and stream limits (None: node.p2p.limits defaults)
    api_port: int = 0
    api_host: str = "127.0.0.1"
    device: str = "cpu"
    threads: int = 1
    fault: str | None = None
    seed: bytes | None = None  # devnet well-known key, used only when the data dir has no key yet
    step_timeout: float = 60.0
    announce_period: float = 5.0  # seconds between span announcements
    announce_ttl: float | None = None  # seconds an announcement stays valid (default 3 periods; must exceed it)
    # where span servers are found: "gossip" (every server's announcement to every node) or "dht" (signed records
    # on the Kademlia peers closest to each (model, first block) key, looked up when a route needs them; issue 39)
    discovery: str = "gossip"
    record_period: float = 60.0  # "dht": seconds between republications of a server's record
    record_ttl: float | None = None  # "dht": seconds a record lives (default 3 periods; node.discovery.publisher)
    compression: str = "none"  # hidden-state codec this node's client asks for (node.inference.wire)
    redundancy: int = 1  # 2: each generation step on two disjoint routes, compared (node.inference.redundant)
    auto_blocks: int | None = None  # span "auto": blocks to serve (default: a third of the model, rounded up)
    cache_tokens: int | None = None  # KV-cache positions the span server holds at most (default: 32 sessions)
    snapshot_every: int = 0  # make and serve a state snapshot every N blocks (0: never; node.ledger.statesync)
    state_sync: bool = False  # on an empty ledger, start from a peer's snapshot instead of replaying the chain
    prune_bodies: int = 0  # keep the bodies of the last N blocks only (0: every one; headers and commits stay)
    model_cache: Path | None = None  # where generate finds other models by name or id (default: model_dir's parent)
    fetch_model_bytes: int = MAX_MODEL_BYTES  # cap of one model fetched for committee duty (node.verify.fetchstore)
    fetch_total_bytes: int = MAX_TOTAL_BYTES  # cap of all of them together; least recently used evicted first
    warm_head: bool = True  # build the client head while starting, before the API opens (False: at first use)
    budget: MemoryBudget | None = None  # node start --max-memory (node.compute.budget); None: no budget
    # keep connections to the servers of the current route (RouteClient.keep_route_connected) on a node that serves
    # no span and warms its head: its first generation finds them connected (issue 25). None: that default.
    warm_route: bool | None = None
    # bytes of the process-wide pool for large reads from peers (node.p2p.wirelimits.ReadBudget; None: 256 MiB)
    read_pool_bytes: int | None = None
    # bytes of chunks one state sync fetches at most (node.ledger.syncfetch.SyncLimits.max_bytes; None: 1 GiB)
    state_sync_max_bytes: int | None = None


@dataclass
class NodeConfig(SettleSettings, BatchSettings, MarketSettings, BaseConfig):
    """Everything ``node start`` decides: the base's settings, then each capability's (a dataclass's fields run
    from its last base to its first: the capabilities' settings in reverse). A capability reads its own part with
    :func:`node.duty.capability.settings_of`."""


for _cap in CAPABILITIES:  # every capability's settings are a part of NodeConfig
    if _cap.settings is not None and not issubclass(NodeConfig, _cap.settings):
        raise TypeError(f"NodeConfig lacks {_cap.settings.__name__}, the settings of capability {_cap.name!r}")


__all__ = ["BaseConfig", "NodeConfig"]
