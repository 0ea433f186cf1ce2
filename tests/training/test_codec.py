"""Pseudo-gradient codecs: int8 error bound and zeros, top-k error feedback, strict decode of peer payloads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from node.encoding import commitments_root, tensor_from_wire, tensor_to_wire
from node.training.codec import Codec, decode, encode, payload_bytes, topk_k

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


def test_topk_error_feedback_loses_nothing():
    shapes = [(64, 32), (100,), (3, 5, 7)]
    rounds = 12
    residual = None
    sum_delta = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    sum_sent = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    sum_abs = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    for r in range(rounds):
        delta = [_randn(*s, seed=100 * r + i, scale=1e-3) for i, s in enumerate(shapes)]
        payload, residual = encode(delta, Codec.TOPK, residual, topk_ppm=20_000)
        assert payload_bytes(payload) == sum(8 * topk_k(int(np.prod(s)), 20_000) for s in shapes)
        sent = decode(payload, Codec.TOPK, shapes, topk_ppm=20_000)
        for i in range(len(shapes)):
            sum_delta[i] += delta[i].double()
            sum_sent[i] += sent[i].double()
            sum_abs[i] += delta[i].double().abs()
    for sd, ss, sa, res in zip(sum_delta, sum_sent, sum_abs, residual, strict=True):
        gap = float((ss + res.double() - sd).abs().max())
        # Only e = Δ + r rounds (r' = e − decoded is exact: 0 where sent, e elsewhere), by ≤ |e|·2^-24 per
        # round, and |e| ≤ Σ|Δ| up to that rounding.
        assert gap <= rounds * float(sa.max()) * EPS32 * 1.01
        assert float(res.abs().max()) > 1e-4  # something really was held back (not a trivial identity)


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
