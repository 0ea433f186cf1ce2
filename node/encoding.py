"""Canonical encoding, hashing and tensor commitments shared by every layer.

* Hash: BLAKE2b with a 32-byte digest (``hashlib.blake2b(digest_size=32)``), used everywhere.
* Wire and signed objects are msgpack. Every decode of bytes that came from outside this process goes
  through :func:`unpack` with hard limits, so a tiny frame cannot declare a huge container.
* A signed object is encoded canonically as a msgpack array ``[domain_tag, chain_id, *fields]``; its id is
  the hash of those bytes (the unsigned fields), and signatures are over that 32-byte id.
* A tensor commitment is ``H(dtype ‖ shape ‖ contiguous little-endian bytes)``.

No pickle, no ``torch.load``: tensors travel as ``{"dtype": str, "shape": [int], "data": bytes}``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

HASH_LEN = 32
MAX_FRAME = 1 << 20  # 1 MiB per wire frame (DESIGN.md, Runtime)
MAX_MESSAGE = 64 << 20  # a message reassembled from frames is at most 64 MiB
MAX_DEPTH = 32  # containers nested in a message from outside (the deepest Tally object nests ~6)
COST_RATIO = 8  # estimated bytes of Python objects per wire byte a decode may build (see scan_msgpack)
COST_SLACK = 64 << 10  # estimated bytes any message may build beyond COST_RATIO x its size

# dtype codes accepted on the wire -> (numpy dtype name, bytes per value). bfloat16 travels as raw 2-byte words.
# Names, not numpy types: numpy is imported where a tensor is encoded or decoded, not by every user of this module.
WIRE_DTYPES = {
    "float32": ("float32", 4),
    "float16": ("float16", 2),
    "bfloat16": ("uint16", 2),
    "int64": ("int64", 8),
    "int32": ("int32", 4),
    "uint8": ("uint8", 1),
    "int8": ("int8", 1),  # int8 pseudo-gradient codes (node.training.codec)
}


class DecodeError(ValueError):
    """Raised for malformed, oversized or ill-typed data from outside the process."""


def H(*parts: bytes) -> bytes:
    """BLAKE2b-256 of the concatenation of ``parts``. Returns 32 bytes."""
    h = hashlib.blake2b(digest_size=HASH_LEN)
    for p in parts:
        h.update(p)
    return h.digest()


def pack(obj: Any) -> bytes:
    """Deterministic msgpack encoding (bin type for bytes, no floats reordered, maps as given)."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def unpack(data: bytes | bytearray | memoryview, *, max_size: int = MAX_MESSAGE, max_depth: int = MAX_DEPTH,
           cost_ratio: float = COST_RATIO, cost_slack: int = COST_SLACK, max_objects: int | None = None) -> Any:
    """Decode msgpack from an untrusted source with hard limits, refusing before it allocates.

    First :func:`scan_msgpack` walks the bytes (nothing is built) and refuses nesting deeper than ``max_depth``
    and messages whose decoded objects would take more than :func:`decode_budget` (``cost_slack + cost_ratio x
    len(data)`` bytes, estimated); only then does msgpack build the objects. So a message of N bytes costs at
    most ~``cost_ratio`` x N bytes of memory (plus ``cost_slack``), whatever its shape.

    Args:
        data: the bytes, at most ``max_size`` bytes.
        max_size: largest accepted size, in bytes.
        max_depth: deepest container nesting.
        cost_ratio, cost_slack: the decode budget (estimated bytes of Python objects per wire byte, and beyond).
        max_objects: most objects (containers and scalars) allowed, ``None`` for the cost bound alone.

    Raises:
        DecodeError: the bytes are larger than ``max_size``, truncated, malformed, nest deeper than
            ``max_depth``, hold more than ``max_objects`` objects, would cost more than the budget, or declare
            containers beyond msgpack's limits.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError("expected bytes")
    if len(data) > max_size:
        raise DecodeError(f"payload of {len(data)} bytes exceeds limit {max_size}")
    if isinstance(data, memoryview):
        data = data.tobytes()
    scan_msgpack(data, max_depth=max_depth, max_cost=decode_budget(len(data), cost_ratio, cost_slack),
                 max_objects=max_objects)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_size,
            max_str_len=1 << 20,
            max_array_len=1 << 16,
            max_map_len=1 << 10,
            max_ext_len=0,
        )
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as e:
        raise DecodeError(f"malformed msgpack: {e}") from None


def unpack_local(data: bytes) -> Any:
    """Decode msgpack that this node wrote itself (its own LevelDB: state tables, block records, undo and meta
    records), skipping :func:`unpack`'s hostile-input scan, which costs ~10x the decode on small mixed objects.

    Trusted bytes only: never call this on bytes a peer or a client sent (they go through :func:`unpack`). The
    result is the same as :func:`unpack`'s for any bytes :func:`pack` wrote.

    Raises:
        DecodeError: the bytes are not one well-formed msgpack object (a damaged store).
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as e:
        raise DecodeError(f"malformed msgpack in the local store: {e}") from None


# ---------------------------------------------------------------- bounded decoding


# The per-object size estimates of :func:`scan_msgpack`, from ``sys.getsizeof`` on CPython 3.11 (64-bit): an
# int above 256 or below -5 is 28-36 bytes, a float 24, a str 49 + its length (ASCII) or up to 80 + 4 x its
# length, a bytes 33 + its length, a list 56 + 8 per element, a dict 64 empty and at most 144 + 40 per entry
# (msgpack presizes it). None, booleans, ints in -5..256, "" and 1-character strings are shared, costing only
# the 8-byte slot of their container.
_SCALAR, _STR, _BIN, _ARRAY, _MAP, _BAD = range(6)
_INT, _BIG, _FLOAT = 28, 36, 24
_LIST_BASE, _DICT_EMPTY, _DICT_BASE, _SLOT, _DICT_ENTRY = 56, 64, 144, 8, 40
_STR_BASE, _STR_WIDE, _BIN_BASE = 49, 80, 33


def _type_table() -> list[tuple[int, int, int]]:
    """For each msgpack type byte: ``(kind, header bytes, n)`` where ``n`` is the estimated size of a scalar
    (its header is all of it), the element count or payload length of a fix type, or for a type with a length
    field, minus the number of bytes of that field (msgpack spec, "Formats")."""
    t: list[tuple[int, int, int]] = [(_BAD, 1, 0)] * 256
    for b in range(0x00, 0x80):
        t[b] = (_SCALAR, 1, 0)  # positive fixint: shared small ints
    for b in range(0x80, 0x90):
        t[b] = (_MAP, 1, b & 0x0F)
    for b in range(0x90, 0xA0):
        t[b] = (_ARRAY, 1, b & 0x0F)
    for b in range(0xA0, 0xC0):
        t[b] = (_STR, 1, b & 0x1F)
    for b in range(0xE0, 0x100):
        t[b] = (_SCALAR, 1, _INT)  # negative fixint (-32..-6 are not shared)
    t[0xC0] = t[0xC2] = t[0xC3] = (_SCALAR, 1, 0)  # nil, false, true
    t[0xC4], t[0xC5], t[0xC6] = (_BIN, 2, -1), (_BIN, 3, -2), (_BIN, 5, -4)
    t[0xCA], t[0xCB] = (_SCALAR, 5, _FLOAT), (_SCALAR, 9, _FLOAT)
    t[0xCC], t[0xCD], t[0xCE], t[0xCF] = (_SCALAR, 2, _INT), (_SCALAR, 3, _INT), (_SCALAR, 5, _BIG), \
        (_SCALAR, 9, _BIG)
    t[0xD0], t[0xD1], t[0xD2], t[0xD3] = (_SCALAR, 2, _INT), (_SCALAR, 3, _INT), (_SCALAR, 5, _INT), \
        (_SCALAR, 9, _BIG)
    t[0xD9], t[0xDA], t[0xDB] = (_STR, 2, -1), (_STR, 3, -2), (_STR, 5, -4)
    t[0xDC], t[0xDD] = (_ARRAY, 3, -2), (_ARRAY, 5, -4)
    t[0xDE], t[0xDF] = (_MAP, 3, -2), (_MAP, 5, -4)
    return t  # 0xC1 (never used) and every ext type (0xC7-0xC9, 0xD4-0xD8) stay _BAD: Tally sends no ext


_TYPES = _type_table()
_ONE = [b <= 0x7F or b in (0x80, 0x90, 0xA0, 0xC0, 0xC2, 0xC3) for b in range(256)]  # shared 1-byte objects
# a run of objects that are one byte each and shared (positive fixint, nil, false, true, "", {} and []): the
# walker skips it with one regex match and two byte counts instead of one loop turn per byte
_RUN = re.compile(rb"[\x00-\x7f\x80\x90\xa0\xc0\xc2\xc3]+")
# runs of one scalar type (an array of floats, of uint16 token ids, of negative fixints), matched the same way;
# possessive (++) so that the regex engine keeps no backtracking state per repetition (it would, ~140 bytes each)
_SCALAR_RUNS = {b: re.compile(rb"[\xe0-\xff]+" if b >= 0xE0 else rb"(?:\x%02x.{%d})++" % (b, size - 1), re.DOTALL)
                for b, (kind, size, _) in enumerate(_TYPES) if kind == _SCALAR and not _ONE[b]}
_PAYLOAD_RUNS: dict[bytes, re.Pattern[bytes]] = {}  # header -> a run of that header and its payload (<= 544)


def _payload_run(header: bytes, length: int, kind: int) -> re.Pattern[bytes]:
    """A possessive regex for a run of bin 8 or str 8 / fixstr objects of ``header`` (one length): any payload
    bytes for bin, ASCII only for str (so each is ``_STR_BASE + length`` bytes decoded). At most 32 fixstr, 256
    str 8 and 256 bin 8 headers: the cache is bounded."""
    pat = _PAYLOAD_RUNS.get(header)
    if pat is None:
        body = rb".{%d}" % length if kind == _BIN else rb"[\x00-\x7f]{%d}" % length
        pat = _PAYLOAD_RUNS[header] = re.compile(rb"(?:%s%s)++" % (re.escape(header), body), re.DOTALL)
    return pat


class Shape:
    """What :func:`scan_msgpack` found: ``objects`` (count, containers included), ``depth`` (deepest container
    nesting; 0 for a scalar) and ``cost`` (estimated bytes of the decoded Python objects)."""

    __slots__ = ("cost", "depth", "objects")

    def __init__(self, objects: int, depth: int, cost: int):
        self.objects, self.depth, self.cost = objects, depth, cost

    def __repr__(self) -> str:
        return f"Shape(objects={self.objects}, depth={self.depth}, cost={self.cost})"


def scan_msgpack(data: bytes | bytearray, *, max_depth: int = MAX_DEPTH, max_cost: int | None = None,
                 max_objects: int | None = None) -> Shape:
    """Walk one msgpack object in ``data`` without building it, and refuse it before anything is allocated.

    An iterative walk over the type bytes (msgpack spec, "Formats"; no recursion): str and bin payloads are
    skipped by their declared length, containers push their declared element count on a stack. It stops at the
    first limit crossed, so its time is bounded by the budget, not by the message. Declared lengths are checked
    against the bytes present, so msgpack's preallocation of a declared container is always backed by at least
    one wire byte per element.

    Args:
        data: the bytes (``bytes`` or ``bytearray``).
        max_depth: deepest container nesting allowed (a top-level map is depth 1).
        max_cost: largest estimated size of the decoded objects, in bytes (``None``: unbounded).
        max_objects: most objects allowed, containers and scalars (``None``: unbounded).

    Returns:
        The message's :class:`Shape`.

    Raises:
        DecodeError: truncated data, bytes after the object, an unused or ext type byte, nesting deeper than
            ``max_depth``, more than ``max_objects`` objects or an estimated cost above ``max_cost``.
    """
    n = len(data)
    types, one, run, slot = _TYPES, _ONE, _RUN.match, _SLOT
    big = (1 << 62) if max_cost is None else max_cost
    most = (1 << 62) if max_objects is None else max_objects
    pos = objects = cost = deepest = 0
    pending = 1  # objects still to read, in every open container and at the top
    ends: list[int] = []  # per open container, innermost last: the value of ``pending`` once it is complete
    base = 0  # ends[-1], or 0 at the top: pending - base objects are left in the innermost container
    try:
        while pending:
            b = data[pos]  # IndexError past the end: truncated
            if one[b] and pos + 1 < n and one[data[pos + 1]]:  # a run of shared 1-byte objects in one container
                k = min(run(data, pos).end() - pos, pending - base)  # type: ignore[union-attr]  # 2 bytes match
                cost += _DICT_EMPTY * data.count(0x80, pos, pos + k) + _LIST_BASE * data.count(0x90, pos, pos + k)
                objects += k
                pending -= k
                pos += k
            else:
                kind, size, arg = types[b]
                objects += 1
                pending -= 1
                if kind == _SCALAR:
                    m = _SCALAR_RUNS[b].match(data, pos) if pos + size < n and data[pos + size] == b \
                        and pending > base else None
                    if m is not None:  # None also when this very scalar is truncated
                        k = min((m.end() - pos) // size, pending + 1 - base)
                        objects += k - 1
                        pending -= k - 1
                        cost += arg * k
                        pos += size * k
                    else:
                        cost += arg
                        pos += size
                elif kind == _BAD:
                    raise DecodeError(f"msgpack type byte 0x{b:02x} is not accepted (ext or unused)")
                else:
                    if arg < 0:  # a big-endian length field of -arg bytes follows the type byte
                        arg = data[pos + 1] if arg == -1 else int.from_bytes(data[pos + 1:pos + size], "big")
                        if pos + size > n:
                            raise IndexError
                    pos += size
                    if kind in (_BIN, _STR):
                        if arg > n - pos:
                            raise DecodeError(f"msgpack {'bin' if kind == _BIN else 'str'} of {arg} bytes, "
                                              f"{n - pos} bytes remain")
                        nxt = pos + arg
                        if kind == _BIN:
                            each = _BIN_BASE + arg
                        elif arg <= 1:  # "" and 1-character strings are shared
                            each = 0
                        else:
                            each = _STR_BASE + arg if data[pos:nxt].isascii() else _STR_WIDE + 4 * arg
                        cost += each
                        if size <= 2 and nxt + size <= n and data[nxt] == b and (size == 1 or data[nxt + 1] == arg) \
                                and pending > base:  # more of the same header: hashes, keys
                            m = _payload_run(bytes(data[pos - size:pos]), arg, kind).match(data, nxt)
                            k = 0 if m is None else min((m.end() - nxt) // (arg + size), pending - base)
                            objects += k
                            pending -= k
                            nxt += k * (arg + size)
                            cost += k * (_BIN_BASE + arg if kind == _BIN else _STR_BASE + arg if arg > 1 else 0)
                        pos = nxt
                    elif arg:  # a container that is not empty
                        count = arg if kind == _ARRAY else 2 * arg
                        if count > n - pos:  # every element takes at least one byte
                            raise DecodeError(f"msgpack container declares {count} elements, "
                                              f"{n - pos} bytes remain")
                        cost += _LIST_BASE + slot * arg if kind == _ARRAY else _DICT_BASE + _DICT_ENTRY * arg
                        ends.append(pending)
                        base = pending
                        pending += count
                        if len(ends) > deepest:
                            deepest = len(ends)
                            if deepest > max_depth:
                                raise DecodeError(f"msgpack nesting deeper than {max_depth}")
                    else:
                        cost += _LIST_BASE if kind == _ARRAY else _DICT_EMPTY
            while pending == base and ends:  # the innermost container is complete
                ends.pop()
                base = ends[-1] if ends else 0
            if cost > big or objects > most:
                if cost > big:
                    raise DecodeError(f"msgpack would take more than {big} bytes to decode (estimated)")
                raise DecodeError(f"msgpack holds more than {most} objects")
    except IndexError:
        raise DecodeError(f"truncated msgpack: {pending} more object(s) expected at byte {min(pos, n)}") from None
    if pos > n:
        raise DecodeError(f"truncated msgpack: the last scalar ends {pos - n} bytes past the data")
    if pos != n:
        raise DecodeError(f"{n - pos} bytes after the msgpack object")
    return Shape(objects, deepest, cost)


def decode_budget(size: int, ratio: float = COST_RATIO, slack: int = COST_SLACK) -> int:
    """The estimated bytes of Python objects a message of ``size`` bytes may decode to:
    ``slack + ratio x size``."""
    return int(slack + ratio * size)


def canonical(tag: bytes, chain_id: str, fields: Sequence[Any]) -> bytes:
    """Canonical bytes of a signed object: msgpack ``[tag, chain_id, *fields]``."""
    return pack([tag, chain_id, *fields])


def object_id(tag: bytes, chain_id: str, fields: Sequence[Any]) -> bytes:
    """32-byte id of a signed object: the hash of its unsigned canonical bytes."""
    return H(canonical(tag, chain_id, fields))


# ---------------------------------------------------------------- Merkle (RFC 9162, section 2.1.1)

def leaf_hash(data: bytes) -> bytes:
    """RFC 9162 leaf hash: ``H(0x00 ‖ data)``."""
    return H(b"\x00", data)


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 9162 interior node hash: ``H(0x01 ‖ left ‖ right)``."""
    return H(b"\x01", left, right)


def _largest_pow2_below(n: int) -> int:
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """Merkle Tree Hash of ``leaves`` (raw leaf data) as defined in RFC 9162 §2.1.1.

    The empty tree hashes to ``H(b"")``.
    """
    return _mth([leaf_hash(x) for x in leaves])


def _mth(hashes: Sequence[bytes]) -> bytes:
    n = len(hashes)
    if n == 0:
        return H(b"")
    if n == 1:
        return hashes[0]
    k = _largest_pow2_below(n)
    return node_hash(_mth(hashes[:k]), _mth(hashes[k:]))


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """Audit path for leaf ``index`` (RFC 9162 §2.1.3.1), list of 32-byte sibling hashes, bottom-up.

    Raises:
        IndexError: ``index`` is outside the tree.
    """
    if not 0 <= index < len(leaves):
        raise IndexError("leaf index out of range")
    return _path(index, [leaf_hash(x) for x in leaves])


def _path(m: int, hashes: Sequence[bytes]) -> list[bytes]:
    n = len(hashes)
    if n <= 1:
        return []
    k = _largest_pow2_below(n)
    if m < k:
        return _path(m, hashes[:k]) + [_mth(hashes[k:])]
    return _path(m - k, hashes[k:]) + [_mth(hashes[:k])]


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Check an RFC 9162 §2.1.3.2 inclusion proof of raw ``leaf`` at ``index`` in a tree of ``size``."""
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    r = leaf_hash(leaf)
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


# ---------------------------------------------------------------- tensors

def tensor_to_wire(t: Any) -> dict[str, Any]:
    """Encode a torch tensor or numpy array as ``{"dtype", "shape", "data"}`` (little-endian, contiguous)."""
    # local: torch takes ~2 s to import, numpy ~0.2 s; callers that compute nothing (CLI, validator) never load them
    import numpy as np
    import torch

    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            arr = t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)
            name = "bfloat16"
        else:
            arr = t.contiguous().cpu().numpy()
            name = str(arr.dtype)
    else:
        arr = np.ascontiguousarray(t)
        name = str(arr.dtype)
    if name not in WIRE_DTYPES:
        raise ValueError(f"dtype {name} cannot travel on the wire")
    arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return {"dtype": name, "shape": list(arr.shape), "data": arr.tobytes()}


def tensor_from_wire(obj: Any, *, max_elems: int = 1 << 26) -> Any:
    """Decode a wire tensor into a torch tensor, checking dtype code, shape and buffer length.

    Raises:
        DecodeError: unknown dtype, bad shape, or a buffer that does not match the shape.
    """
    # local: torch takes ~2 s to import, numpy ~0.2 s; callers that compute nothing (CLI, validator) never load them
    import numpy as np
    import torch

    if not isinstance(obj, dict):
        raise DecodeError("tensor must be a map")
    dtype, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    if dtype not in WIRE_DTYPES:
        raise DecodeError(f"unknown dtype code {dtype!r}")
    if not isinstance(shape, list) or len(shape) > 8 or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise DecodeError("bad tensor shape")
    if not isinstance(data, bytes):
        raise DecodeError("tensor data must be bytes")
    n = 1
    for d in shape:
        n *= d
    if n > max_elems:
        raise DecodeError("tensor too large")
    np_dtype, size = WIRE_DTYPES[dtype]
    if n * size != len(data):
        raise DecodeError(f"shape {shape} of {dtype} needs {n * size} bytes, got {len(data)}")
    arr = np.frombuffer(data, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(shape)
    t = torch.from_numpy(arr.astype(np_dtype, copy=True))
    if dtype == "bfloat16":
        t = t.view(torch.int16).view(torch.bfloat16)
    return t


def tensor_commitment(t: Any) -> bytes:
    """``H(dtype ‖ shape ‖ contiguous little-endian bytes)`` of a tensor; 32 bytes."""
    w = tensor_to_wire(t)
    return H(w["dtype"].encode(), pack(w["shape"]), w["data"])


def commitments_root(tensors: Iterable[Any]) -> bytes:
    """Merkle root (RFC 9162) over the commitments of an ordered sequence of tensors (e.g. session steps)."""
    return merkle_root([tensor_commitment(t) for t in tensors])


# ---------------------------------------------------------------- credits

AMOUNT_DECIMALS = 9  # 1 credit = 10^9 base units: an amount has at most 9 decimals
BASE_UNITS: int = 10**AMOUNT_DECIMALS
MAX_AMOUNT = 2**63 - 1  # the ledger's largest amount in base units (signed 64-bit integers on the wire)
MAX_CREDITS = MAX_AMOUNT // BASE_UNITS  # the largest whole number of credits
# The one spelling of an amount, wherever one enters (API bodies, CLI flags, genesis files): ASCII decimal digits
# without leading zeros ("0" alone is the integer part of "0.5"), optionally a point and 1 to 9 more digits.
# No sign, spaces, exponent, digit separators, non-ASCII digits, "1." or ".5".
AMOUNT_GRAMMAR = rf"(0|[1-9][0-9]*)(\.[0-9]{{1,{AMOUNT_DECIMALS}}})?"
AMOUNT_FORM = (f"plain decimal credits: ASCII digits without leading zeros, optionally a point and 1 to "
               f"{AMOUNT_DECIMALS} more digits (e.g. \"12\", \"0.5\", \"1.000000001\"); no sign, spaces, "
               f"exponent, separators, \"1.\" or \".5\"")
_AMOUNT = re.compile(AMOUNT_GRAMMAR)  # [0-9] is ASCII only (unlike \d, str.isdigit or int())
_TOO_PRECISE = re.compile(rf"(0|[1-9][0-9]*)\.[0-9]{{{AMOUNT_DECIMALS + 1},}}")
_MAX_AMOUNT_CHARS = len(str(MAX_CREDITS)) + 1 + AMOUNT_DECIMALS


class AmountSyntaxError(ValueError):
    """An amount not written in the canonical syntax (:data:`AMOUNT_GRAMMAR`); the message shows the form."""


def parse_amount(text: str, *, allow_zero: bool = False) -> int:
    """Parse a decimal credit amount in the canonical syntax (:data:`AMOUNT_GRAMMAR`, e.g. ``"1.001"``) into
    base units (10^-9 credit), exactly (integer arithmetic, no float or :class:`decimal.Decimal` rounding).

    ``allow_zero``: accept an amount of 0 (genesis balances); transfers, bonds and prices must be positive.

    Raises:
        AmountSyntaxError: not a string in the canonical syntax (the message shows :data:`AMOUNT_FORM`).
        ValueError: zero when ``allow_zero`` is false, or more than :data:`MAX_AMOUNT` base units.
    """
    if not isinstance(text, str):
        raise AmountSyntaxError(f"an amount is a string of {AMOUNT_FORM}, not {type(text).__name__}")
    m = _AMOUNT.fullmatch(text) if len(text) <= _MAX_AMOUNT_CHARS else None
    if m is None:
        if len(text) > _MAX_AMOUNT_CHARS and _AMOUNT.fullmatch(text):
            raise ValueError(f"amount must be at most {format_amount(MAX_AMOUNT)} credits")
        shown = text if len(text) <= 40 else text[:40] + "..."
        if _TOO_PRECISE.fullmatch(text):
            raise AmountSyntaxError(f"amount {shown!r} is more precise than one base unit "
                                    f"(10^-{AMOUNT_DECIMALS} credit); write {AMOUNT_FORM}")
        raise AmountSyntaxError(f"not an amount: {shown!r}; write {AMOUNT_FORM}")
    whole, frac = m.group(1), (m.group(2) or ".")[1:]
    units = int(whole) * BASE_UNITS + int(frac.ljust(AMOUNT_DECIMALS, "0"))
    if units > MAX_AMOUNT:
        raise ValueError(f"amount must be at most {format_amount(MAX_AMOUNT)} credits")
    if units == 0 and not allow_zero:
        raise ValueError("amount must be positive")
    return units


def format_amount(units: int) -> str:
    """Base units to a decimal credit string without trailing zeros (``1001000000`` -> ``"1.001"``).

    For ``0 <= units <= MAX_AMOUNT`` the result is canonical and :func:`parse_amount` reads it back exactly
    (``allow_zero=True`` for 0); a negative amount (a change, in reports) gets a leading ``-``.
    """
    sign = "-" if units < 0 else ""
    q, r = divmod(abs(units), BASE_UNITS)
    if r == 0:
        return f"{sign}{q}"
    return f"{sign}{q}.{r:0{AMOUNT_DECIMALS}d}".rstrip("0")
