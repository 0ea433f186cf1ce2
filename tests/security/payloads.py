"""Hostile byte strings for the hostile-peer suite: msgpack bombs and frames that lie about their length.

Every function returns the exact bytes an attacker writes to a stream (Tally's framing, :mod:`node.p2p.framing`:
a 4-byte big-endian payload length, a flag byte, the payload; bit 0 of the flags = more frames follow).
Sizes are in bytes. Nothing here allocates more than the bytes it returns.
"""

from __future__ import annotations

import struct

HDR = struct.Struct(">IB")
MORE = 0x01
FRAME_PAYLOAD = 1 << 20  # bytes per frame when a bomb is split into frames (Tally's MAX_FRAME is 1 MiB)


def frames(payload: bytes, per_frame: int = FRAME_PAYLOAD) -> bytes:
    """``payload`` as Tally frames of at most ``per_frame`` bytes each, the last with MORE clear."""
    out = bytearray()
    for off in range(0, max(len(payload), 1), per_frame):
        chunk = payload[off:off + per_frame]
        out += HDR.pack(len(chunk), MORE if off + per_frame < len(payload) else 0) + chunk
    return bytes(out)


def empty_maps(size: int) -> bytes:
    """A msgpack map ``{"x": [[{}, {}, ... 65,535], [...], ...]}`` of about ``size`` bytes: arrays of 65,535 empty
    maps (1 byte each on the wire, ~64 bytes each as Python dicts), as many as fit."""
    inner = b"\xdc\xff\xff" + b"\x80" * 0xFFFF
    n = max(1, size // len(inner))
    return b"\x81\xa1x" + b"\xdd" + struct.pack(">I", n) + inner * n


def wide_array(n: int = 65536) -> bytes:
    """``{"x": [{} * n]}``: one array of ``n`` empty maps (the issue's 65,536-element array)."""
    return b"\x81\xa1x\xdd" + struct.pack(">I", n) + b"\x80" * n


def deep(depth: int) -> bytes:
    """``{"x": [[[...[nil]...]]]}`` nested ``depth`` arrays deep (recursion and per-level cost)."""
    return b"\x81\xa1x" + b"\x91" * depth + b"\xc0"


def lying_array(claimed: int = 0xFFFFFFFF) -> bytes:
    """``{"x": array32 of ``claimed`` elements}`` followed by nothing: a decoder that preallocates by the header
    asks for ``claimed`` slots."""
    return b"\x81\xa1x\xdd" + struct.pack(">I", claimed)


def lying_bin(claimed: int = 0xFFFFFFFF) -> bytes:
    """``{"x": bin32 of ``claimed`` bytes}`` with 16 bytes present."""
    return b"\x81\xa1x\xc6" + struct.pack(">I", claimed) + b"\x00" * 16


def lying_map(claimed: int = 0xFFFFFFFF) -> bytes:
    """A map32 header claiming ``claimed`` pairs and none present."""
    return b"\xdf" + struct.pack(">I", claimed)


def huge_frame_header(length: int = 0xFFFFFFFF) -> bytes:
    """A frame header declaring ``length`` payload bytes, with a few bytes of payload after it."""
    return HDR.pack(length, 0) + b"\x80" * 8


def max_frames_then_stall(n: int) -> bytes:
    """``n`` full frames (1 MiB each) with MORE set, then nothing: a message the reader must buffer and that never
    ends."""
    return (HDR.pack(FRAME_PAYLOAD, MORE) + b"\x80" * FRAME_PAYLOAD) * n


KINDS = ["empty_maps", "wide_array", "deep", "lying_array", "lying_bin", "lying_map", "huge_frame", "many_frames"]


def bombs(size: int) -> dict[str, bytes]:
    """Every bomb, framed, for a protocol whose message limit is ``size`` bytes: name -> bytes to write."""
    return {
        "empty_maps": frames(empty_maps(size)),
        "wide_array": frames(wide_array(65536)),
        "deep": frames(deep(min(size, 1 << 20) - 8)),
        "lying_array": frames(lying_array()),
        "lying_bin": frames(lying_bin()),
        "lying_map": frames(lying_map()),
        "huge_frame": huge_frame_header(),
        "many_frames": max_frames_then_stall(max(1, min(size, 64 << 20) >> 20)),
    }
