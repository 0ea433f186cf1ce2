"""Pseudo-gradient codecs: int8 error bound and zeros, top-k error feedback, top-k with 4-bit values (packing,
exact error feedback of the selection and the rounding, bytes per parameter), strict decode of peer payloads, and
the encodings pinned by hash (a posted run's codec must keep its meaning; two processes encode alike)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from node.encoding import commitments_root, tensor_from_wire, tensor_to_wire
from node.training.codec import PER_TENSOR, Codec, decode, encode, payload_bytes, topk_k

EPS32 = 2.0 ** -24
# |d − s·q| ≤ s/2, plus the float32 rounding of d/s (≤ 127.5·2^-24 code units) and of the decode product q·s.
INT8_SLACK = 2 * 127.5 * EPS32

finite32 = st.floats(min_value=-(2.0 ** 100), max_value=2.0 ** 100, allow_nan=False, allow_infinity=False, width=32)


def _randn(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(1, 300), elements=finite32))
def test_int8_round_trip_within_half_a_step(a):
    d = torch.from_numpy(a.copy())
    payload, res = encode([d], Codec.INT8)
    q, s = payload
    assert q.dtype == torch.int8 and q.shape == d.shape and s.dtype == torch.float32 and s.shape == (1,)
    assert int(q.min()) >= -127 and int(q.max()) <= 127
    absmax = float(d.abs().max())
    scale = float(s[0])
    assert scale == np.float32(np.float32(absmax) / np.float32(127))
    (back,) = decode(payload, Codec.INT8, [tuple(d.shape)])
    err = (back.double() - d.double()).abs()
    if scale >= 2.0 ** -126:  # a normal float32 scale
        assert float(err.max()) <= scale * (0.5 + INT8_SLACK)
    else:  # absmax/127 underflowed: documented as encoded to (near) zero
        assert float(err.max()) <= absmax
    # exact zeros stay exact zeros
    assert torch.all(back[d == 0] == 0)
    assert torch.equal(res[0], torch.zeros_like(d))


def test_int8_zero_tensor_and_exact_codes():
    z = torch.zeros(3, 4)
    d = torch.tensor([1.27, -0.635, 0.0, 0.01])
    payload, res = encode([z, d], Codec.INT8)
    assert float(payload[1][0]) == 0.0 and torch.equal(payload[0], torch.zeros(3, 4, dtype=torch.int8))
    assert torch.equal(payload[2], torch.tensor([127, -64, 0, 1], dtype=torch.int8))  # -63.5 rounds half to even
    out = decode(payload, Codec.INT8, [(3, 4), (4,)])
    assert torch.equal(out[0], z) and out[1][2] == 0 and out[1][0] == d[0]
    assert payload_bytes(payload) == 12 + 4 + 4 + 4
    assert all(torch.equal(r, torch.zeros_like(t)) for r, t in zip(res, [z, d], strict=True))


def test_int8_non_finite_stays_detectable():
    d = torch.tensor([1.0, float("nan"), 2.0])
    payload, _ = encode([d], Codec.INT8)
    (back,) = decode(payload, Codec.INT8, [(3,)])
    assert torch.isnan(back).all()


def test_int8_payload_travels_on_the_wire():
    payload, _ = encode([_randn(5, 7)], Codec.INT8)
    back = [tensor_from_wire(tensor_to_wire(t)) for t in payload]
    assert back[0].dtype == torch.int8 and torch.equal(back[0], payload[0]) and torch.equal(back[1], payload[1])
    assert commitments_root(back) == commitments_root(payload)


def test_none_is_identity_and_keeps_residual():
    d = [_randn(4, 3, seed=1), _randn(5, seed=2)]
    r = [torch.full((4, 3), 0.5), torch.full((5,), -1.0)]
    payload, res = encode(d, Codec.NONE, r)
    assert all(torch.equal(a, b) for a, b in zip(payload, d, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(res, r, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(decode(payload, Codec.NONE, [(4, 3), (5,)]), d, strict=True))
    payload[0][0, 0] = 99.0  # payloads are copies, not views of the caller's tensors
    assert d[0][0, 0] != 99.0


def test_topk_selects_largest_with_ties_to_lower_index():
    d = torch.tensor([0.5, -3.0, 2.0, -2.0, 2.0, 0.1, float("nan")])
    payload, res = encode([d], Codec.TOPK, topk_ppm=500_000)  # k = ceil(7 · 0.5) = 4
    idx, val = payload
    assert idx.dtype == torch.int32 and idx.tolist() == [1, 2, 3, 6]  # NaN ranks first; 2.0 at 2 beats 4
    assert val[:3].tolist() == [-3.0, 2.0, -2.0] and torch.isnan(val[3])
    assert res[0][[0, 4, 5]].tolist() == pytest.approx([0.5, 2.0, 0.1]) and res[0][1] == 0
    assert topk_k(7, 500_000) == 4 and topk_k(10, 1) == 1 and topk_k(10, 10**6) == 10 and topk_k(0, 5) == 0


FEEDBACK_SHAPES = [(64, 32), (100,), (3, 5, 7)]
FEEDBACK_ROUNDS = 12


def _feedback_rounds(codec, each_round):
    """:data:`FEEDBACK_ROUNDS` rounds of random Δs through ``codec`` at 2 % kept with error feedback, calling
    ``each_round(delta, e, payload, sent, residual)`` (``e = Δ + previous residual``) every round; then asserts
    that nothing was lost: Σ sent + the final residual equals Σ Δ up to the rounding of forming each e, and
    something really was held back."""
    residual = None
    sum_delta = [torch.zeros(s, dtype=torch.float64) for s in FEEDBACK_SHAPES]
    sum_sent = [torch.zeros(s, dtype=torch.float64) for s in FEEDBACK_SHAPES]
    sum_abs = [torch.zeros(s, dtype=torch.float64) for s in FEEDBACK_SHAPES]
    for r in range(FEEDBACK_ROUNDS):
        delta = [_randn(*s, seed=100 * r + i, scale=1e-3) for i, s in enumerate(FEEDBACK_SHAPES)]
        e = [d if residual is None else d + res for d, res in zip(delta, residual or delta, strict=True)]
        payload, residual = encode(delta, codec, residual, topk_ppm=20_000)
        sent = decode(payload, codec, FEEDBACK_SHAPES, topk_ppm=20_000)
        each_round(delta, e, payload, sent, residual)
        for i in range(len(FEEDBACK_SHAPES)):
            sum_delta[i] += delta[i].double()
            sum_sent[i] += sent[i].double()
            sum_abs[i] += delta[i].double().abs()
    for sd, ss, sa, res in zip(sum_delta, sum_sent, sum_abs, residual, strict=True):
        gap = float((ss + res.double() - sd).abs().max())
        # Only e = Δ + r rounds (r' = e − decoded is exact: 0 where sent, e elsewhere), by ≤ |e|·2^-24 per
        # round, and |e| ≤ Σ|Δ| up to that rounding.
        assert gap <= FEEDBACK_ROUNDS * float(sa.max()) * EPS32 * 1.01
        assert float(res.abs().max()) > 1e-4  # something really was held back (not a trivial identity)


def test_topk_error_feedback_loses_nothing():
    def each_round(delta, e, payload, sent, residual):
        assert payload_bytes(payload) == sum(8 * topk_k(int(np.prod(s)), 20_000) for s in FEEDBACK_SHAPES)

    _feedback_rounds(Codec.TOPK, each_round)


def test_topk_is_deterministic_and_pure():
    d = [_randn(1000, seed=3)]
    r = [_randn(1000, seed=4, scale=0.1)]
    r_copy = [r[0].clone()]
    a = encode(d, Codec.TOPK, r, topk_ppm=1234)
    b = encode(d, Codec.TOPK, r, topk_ppm=1234)
    assert commitments_root(a[0]) == commitments_root(b[0]) and torch.equal(a[1][0], b[1][0])
    assert torch.equal(r[0], r_copy[0])


@pytest.mark.parametrize("bad", [0, -1, 10**6 + 1, 1.5, True])
def test_topk_ppm_out_of_range(bad):
    with pytest.raises(ValueError):
        encode([torch.ones(3)], Codec.TOPK, topk_ppm=bad)


def test_encode_rejects_bad_input():
    with pytest.raises(ValueError):
        encode([torch.ones(3, dtype=torch.float64)], Codec.INT8)
    with pytest.raises(ValueError):
        encode([torch.ones(3)], Codec.TOPK, [torch.ones(4)], topk_ppm=10)
    with pytest.raises(ValueError):
        encode([torch.ones(3)], "gzip")


def _good(codec):
    d = [torch.tensor([[1.0, -2.0], [0.5, 0.0]]), torch.tensor([3.0, 1.0, -1.0])]
    return encode(d, codec, topk_ppm=500_000)[0], [(2, 2), (3,)]


MALFORMED = [
    (Codec.NONE, lambda p: p[:1], "count"),
    (Codec.NONE, lambda p: [p[0].double(), p[1]], "dtype"),
    (Codec.NONE, lambda p: [p[0].reshape(4), p[1]], "shape"),
    (Codec.INT8, lambda p: p + [torch.zeros(1)], "count"),
    (Codec.INT8, lambda p: [p[0].to(torch.int32), *p[1:]], "codes dtype"),
    (Codec.INT8, lambda p: [p[0], torch.ones(2), *p[2:]], "scale shape"),
    (Codec.INT8, lambda p: [torch.full((2, 2), -128, dtype=torch.int8), *p[1:]], "code -128"),
    (Codec.INT8, lambda p: [p[0], -p[1], *p[2:]], "negative scale"),
    (Codec.TOPK, lambda p: [p[0].to(torch.int64), *p[1:]], "idx dtype"),
    (Codec.TOPK, lambda p: [torch.tensor([0, 4], dtype=torch.int32), *p[1:]], "idx out of range"),
    (Codec.TOPK, lambda p: [torch.tensor([-1, 0], dtype=torch.int32), *p[1:]], "negative idx"),
    (Codec.TOPK, lambda p: [torch.tensor([1, 1], dtype=torch.int32), *p[1:]], "duplicate idx"),
    (Codec.TOPK, lambda p: [torch.tensor([1, 0], dtype=torch.int32), *p[1:]], "descending idx"),
    (Codec.TOPK, lambda p: [p[0], p[1][:1], *p[2:]], "length mismatch"),
    (Codec.TOPK, lambda p: [p[0].reshape(1, 2), p[1].reshape(1, 2), *p[2:]], "2-D idx"),
    (Codec.TOPK, lambda p: [torch.arange(5, dtype=torch.int32), torch.zeros(5), *p[2:]], "more than n"),
    (Codec.TOPK_INT4, lambda p: p[:-1], "int4 count"),
    (Codec.TOPK_INT4, lambda p: [p[0].to(torch.int64), *p[1:]], "int4 idx dtype"),
    (Codec.TOPK_INT4, lambda p: [torch.tensor([1, 0], dtype=torch.int32), *p[1:]], "int4 descending idx"),
    (Codec.TOPK_INT4, lambda p: [torch.tensor([0, 4], dtype=torch.int32), *p[1:]], "int4 idx out of range"),
    (Codec.TOPK_INT4, lambda p: [torch.tensor([0], dtype=torch.int32), *p[1:]], "int4 fewer idx than codes"),
    (Codec.TOPK_INT4, lambda p: [p[0], p[1].to(torch.int8), *p[2:]], "int4 codes dtype"),
    (Codec.TOPK_INT4, lambda p: [p[0], torch.cat([p[1], p[1]]), *p[2:]], "int4 codes length"),
    (Codec.TOPK_INT4, lambda p: [p[0], p[1] & 0xF0, *p[2:]], "int4 nibble 0"),
    (Codec.TOPK_INT4, lambda p: [p[0], p[1], -p[2], *p[3:]], "int4 negative scale"),
    (Codec.TOPK_INT4, lambda p: [p[0], p[1], torch.ones(2), *p[3:]], "int4 scale shape"),
    (Codec.TOPK_INT4, lambda p: [p[0], p[1], p[2].double(), *p[3:]], "int4 scale dtype"),
    (Codec.TOPK_INT4, lambda p: [p[1], p[0], *p[2:]], "int4 tensors swapped"),
]


@pytest.mark.parametrize("codec,mutate,what", MALFORMED, ids=[m[2] for m in MALFORMED])
def test_decode_refuses_malformed(codec, mutate, what):
    payload, shapes = _good(codec)
    decode(payload, codec, shapes)  # the unmutated payload is fine
    with pytest.raises(ValueError):
        decode(mutate(list(payload)), codec, shapes)


def test_decode_topk_count_checked_against_the_run():
    payload, shapes = _good(Codec.TOPK)
    decode(payload, Codec.TOPK, shapes, topk_ppm=500_000)
    with pytest.raises(ValueError):
        decode(payload, Codec.TOPK, shapes, topk_ppm=250_000)
    with pytest.raises(ValueError):
        decode(payload, Codec.TOPK, [(2, 2), "3"])


# ------------------------------------------------------------------ topk-int4

def test_topk_int4_packs_two_codes_per_byte_with_exact_codes():
    d = torch.tensor([0.0, 7.0, -3.5, 0.25, -7.0, 1.0, 0.5])
    payload, res = encode([d], Codec.TOPK_INT4, topk_ppm=500_000)  # k = 4: |7|, |-7|, |-3.5|, |1.0|
    idx, codes, scale = payload
    assert idx.dtype == torch.int32 and idx.tolist() == [1, 2, 4, 5]
    assert scale.dtype == torch.float32 and scale.tolist() == [1.0]  # absmax 7 / 7
    # q = [7, -4 (-3.5 rounds half to even), -7, 1] -> nibbles q + 8 = [15, 4, 1, 9], low nibble first
    assert codes.dtype == torch.uint8 and codes.tolist() == [15 | 4 << 4, 1 | 9 << 4]
    (back,) = decode(payload, Codec.TOPK_INT4, [(7,)], topk_ppm=500_000)
    assert back.tolist() == [0.0, 7.0, -4.0, 0.0, -7.0, 1.0, 0.0]
    # the rounding error is fed back as well as what was not sent: residual = e − decoded
    assert res[0].tolist() == [0.0, 0.0, 0.5, 0.25, 0.0, 0.0, 0.5]
    assert payload_bytes(payload) == 4 * 4 + 2 + 4


def test_topk_int4_odd_count_pads_with_nibble_zero_and_refuses_other_padding():
    d = torch.tensor([1.0, -2.0, 3.0, 0.0, 0.0])
    payload, _ = encode([d], Codec.TOPK_INT4, topk_ppm=600_000)  # k = 3
    idx, codes, scale = payload
    assert idx.tolist() == [0, 1, 2] and codes.shape == (2,) and int(codes[1]) >> 4 == 0
    decode(payload, Codec.TOPK_INT4, [(5,)], topk_ppm=600_000)
    with pytest.raises(ValueError, match="padding"):
        decode([idx, codes | torch.tensor([0, 0x80], dtype=torch.uint8), scale], Codec.TOPK_INT4, [(5,)])


def test_topk_int4_keeps_topks_indices_and_rounds_within_half_a_step():
    d = [_randn(64, 32, seed=5), _randn(100, seed=6, scale=1e-4)]
    r = [_randn(64, 32, seed=7, scale=0.1), torch.zeros(100)]
    p4, res4 = encode(d, Codec.TOPK_INT4, r, topk_ppm=30_000)
    p32, _ = encode(d, Codec.TOPK, r, topk_ppm=30_000)
    shapes = [(64, 32), (100,)]
    back = decode(p4, Codec.TOPK_INT4, shapes, topk_ppm=30_000)
    for i in range(2):
        assert torch.equal(p4[3 * i], p32[2 * i])  # the same entries are chosen
        val, s = p32[2 * i + 1], float(p4[3 * i + 2][0])
        assert s == np.float32(val.abs().max()) / np.float32(7)
        got = back[i].reshape(-1)[p4[3 * i].long()]
        assert float((got.double() - val.double()).abs().max()) <= s * (0.5 + 2 * 7.5 * EPS32)
        # unsent entries decode to 0 and stay whole in the residual
        e = (d[i] + r[i]).reshape(-1)
        unsent = torch.ones(e.numel(), dtype=torch.bool)
        unsent[p4[3 * i].long()] = False
        assert torch.all(back[i].reshape(-1)[unsent] == 0) and torch.equal(res4[i].reshape(-1)[unsent], e[unsent])


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(1, 200),
              elements=st.floats(min_value=-(2.0 ** 60), max_value=2.0 ** 60, allow_nan=False, width=32)),
       st.integers(1, 10**6))
def test_topk_int4_decoded_plus_residual_is_e_exactly(a, ppm):
    """Sterbenz: at a sent index e − q·s is exact when s is a normal float32, so nothing is lost to rounding."""
    e = torch.from_numpy(a.copy())
    payload, (res,) = encode([e], Codec.TOPK_INT4, topk_ppm=ppm)
    (back,) = decode(payload, Codec.TOPK_INT4, [tuple(e.shape)], topk_ppm=ppm)
    if float(payload[2][0]) >= 2.0 ** -126 or float(payload[2][0]) == 0:
        assert torch.equal(back.double() + res.double(), e.double())


def test_topk_int4_error_feedback_loses_nothing():
    quant_err = [0.0]

    def each_round(delta, e, payload, sent, residual):
        for i in range(len(FEEDBACK_SHAPES)):
            # each round: decoded + new residual == e exactly (the selection and the rounding are both kept)
            assert torch.equal(sent[i].double() + residual[i].double(), e[i].double())
            kept = sent[i] != 0
            err = float((e[i][kept] - sent[i][kept]).abs().max()) if kept.any() else 0.0
            quant_err[0] = max(quant_err[0], err)

    _feedback_rounds(Codec.TOPK_INT4, each_round)
    assert quant_err[0] > 0  # the values really were rounded (and that error went into the residual)


def test_topk_int4_sends_all_entries_quantized_when_k_is_n():
    d = [_randn(50, seed=9)]
    payload, (res,) = encode(d, Codec.TOPK_INT4, topk_ppm=10**6)
    (back,) = decode(payload, Codec.TOPK_INT4, [(50,)], topk_ppm=10**6)
    assert payload[0].tolist() == list(range(50))
    assert float(res.abs().max()) > 0 and torch.equal(back + res, d[0])  # the residual is the rounding error


def test_topk_int4_zero_and_non_finite():
    payload, (res,) = encode([torch.zeros(6)], Codec.TOPK_INT4, topk_ppm=500_000)
    assert float(payload[2][0]) == 0 and payload[1].tolist() == [8 | 8 << 4, 8]
    assert torch.equal(decode(payload, Codec.TOPK_INT4, [(6,)])[0], torch.zeros(6)) and torch.equal(res, torch.zeros(6))
    d = torch.tensor([1.0, float("nan"), 2.0, 0.0])
    payload, _ = encode([d], Codec.TOPK_INT4, topk_ppm=500_000)
    (back,) = decode(payload, Codec.TOPK_INT4, [(4,)])
    assert not bool(torch.isfinite(back).all())  # stays detectable: the outer step drops it as "non-finite"


def test_topk_int4_bytes_per_parameter():
    """A LoRA-shaped Δ (SmolLM2-135M, r = 8 on q_proj and v_proj: 30 layers × 4 tensors) at 1 % kept: 4 bytes
    per index + half a byte per value + a 4-byte scale per tensor; 0.56 of topk's bytes, 0.045 of int8's."""
    shapes = [s for _ in range(30) for s in ((8, 576), (576, 8), (8, 576), (192, 8))]
    n = sum(int(np.prod(s)) for s in shapes)
    d = [_randn(*s, seed=i) for i, s in enumerate(shapes)]
    sizes = {c: payload_bytes(encode(d, c, topk_ppm=10_000)[0]) for c in Codec}
    ks = [topk_k(int(np.prod(s)), 10_000) for s in shapes]
    assert sizes[Codec.TOPK_INT4] == sum(4 * k + (k + 1) // 2 + 4 for k in ks)
    assert sizes[Codec.TOPK] == sum(8 * k for k in ks)
    per_param = sizes[Codec.TOPK_INT4] / n
    assert 0.045 <= per_param <= 0.05, per_param
    assert sizes[Codec.TOPK_INT4] / sizes[Codec.TOPK] < 0.6 and sizes[Codec.TOPK_INT4] / sizes[Codec.INT8] < 0.05


def test_topk_int4_payload_travels_on_the_wire():
    payload, _ = encode([_randn(5, 7)], Codec.TOPK_INT4, topk_ppm=300_000)
    back = [tensor_from_wire(tensor_to_wire(t)) for t in payload]
    assert [t.dtype for t in back] == [torch.int32, torch.uint8, torch.float32]
    assert commitments_root(back) == commitments_root(payload)


# ------------------------------------------------------------------ pinned encodings

def _golden_delta():
    """Exact float32 inputs (integers / 4096), no RNG or libm: the same bits on any machine."""
    out = []
    for n, shape in ((12, (3, 4)), (101, (101,)), (64, (8, 8))):
        i = torch.arange(n, dtype=torch.int64)
        out.append((((i * 7919 + n) % 1013 - 506).to(torch.float32) / 4096).reshape(shape))
    return out


# (payload root, residual root) of _golden_delta() with a 1/1024 residual at topk_ppm 100_000. none, int8 and
# topk are the hashes of the encodings before topk-int4 was added (commit a447d6b): a new codec changes no old one's
GOLDEN = {
    Codec.NONE: ("ca3131821f4899dfd92b5e6c90d4993f4f3bd125738f47a1ee17b90f342841df",
                 "72ed39c59d9a84f0d732bd9ffd47e60de9a1a081eb196ec21466dfdf8def01ac"),
    Codec.INT8: ("f0c235c110491f841079718a202a15eb064b37f55a01ea2a2e3e70bda19cff93",
                 "72ed39c59d9a84f0d732bd9ffd47e60de9a1a081eb196ec21466dfdf8def01ac"),
    Codec.TOPK: ("659f9e97c0c2eb73f8d9121870004e9356f5e3f12c2a0d36d66e04e19872758d",
                 "1900979572a654c9463d185e7bfb3c51ff9f6f8fb3ec4048f39e84a1751fac49"),
    Codec.TOPK_INT4: ("be1bd9308ba3fb2854f15aa6af944a809a9e27091d30101f77995b5f31ab06af",
                      "218a8f92fc93be4caa1c1af99ac9cada2eff8cdaf1e76739f2084fe8828394c4"),
}

_GOLDEN_SCRIPT = """
import sys, torch
from node.encoding import commitments_root
from node.training.codec import Codec, encode
from tests.training.test_codec import _golden_delta
torch.set_num_threads(int(sys.argv[1]))
for c in Codec:
    d = _golden_delta()
    p, r = encode(d, c, [torch.full(t.shape, 1 / 1024) for t in d], topk_ppm=100_000)
    print(c.value, commitments_root(p).hex(), commitments_root(r).hex())
"""


def test_every_codec_matches_its_pinned_hash():
    assert set(GOLDEN) == set(Codec) and set(PER_TENSOR) == set(Codec)
    for c, (want_p, want_r) in GOLDEN.items():
        d = _golden_delta()
        p, r = encode(d, c, [torch.full(t.shape, 1 / 1024) for t in d], topk_ppm=100_000)
        assert (commitments_root(p).hex(), commitments_root(r).hex()) == (want_p, want_r), c


def test_another_process_with_other_threads_encodes_bit_identically():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _GOLDEN_SCRIPT, "3"], cwd=root, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split("\n")
    got = {Codec(line.split()[0]): tuple(line.split()[1:]) for line in out if line.strip()}
    assert got == GOLDEN
