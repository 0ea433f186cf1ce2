"""Canonical encoding, decode limits, RFC 9162 Merkle proofs, tensor wire format, credit amounts."""

from __future__ import annotations


import msgpack
import pytest
import torch
from hypothesis import given, strategies as st

from node.encoding import (DecodeError, H, canonical, format_amount, inclusion_proof, merkle_root, object_id,
                           pack, parse_amount, tensor_commitment, tensor_from_wire, tensor_to_wire, unpack,
                           verify_inclusion)


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


