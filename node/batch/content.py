"""Batch content by hash over libp2p (``BATCH_PROTOCOL``): a node serves the item files and result bytes it holds
(:func:`content_handler`, streamed from disk) to those the ledger lets read them (:class:`ContentAccess`: the batch's
requester, drawn workers and auditors), and fetches them from holders, checking every byte against its hash
(:func:`fetch_content` with :func:`items_check` or :func:`result_check`).

A request is at most :data:`CONTENT_REQUEST_MAX` bytes, read within :data:`CONTENT_REQUEST_TIMEOUT` seconds; a reply
at most :data:`MAX_CONTENT` bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from libp2p.abc import INetStream

from ..duty.seams import LedgerReader
from ..encoding import DecodeError
from ..identity import account_from_str, account_to_str
from ..ledger.core.batchstate import Batch, Item, item_key, open_batches
from ..ledger.core.batchtx import items_root
from ..ledger.core.state import State
from ..p2p.budget import ReplyBudget
from ..p2p.filesend import STALL, serve_file, write_error
from ..p2p.framing import FrameError, RemoteError, RequestTimeout, StreamClosed, read_msg
from ..p2p.host import PeerUnreachable
from .items import MAX_FILE_BYTES, ContentStore, result_hash

BATCH_PROTOCOL = "/tally/batch/1.0.0"
FETCH_TIMEOUT = 20.0  # seconds per holder for an item file or a result


class Requester(Protocol):
    """What fetching content needs of the host (:class:`node.p2p.host.P2PHost`)."""

    async def request(self, peer_id: str, protocol_id: str, msg: dict[str, Any], timeout: float,
                      max_message: int = ...) -> dict[str, Any]: ...


class Unavailable(LookupError):
    """No holder returned bytes matching the requested hash."""


MAX_CONTENT = MAX_FILE_BYTES + (1 << 16)  # bytes: the largest content reply (an item file and its map)
CONTENT_REQUEST_MAX = 1 << 12  # bytes: a content request
CONTENT_REQUEST_TIMEOUT = 10.0  # seconds a server waits for the request after the stream opens
ACCESS_CACHE = 256  # batches whose access sets are kept (per state height)


class ContentAccess:
    """Who may fetch a batch's content from this node (issue 23: batch content is served only to the batch's
    requester, drawn workers and auditors):

    * an **item file** (key ``post.items_root``): the batch's requester (``post.sender``), every worker drawn for
      one of its items in any attempt (``Item.workers`` and ``Item.tried``) and every member of an item's audit
      committee (``Item.audit_committee``);
    * a **result** (key: a result hash an item accepted, revealed or voted): the batch's requester only. A drawn
      worker or auditor must compute it, not copy it from a peer.

    A request may name its batch (``"batch": 16 B``; :func:`fetch_content` sends it when given): it is checked
    against that batch, settled ones included. Without it the key is looked up among the open batches (what a
    worker fetching an item file needs). Sets are built from the ledger state once per height and batch, and
    kept for at most :data:`ACCESS_CACHE` batches, so a request costs O(1) after the first of its batch at a
    height, and the first costs O(items of that batch).

    Args:
        ledger: the node's ledger (its ``state`` is read at each request).
    """

    def __init__(self, ledger: LedgerReader) -> None:
        self.ledger = ledger
        self._height = -1
        self._open: dict[bytes, list[bytes]] | None = None  # items_root or result -> ids of open batches
        self._sets: dict[bytes, tuple[frozenset[bytes], frozenset[bytes], frozenset[bytes]]] = {}

    def _fresh(self, st: State) -> None:
        if st.height != self._height:
            self._height, self._open, self._sets = st.height, None, {}

    def _batch_sets(self, st: State, bid: bytes,
                    cache: bool = True) -> tuple[frozenset[bytes], frozenset[bytes], frozenset[bytes]] | None:
        """``(file readers, result readers, result keys)`` of batch ``bid``, or None when there is no such
        batch. ``cache``: keep them for the rest of the height."""
        got = self._sets.get(bid)
        if got is not None:
            return got
        b: Batch | None = st.tables["batches"].get(bid)
        if b is None:
            return None
        readers = {b.post.sender}
        results: set[bytes] = set()
        for i in range(b.assigned):
            it: Item | None = st.tables["batch_items"].get(item_key(bid, i))
            if it is None:
                continue
            readers.update(it.workers, it.tried, it.audit_committee)
            if it.result:
                results.add(it.result)
            results.update(r for _, r in it.reveals)
            results.update(r for _, r in it.audit_votes)
        got = (frozenset(readers), frozenset({b.post.sender}), frozenset(results))
        if cache:
            if len(self._sets) >= ACCESS_CACHE:
                self._sets.pop(next(iter(self._sets)))
            self._sets[bid] = got
        return got

    def _open_index(self, st: State) -> dict[bytes, list[bytes]]:
        if self._open is None:
            index: dict[bytes, list[bytes]] = {}
            for bid in open_batches(st):
                b: Batch = st.tables["batches"][bid]
                index.setdefault(b.post.items_root, []).append(bid)
                sets = self._batch_sets(st, bid, cache=False)
                if sets is not None:
                    for r in sets[2]:
                        index.setdefault(r, []).append(bid)
            self._open = index
        return self._open

    def allowed(self, key: bytes, peer: str, batch_id: bytes | None = None) -> bool:
        """Whether ``peer`` (a peer ID) may fetch content ``key`` (32 bytes) of batch ``batch_id`` (16 bytes, or
        None: of any open batch)."""
        try:
            account = account_from_str(peer)
        except ValueError:
            return False
        st = self.ledger.state
        self._fresh(st)
        bids = [batch_id] if batch_id is not None else self._open_index(st).get(key, [])
        for bid in bids:
            sets = self._batch_sets(st, bid)
            if sets is None:
                continue
            b: Batch = st.tables["batches"][bid]
            if key == b.post.items_root and account in sets[0]:
                return True
            if key in sets[2] and account in sets[1]:
                return True
        return False


async def content_handler(store: ContentStore, access: ContentAccess, budget: ReplyBudget, stream: INetStream,
                          peer: str, *, stall: float = STALL,
                          request_timeout: float = CONTENT_REQUEST_TIMEOUT) -> None:
    """The ``BATCH_PROTOCOL`` stream handler: ``{"type": "get", "key": 32 B, "batch": 16 B (optional)}`` →
    ``{"status": "ok", "data": bytes}``, streamed from disk (:func:`node.p2p.filesend.serve_file`: one 1 MiB frame
    at a time, 2 MiB of ``budget`` reserved for ``peer``, ``stall`` seconds per frame, 10 s + 1 s per MiB in
    all); or an error reply: ``forbidden`` (``peer`` may not read it: :class:`ContentAccess`; said before
    whether the key is held), ``not_found``, ``too_large``, ``busy``, ``bad_request``.

    Raises:
        FrameError: a malformed or oversized request (the host answers ``bad_frame`` and penalises the peer).
        RequestTimeout, StreamClosed: the request did not come or the reply could not be written in time (the
            host resets the stream).
    """
    msg = await read_msg(stream, timeout=request_timeout, max_message=CONTENT_REQUEST_MAX)
    key, bid = msg.get("key"), msg.get("batch")
    if not (isinstance(key, bytes) and len(key) == 32) or not (bid is None or (isinstance(bid, bytes)
                                                                               and len(bid) == 16)):
        await write_error(stream, "bad_request", "key is 32 bytes, batch (optional) 16 bytes")
        return
    if not access.allowed(key, peer, bid):
        await write_error(stream, "forbidden", "batch content is served to the batch's requester, its drawn "
                                               "workers and auditors only")
        return
    await serve_file(stream, peer, store.dir / key.hex(), limit=MAX_CONTENT, budget=budget, stall=stall)


async def fetch_content(host: Requester, store: ContentStore, key: bytes, holders: list[bytes],
                        check: Callable[[bytes], bool], timeout: float = FETCH_TIMEOUT,
                        batch: bytes | None = None) -> bytes:
    """The bytes stored under ``key``: locally, else from the first of ``holders`` (accounts) whose reply passes
    ``check`` (which must recompute the key from the bytes); a fetched value is stored locally. ``batch``: the
    batch the content belongs to (16 bytes), sent so a holder can check access against a settled batch too
    (:class:`ContentAccess`). Replies are read up to :data:`MAX_CONTENT` bytes within ``timeout`` seconds.

    Raises:
        Unavailable: nobody returned matching bytes (the message lists each holder's failure).
    """
    local = store.get(key)
    if local is not None and check(local):
        return local
    msg: dict[str, Any] = {"type": "get", "key": key}
    if batch is not None:
        msg["batch"] = batch
    errors = []
    for holder in holders:
        peer = account_to_str(holder)
        try:
            reply = await host.request(peer, BATCH_PROTOCOL, msg, timeout=timeout, max_message=MAX_CONTENT)
            data = reply.get("data")
            if not isinstance(data, bytes) or not check(data):
                raise DecodeError("reply does not match the requested hash")
        except (PeerUnreachable, RemoteError, StreamClosed, FrameError, RequestTimeout, DecodeError) as e:
            # unreachable, timeout, not found, forbidden, busy, mismatch: try the next holder
            errors.append(f"{peer[:16]}: {type(e).__name__}: {e}")
            continue
        store.put(key, data)
        return data
    raise Unavailable(f"{key.hex()[:16]} unavailable: {'; '.join(errors) or 'no holder'}")


def items_check(root: bytes) -> Callable[[bytes], bool]:
    """A ``check`` for :func:`fetch_content`: the bytes' lines hash to ``root``."""
    def ok(data: bytes) -> bool:
        raw = data[:-1] if data.endswith(b"\n") else data
        return items_root(raw.split(b"\n")) == root
    return ok


def result_check(key: bytes) -> Callable[[bytes], bool]:
    return lambda data: result_hash(data) == key
