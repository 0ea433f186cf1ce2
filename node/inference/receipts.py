"""Running receipts: what both ends of an inference session commit to after every step (DESIGN.md, Receipts).

Both the server and the client keep a :class:`RunningReceipt` for a session. After each step they append the
step's input and output commitments; :meth:`RunningReceipt.current` is then the unsigned
:class:`~node.ledger.core.tx.Receipt` for the session *so far*. The server signs its id and returns the signature
with the step's output; the client computes the same id from what it sent and received, countersigns it and
sends the countersignature back at once (an ``ack``). So at every moment

* the server holds a countersigned receipt for exactly the steps the client acknowledged (what it submits when
  the client vanishes), and
* the client holds a worker-signed receipt for exactly the outputs it received (what it submits when the server
  dies).

Neither side needs to check the other's signature per step: each signs the id of *its own view*, so a signature
is only useful to the other side if both views are identical. Signatures are checked once, when a receipt is
about to be used.

Cost per step and side: two tensor commitments (BLAKE2b over the step's bytes), O(1) amortised Merkle appends
(a compact range of perfect subtrees, RFC 9162 hashing), one O(log n) root, one receipt id (~300 bytes hashed)
and one Ed25519 signature over 32 bytes. Nothing is rehashed from the start of the session. :data:`CLOCK` sums
the time spent here (the bench reports it as a share of step time).

Measured on SmolLM2-135M, 10 blocks per server, CPU (``bench/inference.py``): a server's receipt work costs
~100 µs per step, against ~27 µs for the same calls in a warm loop, because each step's forward streams ~140 MB
of weights through the caches and evicts the hashing and signing code and libsodium's tables: the signature
alone is ~55 µs cold (14 µs warm). The client's work for three hops runs together and costs ~35–45 µs per hop.
Replacing the Merkle roots by hash chains was tried and saved only ~6 %, so the roots stay (they allow
inclusion proofs); the floor is one cold Ed25519 signature per step and side.

Replay after a failover: a replacement server is opened with ``replay = P`` — the first ``P`` positions it
receives were already billed to the server it replaces. Its receipt's ``tokens`` counts only the billed
positions (positions ``P`` onwards), so ``work = tokens × blocks`` and ``price`` never pay a position twice,
while ``inputs_root`` / ``outputs_root`` commit to every step, replay included (the committee re-executes the
whole input and compares every position; the billed positions are the last ``tokens`` ones).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..encoding import HASH_LEN, H, pack, tensor_to_wire
from ..ledger.core.tabs import TabReceipt
from ..ledger.core.tx import Receipt

if TYPE_CHECKING:
    import torch

    from ..blobs import BlobStore

# the moving fields of a session's receipt after a step: (billed positions, inputs_root, outputs_root)
ReceiptState = tuple[int, bytes, bytes]


class ReceiptClock:
    """Time spent on receipt work in this process (commitments, Merkle roots, ids, signatures).

    ``seconds``: wall-clock seconds; ``cpu_seconds``: CPU seconds of the thread (excludes time the OS gave to
    other processes meanwhile). Use as ``with CLOCK: ...``; not re-entrant, not thread-safe (the trio loop is
    one thread).
    """

    def __init__(self) -> None:
        self.reset()

    def __enter__(self) -> ReceiptClock:
        self._c0 = time.thread_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._t0
        self.cpu_seconds += time.thread_time() - self._c0
        self.calls += 1

    def reset(self) -> None:
        self.seconds, self.cpu_seconds, self.calls = 0.0, 0.0, 0
        self._t0 = self._c0 = 0.0


CLOCK = ReceiptClock()


_HEADERS: dict[tuple[str | int, ...], bytes] = {}


def wire_commitment(dtype: str, shape: list[int], data: bytes) -> bytes:
    """Tensor commitment ``H(dtype ‖ pack(shape) ‖ little-endian bytes)`` from wire parts; 32 bytes.

    Equal to :func:`node.encoding.tensor_commitment` of the decoded tensor, without re-serialising it.
    """
    key: tuple[str | int, ...] = (dtype, *shape)
    head = _HEADERS.get(key)
    if head is None:
        head = dtype.encode() + pack(list(shape))
        if len(_HEADERS) < 4096:
            _HEADERS[key] = head
    h = hashlib.blake2b(head, digest_size=HASH_LEN)
    h.update(data)
    return h.digest()


_blake2b = hashlib.blake2b
_EMPTY_ROOT = H(b"")


class MerkleAccumulator:
    """RFC 9162 Merkle Tree Hash of a growing list of leaves, appended one at a time.

    Keeps the roots of the perfect subtrees of the binary decomposition of ``size`` (at most log2(size) + 1 of
    them); :meth:`root` folds them right to left, which equals :func:`node.encoding.merkle_root` of all the
    leaves appended so far (the empty tree hashes to ``H(b"")``).
    """

    __slots__ = ("_hashes", "_sizes", "size")

    def __init__(self) -> None:
        self._sizes: list[int] = []  # perfect subtree sizes, strictly decreasing
        self._hashes: list[bytes] = []  # their hashes
        self.size = 0

    def append(self, data: bytes) -> None:
        """Append one raw leaf (``leaf_hash`` is applied here)."""
        sizes, hashes = self._sizes, self._hashes
        h = _blake2b(b"\x00" + data, digest_size=HASH_LEN).digest()  # = encoding.leaf_hash (inlined: hot path)
        size = 1
        while sizes and sizes[-1] == size:
            sizes.pop()
            h = _blake2b(b"\x01" + hashes.pop() + h, digest_size=HASH_LEN).digest()  # = encoding.node_hash
            size *= 2
        sizes.append(size)
        hashes.append(h)
        self.size += 1

    def root(self) -> bytes:
        """32-byte root of the leaves so far."""
        hashes = self._hashes
        if not hashes:
            return _EMPTY_ROOT
        acc = hashes[-1]
        for i in range(len(hashes) - 2, -1, -1):
            acc = _blake2b(b"\x01" + hashes[i] + acc, digest_size=HASH_LEN).digest()
        return acc


def _pack_uint(n: int) -> bytes:
    """msgpack's (smallest) encoding of a non-negative int, as ``msgpack.packb`` writes it; ``pack(n)`` beyond
    64 bits (which raises, as msgpack does)."""
    if n < 0x80:
        return bytes((n,))
    if n <= 0xFF:
        return b"\xcc" + bytes((n,))
    if n <= 0xFFFF:
        return b"\xcd" + n.to_bytes(2, "big")
    if n <= 0xFFFFFFFF:
        return b"\xce" + n.to_bytes(4, "big")
    if n <= 0xFFFFFFFFFFFFFFFF:
        return b"\xcf" + n.to_bytes(8, "big")
    return pack(n)


_BIN32 = b"\xc4\x20"  # msgpack bin 8 header of a 32-byte string


@dataclass(frozen=True)
class SessionTerms:
    """What both ends agree on when a session opens; every receipt of the session carries these.

    ``replay``: positions at the start of the session that are not billed (a failover replay), >= 0.
    ``price_per_token_block``: base units, from genesis. ``chain_id``: the network's signing domain, chain id and
    genesis hash (:attr:`node.ledger.core.genesis.Genesis.domain`): a receipt signed for one genesis does not verify
    on a network of another that reuses the chain id.
    """

    chain_id: str
    session_id: bytes
    worker: bytes
    requester: bytes
    model_id: bytes
    start: int
    end: int
    opened_height: int
    compression: str
    replay: int
    price_per_token_block: int
    tab: TabTerms | None = None  # paid through a tab (issue 37): the session's receipt is a TabReceipt


@dataclass(frozen=True)
class TabTerms:
    """A session paid through tab ``tab_id``: its receipt is tab nonce ``nonce``, and its cumulative is ``before``
    (what the requester owed on the tab before this session, base units) plus the session's price so far."""

    tab_id: bytes
    nonce: int
    before: int


class RunningReceipt:
    """The incremental commitments of one session, from one side's view.

    Attributes: ``steps`` appended, ``positions`` (tokens processed, replay included), ``billed`` positions.

    Receipt ids are computed without building a :class:`Receipt`: the canonical bytes are a msgpack array whose
    fields before ``tokens`` and after ``price`` never change in a session, so their hash state is prepared
    once and each step hashes only the four fields that move (:meth:`id_of` equals ``Receipt.id``).
    """

    def __init__(self, terms: SessionTerms):
        self.terms = terms
        self.inputs = MerkleAccumulator()
        self.outputs = MerkleAccumulator()
        self.steps = 0
        self.positions = 0
        self.state: ReceiptState  # set by every append
        t = terms
        tag = Receipt.TAG if t.tab is None else TabReceipt.TAG
        head = [tag, t.chain_id, t.session_id, t.worker, t.requester, t.model_id, t.start, t.end]
        tail = [t.opened_height, t.compression]
        # the fields between outputs_root and the price (a tab receipt's tab id and nonce; its "price" field is
        # the cumulative amount): fixed for the session
        self._mid = b"" if t.tab is None else pack(t.tab.tab_id) + _pack_uint(t.tab.nonce)
        self._base = 0 if t.tab is None else t.tab.before
        n = len(head) + 4 + len(tail) + (0 if t.tab is None else 2)
        self._prefix = hashlib.blake2b(pack([None] * n)[:-n], digest_size=HASH_LEN)  # the array header
        for x in head:
            self._prefix.update(pack(x))
        self._suffix = b"".join(pack(x) for x in tail)
        self._blocks_price = (t.end - t.start) * t.price_per_token_block

    @property
    def billed(self) -> int:
        """Positions that are paid for: those after the replayed prefix."""
        return max(0, self.positions - self.terms.replay)

    def append(self, input_commitment: bytes, output_commitment: bytes, positions: int) -> bytes | None:
        """Add one step of ``positions`` tokens.

        Returns:
            The 32-byte id of the receipt for every step so far (what both ends sign), or ``None`` while no
            position is billed (replay only). :attr:`state` then holds ``(billed, inputs_root, outputs_root)``.

        Raises:
            ValueError: ``positions < 1``.
        """
        if positions < 1:
            raise ValueError("a step has at least one position")
        self.inputs.append(input_commitment)
        self.outputs.append(output_commitment)
        self.steps += 1
        self.positions += positions
        billed = self.billed
        if billed == 0:
            self.state = (0, b"", b"")
            return None
        self.state = (billed, self.inputs.root(), self.outputs.root())
        return self.id_of(*self.state)

    def id_of(self, billed: int, inputs_root: bytes, outputs_root: bytes) -> bytes:
        """Id of this session's receipt with these moving fields (``billed >= 1``); equals ``receipt_of(...).id``."""
        h = self._prefix.copy()
        h.update(b"".join((_pack_uint(billed), _BIN32, inputs_root, _BIN32, outputs_root, self._mid,
                           _pack_uint(self._base + billed * self._blocks_price), self._suffix)))
        return h.digest()

    def receipt_of(self, billed: int, inputs_root: bytes, outputs_root: bytes) -> Receipt | TabReceipt:
        """The unsigned :class:`Receipt` (or :class:`TabReceipt`, for a session on a tab) of this session with
        these moving fields."""
        t = self.terms
        if t.tab is not None:
            return TabReceipt(t.chain_id, t.session_id, t.worker, t.requester, t.model_id, t.start, t.end, billed,
                              inputs_root, outputs_root, t.tab.tab_id, t.tab.nonce,
                              t.tab.before + billed * self._blocks_price, t.opened_height, t.compression)
        return Receipt(t.chain_id, t.session_id, t.worker, t.requester, t.model_id, t.start, t.end, billed,
                       inputs_root, outputs_root, billed * self._blocks_price, t.opened_height, t.compression)

    def current(self) -> Receipt | TabReceipt | None:
        """The unsigned receipt for every step so far, or ``None`` while no position is billed (replay only)."""
        if self.billed == 0:
            return None
        return self.receipt_of(self.billed, self.inputs.root(), self.outputs.root())


def store_blob(blobs: BlobStore, root: bytes, tensors: list[torch.Tensor]) -> None:
    """:meth:`node.blobs.BlobStore.put` for tensors whose Merkle root is already known (the running receipt's
    ``inputs_root`` or ``outputs_root``), without hashing them all again; same file, same format."""
    path = blobs.dir / root.hex()
    if path.exists():
        return
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(pack([tensor_to_wire(t) for t in tensors]))
    os.replace(tmp, path)
