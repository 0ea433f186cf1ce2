"""Canonical encoding, decode limits, RFC 9162 Merkle proofs, tensor wire format, credit amounts."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tracemalloc
from pathlib import Path

import msgpack
import pytest
import torch
from hypothesis import given, strategies as st

from node.encoding import (
    MAX_DEPTH,
    DecodeError,
    H,
    canonical,
    decode_budget,
    format_amount,
    inclusion_proof,
    merkle_root,
    object_id,
    pack,
    parse_amount,
    tensor_commitment,
    tensor_from_wire,
    tensor_to_wire,
    unpack,
    verify_inclusion,
)
from node.msgscan import scan_msgpack


def test_rfc9162_empty_and_single_leaf():
    assert merkle_root([]) == H(b"")
    assert merkle_root([b"a"]) == H(b"\x00", b"a")
    assert merkle_root([b"a", b"b"]) == H(b"\x01", H(b"\x00", b"a"), H(b"\x00", b"b"))


@given(st.lists(st.binary(max_size=8), min_size=1, max_size=40), st.data())
def test_inclusion_proofs_verify_and_reject_wrong_index(leaves, data):
    root = merkle_root(leaves)
    i = data.draw(st.integers(0, len(leaves) - 1))
    proof = inclusion_proof(leaves, i)
    assert verify_inclusion(leaves[i], i, len(leaves), proof, root)
    assert not verify_inclusion(leaves[i] + b"x", i, len(leaves), proof, root)
    if len(leaves) > 1:
        j = (i + 1) % len(leaves)
        if leaves[j] != leaves[i]:
            assert not verify_inclusion(leaves[i], j, len(leaves), proof, root)


def test_canonical_ids_depend_on_domain_and_chain():
    f = [1, b"x", "y"]
    assert canonical(b"tag", "c", f) == pack([b"tag", "c", 1, b"x", "y"])
    ids = {object_id(b"tag", "c", f), object_id(b"tag2", "c", f), object_id(b"tag", "c2", f)}
    assert len(ids) == 3


@pytest.mark.parametrize("payload", [
    b"\xdb\xff\xff\xff\xff",  # str32 declaring 4 GiB
    b"\xc6\x7f\xff\xff\xff",  # bin32 declaring 2 GiB
    b"\xdd\xff\xff\xff\xff",  # array32 declaring 4G items
    b"\xdf\xff\xff\xff\xff",  # map32 declaring 4G entries
    b"\x92\x01",  # truncated array
    b"\xc1",  # never-used byte
    b"\x01\x02",  # trailing data
])
def test_unpack_refuses_malformed_and_huge_declarations(payload):
    with pytest.raises(DecodeError):
        unpack(payload)


def test_unpack_refuses_oversized_payload_and_ext_types():
    with pytest.raises(DecodeError):
        unpack(b"\x00" * 100, max_size=10)
    with pytest.raises(DecodeError):
        unpack(msgpack.packb(msgpack.ExtType(1, b"evil")))


def test_tensor_wire_round_trip_and_checks():
    for t in (torch.randn(1, 3, 5), torch.randn(2, 2).to(torch.bfloat16), torch.arange(6, dtype=torch.int64)):
        back = tensor_from_wire(unpack(pack(tensor_to_wire(t))))
        assert back.dtype == t.dtype and torch.equal(back, t)
        assert tensor_commitment(back) == tensor_commitment(t)
    w = tensor_to_wire(torch.zeros(2, 3))
    for bad in ({**w, "dtype": "float128"}, {**w, "shape": [2, 4]}, {**w, "shape": [-1, 6]},
                {**w, "data": w["data"][:-1]}, {**w, "shape": "2x3"}, [1, 2]):
        with pytest.raises(DecodeError):
            tensor_from_wire(bad)


def test_commitment_covers_dtype_and_shape():
    t = torch.zeros(2, 3)
    assert len({tensor_commitment(t), tensor_commitment(t.reshape(3, 2)),
                tensor_commitment(t.to(torch.float16))}) == 3


@pytest.mark.parametrize("text,units", [("1.001", 1_001_000_000), ("0.000000001", 1), ("42", 42 * 10**9),
                                        ("2.50", 2_500_000_000), ("9223372036.854775807", 2**63 - 1)])
def test_parse_amount_exact(text, units):
    assert parse_amount(text) == units


@pytest.mark.parametrize("text", ["0", "-1", "NaN", "inf", "-Infinity", "0.0000000001", "1,5", "", "abc",
                                  "1.0000000005", "1e400", "1e999999999", "9223372037",
                                  " 2.5 ", "1e-9", "01", "1.", ".5", "+1", "\uff11", "9223372036.854775808"])
def test_parse_amount_refuses(text):
    with pytest.raises(ValueError):
        parse_amount(text)


def test_format_amount():
    assert format_amount(1_001_000_000) == "1.001" and format_amount(5 * 10**9) == "5"
    assert format_amount(-1) == "-0.000000001"




# ---------------------------------------------------------------- bounded decoding (issue 23, finding 1)

def _bomb(element: bytes, keys: int = 126, per_array: int = 65535) -> bytes:
    """A map of ``keys`` keys, each an array of ``per_array`` copies of ``element``: 126 x 65,535 one-byte
    elements is the review's 7.9 MiB message."""
    arr = b"\xdc" + per_array.to_bytes(2, "big") + element * per_array
    return b"\xde" + keys.to_bytes(2, "big") + b"".join(b"\xa3" + f"{i:03d}".encode() + arr for i in range(keys))


def _peak(fn) -> int:
    """Peak bytes traced by tracemalloc while ``fn()`` runs (its result is dropped inside)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(DecodeError):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


SHAPES = {  # wire bytes -> how they look; the first three are bombs, the others honest bulk shapes
    "empty maps": _bomb(b"\x80", keys=16),
    "empty arrays": _bomb(b"\x90", keys=16),
    "negative fixints": _bomb(b"\xe0", keys=16),
    "small maps": pack([{"a": i % 100, "b": b"xy"} for i in range(30000)]),
    "uint16 ints": pack([[1000 + i for i in range(30000)] for _ in range(8)]),
    "fixints": _bomb(b"\x05", keys=16),
    "hashes": pack({"h": [bytes([i % 256]) * 32 for i in range(30000)]}),
    "strings": pack([f"/ip4/10.0.0.{i % 256}/tcp/{i}/p2p/12D3KooW" for i in range(30000)]),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("ratio", [4, 8])
def test_decode_memory_is_bounded_by_the_budget(shape, ratio):
    """Whatever the shape, decoding N bytes (or refusing them) peaks below ratio x N + the slack, as traced by
    tracemalloc; honest bulk shapes decode, the bombs are refused before msgpack allocates."""
    data = SHAPES[shape]
    peak = _peak(lambda: unpack(data, cost_ratio=ratio))
    assert peak <= decode_budget(len(data), ratio) + (64 << 10), (shape, peak / len(data))
    if shape in ("hashes", "strings") or (shape == "fixints" and ratio == 8):
        assert unpack(data, cost_ratio=ratio) == msgpack.unpackb(data)


def test_the_reviews_nested_map_bomb_is_refused_before_allocating():
    data = _bomb(b"\x80")  # 7.9 MiB: ~590 MiB of dicts before the fix (measured peak RSS)
    assert 7.8 * (1 << 20) < len(data) < 8 * (1 << 20)
    with pytest.raises(DecodeError, match="estimated"):
        unpack(data)
    assert _peak(lambda: unpack(data)) < 1 << 20  # the walk allocates nothing per object


def test_bomb_peak_rss_in_a_fresh_process():
    """The same bomb decoded in a process of its own: its peak RSS (ru_maxrss) grows by less than 4 x N."""
    code = ("import resource, sys\n"
            "from node.encoding import DecodeError, unpack\n"
            "from tests.test_encoding import _bomb\n"
            "data = _bomb(b'\\x80')\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "try:\n    unpack(data)\nexcept DecodeError:\n    pass\n"
            "print(len(data), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout.split()
    n, grown = int(out[0]), int(out[1])
    assert grown < 4 * n, grown


def test_depth_limit():
    nested: object = 1
    for _ in range(MAX_DEPTH):
        nested = [nested]
    assert unpack(pack(nested)) == nested and scan_msgpack(pack(nested)).depth == MAX_DEPTH
    with pytest.raises(DecodeError, match="deeper"):
        unpack(pack([nested]))
    with pytest.raises(DecodeError, match="deeper"):
        unpack(pack({"a": nested}), max_depth=MAX_DEPTH - 1)
    with pytest.raises(DecodeError, match="deeper"):  # msgpack's own stack error is never reached
        unpack(b"\x91" * 5000 + b"\xc0")


def test_object_limit_and_declared_counts_are_backed_by_bytes():
    assert scan_msgpack(pack(list(range(100)))).objects == 101
    unpack(pack(list(range(100))), max_objects=101)
    with pytest.raises(DecodeError, match="objects"):
        unpack(pack(list(range(100))), max_objects=100)
    # 1,000 nested array16 headers each declaring 65,535 elements: msgpack would preallocate 512 KiB per level
    with pytest.raises(DecodeError, match="declares"):
        scan_msgpack(b"\xdc\xff\xff" * 1000)


def test_scan_counts_what_msgpack_builds():
    obj = {"a": [1, -1, -30, 300, 1.5, None, True, "", "x", "héllo", b"\x00" * 40, {}, []], "b": {"c": [[]]}}
    shape = scan_msgpack(pack(obj))
    assert (shape.objects, shape.depth) == (21, 3)  # 4 containers, 4 keys, 13 scalars
    assert shape.cost >= sys.getsizeof(obj["a"]) + sys.getsizeof(obj)  # an estimate from above


@given(st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
                    | st.text(max_size=20) | st.binary(max_size=40),
                    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=6), kids, max_size=6),
                    max_leaves=60))
def test_scan_accepts_every_valid_message_and_unpack_round_trips(obj):
    data = pack(obj)
    shape = scan_msgpack(data)
    assert shape.objects >= 1 and shape.depth <= MAX_DEPTH
    assert unpack(data, cost_ratio=1000) == obj


@given(st.binary(max_size=300))
def test_random_bytes_decode_or_refuse_cleanly(data):
    with contextlib.suppress(DecodeError):  # any other exception fails the test
        unpack(data)


@given(st.sampled_from([1.5, 300, 70000, -30, -3, 2**40, -(2**40), 7, None, True, "", "a", "ab", "é" * 3, "x" * 31,
                        "y" * 200, "z" * 300, "ü" * 40, b"", b"x" * 32, b"y" * 200, b"z" * 300, {}, []]),
       st.integers(0, 40), st.integers(0, 40))
def test_runs_of_one_type_count_like_single_objects(item, a, b):
    """The walker's shortcuts over runs of one type (regex matches) stop at container ends and count exactly
    what a walk object by object counts."""
    one = scan_msgpack(pack(item))
    shape = scan_msgpack(pack([[item] * a, [item] * b, item]))
    assert shape.objects == 3 + a + b + 1
    assert shape.cost == (56 + 8 * 3) + 2 * 56 + 8 * (a + b) + (a + b + 1) * one.cost
    assert shape.depth == (2 if a or b else 1)
