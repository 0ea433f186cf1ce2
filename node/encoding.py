"""Canonical encoding, hashing and tensor commitments shared by every layer.

* Hash: BLAKE2b with a 32-byte digest (``hashlib.blake2b(digest_size=32)``), used everywhere.
* Wire and signed objects are msgpack. Every decode of bytes that came from outside this process goes
  through :func:`unpack` with hard limits, so a tiny frame cannot declare a huge container (the walk that
  refuses a message before it is built: :func:`node.msgscan.scan_msgpack`).
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

# DecodeError and MAX_DEPTH are exported from here, where every decoder imports them from (msgscan raises them)
from .msgscan import MAX_DEPTH as MAX_DEPTH, DecodeError as DecodeError, scan_msgpack

HASH_LEN = 32
MAX_FRAME = 1 << 20  # 1 MiB per wire frame (DESIGN.md, Runtime)
MAX_MESSAGE = 64 << 20  # a message reassembled from frames is at most 64 MiB
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
