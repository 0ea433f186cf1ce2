"""Dropping the SYNs of shunned source addresses in the kernel, with a classic BPF socket filter on the listening
socket (issue 23, check 3: a connection churn must not cost the node a core).

Refusing a connection in the accept loop (:mod:`node.p2p.listener_guard`) still costs the node an ``accept``, an
address lookup and a reset close per connection: ~1,600 connections/s from one attacking process kept ~0.4 of a
core busy. A socket filter attached to a *listening* TCP socket (``SO_ATTACH_FILTER``, Linux
``Documentation/networking/filter.rst``) runs on every packet delivered to that socket, the SYN included
(``tcp_v4_rcv`` → ``tcp_filter`` for ``TCP_LISTEN`` sockets): a SYN the filter drops never creates a request
socket, so the churn costs the node nothing in user space and the attacker waits out its SYN retransmits. The
filter needs no privilege and replaces the previous one atomically. Sockets accepted earlier keep the filter they
were cloned with, which never matches their own peer (its SYN passed), so established connections are untouched.

:func:`compile_filter` builds the program from prefixes (IPv4 or IPv6 networks); each prefix is compared word by
word against the packet's source address, reached with the ancillary offset ``SKF_NET_OFF`` (the network header,
since a TCP socket's filter sees the skb at its transport header). Packets of another IP version than a prefix's
never match it. At most :data:`MAX_PREFIXES` prefixes (the kernel takes ``BPF_MAXINSNS`` = 4096 instructions).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import socket
import struct
import sys
from typing import Any

log = logging.getLogger(__name__)

SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)  # asm-generic/socket.h
SO_DETACH_FILTER = getattr(socket, "SO_DETACH_FILTER", 27)
SKF_NET_OFF = -0x100000  # linux/filter.h: offsets from the network header
MAX_PREFIXES = 256  # 13 instructions each at most (IPv6) + 5: under BPF_MAXINSNS = 4096

# classic BPF opcodes (linux/bpf_common.h, linux/filter.h)
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_LD_B_ABS = 0x00 | 0x10 | 0x20  # BPF_LD | BPF_B | BPF_ABS
_ALU_AND_K = 0x04 | 0x50 | 0x00  # BPF_ALU | BPF_AND | BPF_K
_JMP_JA = 0x05 | 0x00  # BPF_JMP | BPF_JA
_JMP_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
_DROP, _ACCEPT = 0, 0xFFFFFFFF  # bytes of the packet kept: 0 drops it

Prefix = ipaddress.IPv4Network | ipaddress.IPv6Network


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)  # struct sock_filter


def _words(net: Prefix) -> list[tuple[int, int]]:
    """``(value, mask)`` of each 32-bit word of ``net``'s address that its prefix covers (host byte order)."""
    addr = net.network_address.packed
    out = []
    for i in range(0, len(addr), 4):
        bits = min(32, max(0, net.prefixlen - 8 * i))
        if bits == 0:
            break
        mask = (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF
        out.append((struct.unpack("!I", addr[i:i + 4])[0] & mask, mask))
    return out


def _section(prefixes: list[Prefix], src_off: int) -> list[bytes]:
    """Instructions dropping a packet whose source address (at ``SKF_NET_OFF + src_off``) is in any of
    ``prefixes``; falls through otherwise."""
    code: list[bytes] = []
    for net in prefixes:
        words = _words(net)
        if not words:
            continue  # a /0 would drop everyone: never compiled
        body: list[tuple[int, int, int]] = [(i, v, m) for i, (v, m) in enumerate(words)]
        per = [2 + (m != 0xFFFFFFFF) for _i, _v, m in body]  # ld, [and], jeq
        for j, (i, v, m) in enumerate(body):
            code.append(_insn(_LD_W_ABS, 0, 0, SKF_NET_OFF + src_off + 4 * i))
            if m != 0xFFFFFFFF:
                code.append(_insn(_ALU_AND_K, 0, 0, m))
            skip = sum(per[j + 1:]) + 1  # the rest of this prefix's words and its ret: to the next prefix
            code.append(_insn(_JMP_JEQ_K, 0, skip, v))
        code.append(_insn(_RET_K, 0, 0, _DROP))
    return code


def compile_filter(prefixes: list[Prefix]) -> bytes:
    """A classic BPF program (``struct sock_filter[]``, native byte order) that drops packets from any source in
    ``prefixes`` and accepts every other packet.

    Raises:
        ValueError: more than :data:`MAX_PREFIXES` prefixes.
    """
    if len(prefixes) > MAX_PREFIXES:
        raise ValueError(f"at most {MAX_PREFIXES} prefixes, got {len(prefixes)}")
    v4 = _section([p for p in prefixes if p.version == 4], 12)  # IPv4 source: bytes 12-15 of the header
    v6 = _section([p for p in prefixes if p.version == 6], 8)  # IPv6 source: bytes 8-23
    code = [_insn(_LD_B_ABS, 0, 0, SKF_NET_OFF), _insn(_ALU_AND_K, 0, 0, 0xF0)]  # A = version << 4
    code.append(_insn(_JMP_JEQ_K, 1, 0, 0x40))  # IPv4: into the v4 section
    code.append(_insn(_JMP_JA, 0, 0, len(v4) + 1))  # otherwise: past it (and its accept)
    code += v4
    code.append(_insn(_RET_K, 0, 0, _ACCEPT))
    code += v6
    code.append(_insn(_RET_K, 0, 0, _ACCEPT))
    return b"".join(code)


def attach(sock: Any, prefixes: list[Prefix]) -> bool:
    """Attach the filter of ``prefixes`` to ``sock`` (a listening socket, stdlib or trio), replacing its previous
    filter; with no prefixes the filter is detached. False (logged at DEBUG) where the platform refuses socket
    filters; never raises for that.

    Raises:
        ValueError: more than :data:`MAX_PREFIXES` prefixes.
    """
    if not sys.platform.startswith("linux"):
        return False
    if not prefixes:
        with contextlib.suppress(OSError):  # ENOENT: no filter was attached
            sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        return True
    program = compile_filter(prefixes)
    buf = ctypes.create_string_buffer(program, len(program))  # the kernel copies it during the call
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buf))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError as e:
        log.debug("could not attach a socket filter: %s", e)
        return False
    return True
