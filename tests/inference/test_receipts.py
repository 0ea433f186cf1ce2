"""Running receipts (incremental Merkle roots, per-step receipts, replay billing) and the hidden-state codecs."""

from __future__ import annotations

import os

import msgpack
import pytest
import torch
from hypothesis import given, settings, strategies as st

from node.encoding import DecodeError, commitments_root, merkle_root, tensor_commitment
from node.inference.receipts import CLOCK, MerkleAccumulator, RunningReceipt, SessionTerms, TabTerms, _pack_uint
from node.inference.wire import CODECS, check_codec, decode_hidden, encode_hidden
from node.ledger.core.tabs import TabReceipt


def test_merkle_accumulator_equals_rfc9162_root_at_every_size():
    acc = MerkleAccumulator()
    leaves = []
    assert acc.root() == merkle_root([])
    for i in range(70):
        leaf = os.urandom(1 + i % 5)
        leaves.append(leaf)
        acc.append(leaf)
        assert acc.root() == merkle_root(leaves), i
        assert len(acc._hashes) <= i.bit_length() + 1


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1),
                 st.sampled_from([0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 2**32 - 1, 2**32, 2**64 - 1])))
def test_receipt_id_packs_integers_as_msgpack_does(n):
    assert _pack_uint(n) == msgpack.packb(n)


def test_receipt_id_matches_canonical_id_at_large_prices():
    for price in (1, 255, 65_536, 10**9, 10**12):  # up to ~2e18 base units per receipt
        t = SessionTerms("tally-test", b"s" * 16, b"w" * 32, b"r" * 32, b"m" * 32, 0, 30, 9, "fp16", 0, price)
        rr = RunningReceipt(t)
        for n in (300, 1, 70_000):
            rid = rr.append(os.urandom(32), os.urandom(32), n)
            assert rid == rr.current().id


def test_a_session_on_a_tab_is_a_tab_receipt_whose_cumulative_grows_from_the_tab_before_it():
    for before in (0, 1, 10**12):
        for nonce in (1, 300, 2**40):
            t = SessionTerms("tally-test", b"s" * 16, b"w" * 32, b"r" * 32, b"m" * 32, 2, 5, 9, "none", 1, 100,
                             TabTerms(b"t" * 32, nonce, before))
            rr = RunningReceipt(t)
            assert rr.append(b"a", b"b", 1) is None  # the replayed position is not billed
            for n in (4, 1, 70_000):
                rid = rr.append(os.urandom(32), os.urandom(32), n)
                r = rr.current()
                assert isinstance(r, TabReceipt) and rid == r.id  # the fast id is the tab receipt's canonical id
            assert (r.tab_id, r.tab_nonce, r.tokens) == (b"t" * 32, nonce, 70_005)
            assert r.cumulative == before + 70_005 * 3 * 100


def terms(replay=0):
    return SessionTerms("tally-test", b"s" * 16, b"w" * 32, b"r" * 32, b"m" * 32, 2, 5, 9, "none", replay, 100)


def test_running_receipt_commits_to_every_step_and_bills_after_the_replay():
    steps = [torch.randn(1, n, 8) for n in (4, 1, 1, 1)]
    outs = [torch.randn(1, n, 8) for n in (4, 1, 1, 1)]
    rr = RunningReceipt(terms())
    for i, (x, y) in enumerate(zip(steps, outs, strict=False)):
        rid = rr.append(tensor_commitment(x), tensor_commitment(y), x.shape[1])
        r = rr.current()
        assert rid == r.id == rr.receipt_of(*rr.state).id  # the fast id is the Receipt's canonical id
        assert r.inputs_root == commitments_root(steps[:i + 1]) and r.outputs_root == commitments_root(outs[:i + 1])
    assert (r.tokens, r.work, r.price, r.span_start, r.opened_height) == (7, 21, 2100, 2, 9)
    # a replacement that replays 5 positions: nothing billed until position 6, then only the new positions
    rr = RunningReceipt(terms(replay=5))
    assert rr.append(b"a", b"b", 5) is None and rr.billed == 0 and rr.current() is None
    rid = rr.append(b"c", b"d", 1)
    r = rr.current()
    assert rid == r.id and r.tokens == 1 and r.price == 300 and r.inputs_root == merkle_root([b"a", b"c"])
    with pytest.raises(ValueError):
        rr.append(b"e", b"f", 0)


@pytest.mark.parametrize("codec", CODECS)
def test_codec_roundtrip_and_commitment(codec):
    x = torch.randn(1, 3, 16) * 10
    wire, sent, c = encode_hidden(x, codec)
    got, c2 = decode_hidden(msgpack.unpackb(msgpack.packb(wire)), codec, 16, 3)
    assert torch.equal(got, sent) and c == c2 == tensor_commitment(sent)
    assert got.dtype == (torch.float16 if "fp16" in codec else torch.float32)
    if "fp16" not in codec:
        assert torch.equal(got, x)
    header = len(msgpack.packb({**wire, "data" if "data" in wire else "zstd": b""}))
    assert header < 40  # a small header: the payload is the tensor's own bytes


def _bad(codec="none", **over):
    w, _, _ = encode_hidden(torch.randn(1, 2, 16), codec)
    w.update(over)
    return w


@pytest.mark.parametrize("wire,codec,match", [
    ("notamap", "none", "map"),
    (_bad(dtype="complex64"), "none", "dtype"),
    (_bad(dtype="float16"), "none", "dtype"),  # a dtype other than the session's codec
    (_bad(shape=[1, 2]), "none", "shape"),
    (_bad(shape=[2, 1, 16]), "none", "shape"),
    (_bad(shape=[1, 2, 15]), "none", "shape"),
    (_bad(shape=[1, 2**40, 16]), "none", "shape"),  # a huge token count: refused before any allocation
    (_bad(shape=[1, True, 16]), "none", "shape"),
    (_bad(data=b"\x00" * 12), "none", "bytes"),  # buffer does not match the shape
    (_bad(data="text"), "none", "bytes"),
    (_bad(data=b"\x00\x00\xc0\x7f" * 32), "none", "finite"),  # NaN
    (_bad("zstd", zstd=b"\x28\xb5\x2f\xfd\x00\x00"), "zstd", "declares"),  # unknown content size
    (_bad("zstd", zstd=b"garbage"), "zstd", "zstd"),
    (_bad("zstd", zstd=_bad("zstd")["zstd"] + b"junk"), "zstd", "zstd"),  # trailing data
])
def test_hostile_hidden_states_are_refused(wire, codec, match):
    with pytest.raises(DecodeError, match=match):
        decode_hidden(wire, codec, 16, 4)


def test_zstd_frame_declaring_huge_size_is_refused_before_decompressing():
    import zstandard

    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(b"\x00" * (1 << 20))
    assert len(bomb) < 100
    with pytest.raises(DecodeError, match="declares 1048576"):
        decode_hidden({"dtype": "float32", "shape": [1, 2, 16], "zstd": bomb}, "zstd", 16, 4)
    with pytest.raises(DecodeError, match="2 positions, expected 3"):
        decode_hidden(encode_hidden(torch.randn(1, 2, 16), "none")[0], "none", 16, 4, positions=3)


def test_codec_names_and_clock():
    assert check_codec("fp16+zstd") == "fp16+zstd"
    with pytest.raises(ValueError):
        check_codec("gzip")
    CLOCK.reset()
    encode_hidden(torch.randn(1, 1, 16), "none")
    assert CLOCK.calls == 1 and CLOCK.seconds > 0


def test_store_blob_writes_what_blob_store_reads(tmp_path):
    from node.blobs import BlobStore, decode_blob
    from node.inference.receipts import store_blob

    blobs = BlobStore(tmp_path)
    tensors = [torch.randn(1, n, 8) for n in (3, 1, 1)]
    root = commitments_root(tensors)
    store_blob(blobs, root, tensors)
    assert blobs.has(root)
    got = decode_blob(blobs.get_wire(root), root)  # the committee's decoder checks the root
    assert all(torch.equal(a, b) for a, b in zip(got, tensors, strict=True))
