"""Bounded decoding of msgpack from outside the process: :func:`scan_msgpack` walks the bytes and refuses a
message before anything is built (too deep, too many objects, too costly to decode, truncated, malformed).

:func:`node.encoding.unpack` runs it on every untrusted message before msgpack decodes it. :class:`DecodeError` and
the nesting limit :data:`MAX_DEPTH` live here because the scan raises and defaults to them; :mod:`node.encoding`
exports both (its users import them from there).
"""

from __future__ import annotations

import re

MAX_DEPTH = 32  # containers nested in a message from outside (the deepest Tally object nests ~6)


class DecodeError(ValueError):
    """Raised for malformed, oversized or ill-typed data from outside the process."""


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
