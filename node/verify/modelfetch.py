"""``node model fetch MODEL_ID --from ADDR``: a model's blocks from peers into this machine's model cache (issue 36).

A server needs only its span's blocks; it need not be the machine that converted the model. This starts a
short-lived libp2p host with a fresh identity, passes the genesis handshake of the chain's nodes, and asks the
given peers over ``BLOCK_PROTOCOL`` (:mod:`node.verify.blockfetch`) for the model's manifest and config — accepted
only when they hash to the model id asked for — then for each block of the span, each accepted only when it
hashes to the manifest's entry, streamed to disk one frame at a time. Without ``--blocks`` the whole model comes,
with the head and the tokenizer (a client). The result is registered in the model cache under a name, as
``node model add`` registers a converted model; ``node start --model NAME --span A:B`` then serves it.

Bounds: the fetcher's byte caps (per model, and in total) and its deadline (seconds for the whole fetch), a
timeout per request, at most :data:`~node.verify.blockfetch.MAX_PEERS` peers asked per file.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

# resolved once here, in the importing thread: blocks are checked in worker threads side by side, and two threads
# resolving transformers' lazy attributes at once fail with "cannot import name 'AutoConfig'"
from transformers import AutoConfig  # noqa: F401

from ..compute.model import HEAD_FILE, block_file, load_manifest
from ..identity import Identity
from ..ledger.genesis import Genesis
from ..models.convert import register_dir
from ..models.registry import Entry, RegistryError, check_name, load as load_registry
from ..net.service import NetworkService
from ..p2p.host import P2PHost
from .blockfetch import FETCH_DEADLINE, BlockFetcher, BlockUnavailable

__all__ = ["FetchError", "default_name", "fetch_model"]


def default_name(model_id: bytes) -> str:
    """The name a fetched model is registered under when none is given: ``m-`` and its id's first 12 hex digits
    (a name of hex digits alone would read as an id)."""
    return f"m-{model_id.hex()[:12]}"


class FetchError(RuntimeError):
    """The model could not be fetched; the message says why. Nothing was registered."""


async def fetch_model(genesis: Genesis, addrs: list[str], model_id: bytes, cache: Path, name: str,
                      span: range | None = None, max_bytes: int = 64 << 30,
                      deadline: float = FETCH_DEADLINE) -> Entry:
    """Fetch ``model_id`` (blocks ``span`` only, or the whole model with its head and tokenizer) from the peers at
    ``addrs`` (full multiaddrs with ``/p2p/``) into ``cache`` and register it as ``name``.

    Raises:
        FetchError: no peer could be reached, the model or a block could not be had with the right hashes, the span
            is outside the model, or ``max_bytes`` or ``deadline`` (seconds) would be passed.
        node.models.registry.RegistryError: the name is taken or the model is already added.
    """
    check_name(name)  # refused before any byte is fetched, not after
    known = [e for e in load_registry(cache) if e.model_id == model_id.hex()] if cache.exists() else []
    if known:
        raise RegistryError(f"this model is already added as {known[0].name!r}")
    host = P2PHost(Identity.generate(), 0, genesis.chain_id, genesis_hash=genesis.hash)
    net = NetworkService(host, genesis.hash)  # the genesis handshake every node insists on
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch-tmp-", dir=cache))
    try:
        async with host.running():
            await host.start_service(net.run)
            if not await host.connect(addrs):
                raise FetchError(f"no peer at {', '.join(addrs)} could be reached (same chain and genesis?)")
            peers = host.connected_peers()
            fetcher = BlockFetcher(host, work, lambda _m, _b: list(peers), bonded=None, min_servers=1,
                                   max_model_bytes=max_bytes, max_total_bytes=max_bytes, deadline=deadline)
            try:
                if span is None:
                    d = await fetcher.ensure_model(model_id)
                else:
                    d = await fetcher.ensure(model_id, span.start, span.stop)
            except (BlockUnavailable, ValueError) as e:
                raise FetchError(str(e)) from None
        manifest = load_manifest(d)
        held = [i for i in range(manifest.num_blocks) if (d / block_file(i)).is_file()]
        what = f"blocks {held[0]}..{held[-1]}" if held else "no blocks"
        return register_dir(d, cache, name, source=f"fetched from {addrs[0]}: {what}"
                                                     + (", head" if (d / HEAD_FILE).is_file() else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
