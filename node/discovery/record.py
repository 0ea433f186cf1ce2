"""The span record: one server's signed, expiring statement of what it serves (pure; no I/O).

A record names the server's account (its Ed25519 key, which is also its libp2p peer id), the model, the span
``[start, end)``, its measured throughput and latency, its free KV cache, up to :data:`MAX_ADDRS` addresses, a
sequence number (a newer record of the same server replaces an older one) and an absolute expiry in Unix
seconds. Its signature covers the BLAKE2b-256 digest of every other field, so a peer that stores and re-serves
it cannot change a byte; an expiry is accepted only within ``MAX_TTL + CLOCK_SKEW`` seconds of the reader's
clock, so a storer cannot serve a record past the life its server gave it (DNS-like TTLs would let it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..encoding import DecodeError, H, pack, unpack
from ..keys import Identity, is_valid_account, verify

MAX_RECORD_BYTES = 2048  # an encoded record; a larger one is refused before it is decoded
MAX_ADDRS = 8
MAX_ADDR_LEN = 256  # characters of one multiaddr
MAX_TTL = 900  # seconds a record may live from the reader's now (servers republish every REPUBLISH_S)
CLOCK_SKEW = 60  # seconds of disagreement between clocks tolerated on expiry
MAX_BLOCK = 1 << 16  # highest block index a record may name
TAG = b"tally/span-record/v1"


class RecordError(ValueError):
    """A span record that is malformed, too large, expired, from too far in the future, or badly signed."""


@dataclass(frozen=True)
class SpanRecord:
    """One server's span, as it signed it.

    ``account``: 32-byte Ed25519 key of the server. ``model_id``: 32 bytes. ``start``/``end``: the span's blocks,
    ``0 <= start < end <= MAX_BLOCK``. ``throughput``: tokens/s through the whole span (0: unknown).
    ``latency``: seconds per decoding step (0: unknown). ``free_cache``: tokens of KV cache free (-1: not said).
    ``addrs``: up to :data:`MAX_ADDRS` multiaddr strings. ``seq``: the server's sequence number (larger is newer).
    ``expires``: Unix seconds. ``sig``: 64-byte Ed25519 signature of :meth:`digest`.
    """

    account: bytes
    model_id: bytes
    start: int
    end: int
    throughput: float
    latency: float
    free_cache: int
    addrs: tuple[str, ...]
    seq: int
    expires: int
    sig: bytes = b""

    def body(self) -> list[Any]:
        """The signed fields, in order (msgpack list)."""
        return [self.account, self.model_id, self.start, self.end, self.throughput, self.latency, self.free_cache,
                list(self.addrs), self.seq, self.expires]

    def digest(self) -> bytes:
        """BLAKE2b-256 over :data:`TAG` and the packed :meth:`body` (32 bytes: what the server signs)."""
        return H(TAG, pack(self.body()))

    def encode(self) -> bytes:
        """The record on the wire: msgpack ``[body..., sig]``, at most :data:`MAX_RECORD_BYTES`."""
        return pack([*self.body(), self.sig])


def sign_record(ident: Identity, model_id: bytes, start: int, end: int, *, throughput: float = 0.0,
                latency: float = 0.0, free_cache: int = -1, addrs: tuple[str, ...] = (), seq: int,
                expires: int) -> SpanRecord:
    """A record of ``ident``'s span, signed, checked as a reader would check it (at ``expires - MAX_TTL``'s
    clock, so any expiry up to MAX_TTL ahead passes).

    Raises:
        RecordError: a field out of bounds (the same checks :func:`decode_record` makes).
    """
    unsigned = SpanRecord(ident.account, model_id, start, end, float(throughput), float(latency), int(free_cache),
                          tuple(addrs)[:MAX_ADDRS], int(seq), int(expires))
    rec = SpanRecord(**{**unsigned.__dict__, "sig": ident.sign(unsigned.digest())})
    _check_fields(rec)
    return rec


def _check_fields(r: SpanRecord) -> None:
    if not is_valid_account(r.account):
        raise RecordError("account is not an Ed25519 key")
    if len(r.model_id) != 32:
        raise RecordError("model_id must be 32 bytes")
    if not 0 <= r.start < r.end <= MAX_BLOCK:
        raise RecordError(f"bad span [{r.start}, {r.end})")
    for x in (r.throughput, r.latency):
        if not (math.isfinite(x) and 0.0 <= x <= 1e12):
            raise RecordError("throughput and latency must be finite and >= 0")
    if not -1 <= r.free_cache < 1 << 40:
        raise RecordError("bad free_cache")
    if len(r.addrs) > MAX_ADDRS or any(not isinstance(a, str) or not 0 < len(a) <= MAX_ADDR_LEN for a in r.addrs):
        raise RecordError(f"at most {MAX_ADDRS} addresses of at most {MAX_ADDR_LEN} characters")
    if not 0 <= r.seq < 1 << 63 or not 0 <= r.expires < 1 << 40:
        raise RecordError("bad seq or expiry")
    if len(r.encode()) > MAX_RECORD_BYTES:
        raise RecordError(f"a record is at most {MAX_RECORD_BYTES} bytes")


def decode_record(data: bytes, now: float) -> SpanRecord:
    """Decode and check a record from a peer (hostile until this returns).

    Args:
        data: the encoded record, at most :data:`MAX_RECORD_BYTES` (checked before decoding).
        now: the reader's clock, Unix seconds.

    Raises:
        RecordError: too large, malformed, a field out of bounds, expired (``expires <= now``), expiring more than
            ``MAX_TTL + CLOCK_SKEW`` seconds after ``now``, or the signature does not verify.
    """
    if not isinstance(data, bytes) or len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"a record is bytes, at most {MAX_RECORD_BYTES}")
    try:
        f = unpack(data, max_size=MAX_RECORD_BYTES, max_depth=3, max_objects=64)
    except DecodeError as e:
        raise RecordError(f"malformed record: {e}") from None
    if not isinstance(f, list) or len(f) != 11:
        raise RecordError("a record is a list of 11 fields")
    account, model_id, start, end, thr, lat, free, addrs, seq, expires, sig = f
    if not (isinstance(account, bytes) and isinstance(model_id, bytes) and isinstance(sig, bytes)
            and all(type(x) is int for x in (start, end, free, seq, expires))
            and all(type(x) in (int, float) for x in (thr, lat)) and isinstance(addrs, list)):
        raise RecordError("a record field has the wrong type")
    rec = SpanRecord(account, model_id, start, end, float(thr), float(lat), free, tuple(addrs), seq, expires, sig)
    _check_fields(rec)
    if rec.encode() != data:  # one encoding per record: a float sent as an int would change the digest's input
        raise RecordError("not the record's canonical encoding")
    if rec.expires <= now:
        raise RecordError("expired")
    if rec.expires > now + MAX_TTL + CLOCK_SKEW:
        raise RecordError(f"expires more than {MAX_TTL + CLOCK_SKEW} s from now")
    if len(sig) != 64 or not verify(account, rec.digest(), sig):
        raise RecordError("bad signature")
    return rec
