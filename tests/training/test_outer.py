"""The deterministic outer step: averaging, Nesterov by hand, drops, median clipping, canonical order, and
bit-identity across processes at torch thread counts 1 and 2."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from node.training.outer import DROP_DTYPE, DROP_NON_FINITE, DROP_SHAPE, OuterSpec, outer_step

ROOT = Path(__file__).resolve().parents[2]


def _w(i: int) -> bytes:
    return bytes([i]) * 32


def _rand(shapes, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) * scale for s in shapes]


def _sha(ts) -> str:
    h = hashlib.sha256()
    for t in ts:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


SHAPES = [(8, 5), (13,), ()]


def test_plain_averaging_is_the_mean():
    theta = _rand(SHAPES, 1)
    deltas = [(_w(k), _rand(SHAPES, 10 + k, 0.01)) for k in range(4)]
    res = outer_step(theta, None, deltas, OuterSpec(lr=1.0, momentum=0.0, clip_mult=100.0))
    for i in range(len(SHAPES)):
        mean = sum(d[i].double() for _, d in deltas) / 4
        assert torch.allclose(res.params[i].double(), theta[i].double() - mean, atol=1e-6, rtol=0)
        assert res.params[i].dtype == torch.float32 and res.params[i].is_contiguous()
        assert res.params[i].shape == theta[i].shape
    assert res.accepted == tuple(_w(k) for k in range(4)) and res.dropped == {}
    assert set(res.scales.values()) == {1.0}


def test_nesterov_exact_on_dyadic_values():
    # every intermediate is a short binary fraction, so float32 is exact and the hand result must match bit for bit
    theta = [torch.tensor([1.0, 2.0])]
    mom = [torch.tensor([1.0, 0.5])]
    deltas = [(_w(2), [torch.tensor([0.25, 0.75])]), (_w(1), [torch.tensor([0.5, -0.25])])]
    spec = OuterSpec(lr=0.5, momentum=0.5, nesterov=True)
    res = outer_step(theta, mom, deltas, spec)
    # g = [0.375, 0.25]; buf = mom·0.5 + g = [0.875, 0.5]; step = g + buf·0.5 = [0.8125, 0.5]; θ − step·0.5
    assert res.momentum[0].tolist() == [0.875, 0.5]
    assert res.params[0].tolist() == [0.59375, 1.75]
    plain = outer_step(theta, mom, deltas, OuterSpec(lr=0.5, momentum=0.5, nesterov=False))
    assert plain.params[0].tolist() == [1.0 - 0.4375, 2.0 - 0.25]  # step = buf
    first = outer_step(theta, None, deltas, spec)  # buf = g
    assert first.momentum[0].tolist() == [0.375, 0.25]
    assert first.params[0].tolist() == [1.0 - (0.375 + 0.1875) * 0.5, 2.0 - (0.25 + 0.125) * 0.5]


def test_nesterov_matches_float64_hand_computation_over_rounds():
    theta = _rand(SHAPES, 2)
    buf = None
    spec = OuterSpec(lr=0.7, momentum=0.9, clip_mult=1e6)
    th64 = [t.double() for t in theta]
    b64 = None
    for r in range(3):
        deltas = [(_w(k), _rand(SHAPES, 100 * r + k, 0.01)) for k in range(3)]
        res = outer_step(theta, buf, deltas, spec)
        g = [sum(d[i].double() for _, d in deltas) / 3 for i in range(len(SHAPES))]
        b64 = g if b64 is None else [b * 0.9 + gi for b, gi in zip(b64, g, strict=True)]
        th64 = [t - 0.7 * (gi + 0.9 * b) for t, gi, b in zip(th64, g, b64, strict=True)]
        theta, buf = res.params, res.momentum
        for t, t64 in zip(theta, th64, strict=True):
            assert torch.allclose(t.double(), t64, atol=1e-5, rtol=0)
    # and it really moved: three rounds of Nesterov with lr 0.7 is far from θ_0
    assert max(float((a.double() - b.double()).abs().max())
               for a, b in zip(theta, _rand(SHAPES, 2), strict=True)) > 0.01


def test_non_finite_and_malformed_deltas_are_dropped():
    theta = _rand(SHAPES, 3)
    good = [(_w(k), _rand(SHAPES, 20 + k, 0.01)) for k in (1, 4)]
    nan = _rand(SHAPES, 30, 0.01)
    nan[0][2, 3] = float("nan")
    inf = _rand(SHAPES, 31, 0.01)
    inf[1][0] = float("-inf")
    bad_shape = _rand([(5, 8), (13,), ()], 32)
    bad_count = _rand(SHAPES[:2], 33)
    bad_dtype = [t.double() for t in _rand(SHAPES, 34)]
    deltas = good + [(_w(2), nan), (_w(3), inf), (_w(5), bad_shape), (_w(6), bad_count), (_w(7), bad_dtype),
                     (_w(8), "junk")]
    spec = OuterSpec(lr=0.7, momentum=0.9)
    res = outer_step(theta, None, deltas, spec)
    assert res.accepted == (_w(1), _w(4))
    assert res.dropped == {_w(2): DROP_NON_FINITE, _w(3): DROP_NON_FINITE, _w(5): DROP_SHAPE,
                           _w(6): DROP_SHAPE, _w(7): DROP_DTYPE, _w(8): DROP_SHAPE}
    alone = outer_step(theta, None, good, spec)
    assert _sha(res.params) == _sha(alone.params) and _sha(res.momentum) == _sha(alone.momentum)
    assert all(torch.isfinite(t).all() for t in res.params)


def test_nothing_kept_changes_nothing():
    theta = _rand(SHAPES, 4)
    bad = _rand(SHAPES, 5)
    bad[0][0, 0] = float("nan")
    res = outer_step(theta, None, [(_w(1), bad)], OuterSpec(lr=0.7, momentum=0.9))
    assert res.momentum is None and res.accepted == () and res.dropped == {_w(1): DROP_NON_FINITE}
    assert _sha(res.params) == _sha(theta)
    mom = _rand(SHAPES, 6)
    res = outer_step(theta, mom, [], OuterSpec(lr=0.7, momentum=0.9))
    assert _sha(res.params) == _sha(theta) and _sha(res.momentum) == _sha(mom)


def test_scaled_delta_is_clipped_to_clip_mult_times_median():
    theta = _rand(SHAPES, 7)
    deltas = [(_w(k), _rand(SHAPES, 40 + k, 0.01)) for k in range(5)]
    big = [t * 100 for t in deltas[2][1]]
    deltas[2] = (_w(2), big)
    spec = OuterSpec(lr=1.0, momentum=0.0, clip_mult=2.0)
    res = outer_step(theta, None, deltas, spec)
    norms = sorted(res.norms.values())
    median = norms[2]
    assert res.norms[_w(2)] == norms[-1] and res.norms[_w(2)] > 50 * median
    s = res.scales[_w(2)]
    assert s == pytest.approx(2.0 * median / res.norms[_w(2)], rel=1e-6)
    assert all(res.scales[_w(k)] == 1.0 for k in (0, 1, 3, 4))  # honest ones of similar size are untouched
    # the clipped delta's norm is 2 × median, and the step is the mean of the clipped deltas
    clipped_norm = math.sqrt(sum(float(((t * np.float32(s)).double() ** 2).sum()) for t in big))
    assert clipped_norm == pytest.approx(2.0 * median, rel=1e-6)
    for i in range(len(SHAPES)):
        mean = (sum(d[i].double() for w, d in deltas if w != _w(2)) + (big[i] * np.float32(s)).double()) / 5
        assert torch.allclose(res.params[i].double(), theta[i].double() - mean, atol=1e-6, rtol=0)
    # without clipping the ×100 delta would have dominated
    loose = outer_step(theta, None, deltas, OuterSpec(lr=1.0, momentum=0.0, clip_mult=1e9))
    assert float((loose.params[0] - theta[0]).abs().max()) > 10 * float((res.params[0] - theta[0]).abs().max())


def test_lower_median_for_even_counts():
    theta = [torch.zeros(1)]
    deltas = [(_w(k), [torch.tensor([float(v)])]) for k, v in enumerate([1.0, 2.0, 3.0, 100.0])]
    res = outer_step(theta, None, deltas, OuterSpec(lr=1.0, momentum=0.0, clip_mult=1.0))
    # lower median = 2: the 3 and 100 are clipped to 2
    assert res.params[0].tolist() == [-(1.0 + 2.0 + 2.0 + 2.0) / 4]


@settings(max_examples=25, deadline=None)
@given(st.permutations(list(range(6))))
def test_canonical_order_is_bit_identical(perm):
    theta = _rand(SHAPES, 8)
    mom = _rand(SHAPES, 9, 0.01)
    deltas = [(_w(k), _rand(SHAPES, 50 + k, 0.01 * (1 + k))) for k in range(6)]
    spec = OuterSpec(lr=0.7, momentum=0.9)
    ref = outer_step(theta, mom, deltas, spec)
    got = outer_step(theta, mom, [deltas[i] for i in perm], spec)
    assert _sha(got.params) == _sha(ref.params) and _sha(got.momentum) == _sha(ref.momentum)
    assert got.accepted == ref.accepted == tuple(sorted(w for w, _ in deltas))


def test_summation_order_matters_so_canonical_order_is_real():
    # float32 addition is not associative: the order really changes bits, which is why it is fixed
    a, b, c = np.float32(1e8), np.float32(-1e8), np.float32(1.0)
    assert (a + b) + c != a + (b + c)


def test_inputs_untouched_and_bad_local_input_raises():
    theta = _rand(SHAPES, 10)
    keep = [t.clone() for t in theta]
    deltas = [(_w(1), _rand(SHAPES, 11))]
    outer_step(theta, None, deltas, OuterSpec(lr=0.7, momentum=0.9))
    assert _sha(theta) == _sha(keep)
    with pytest.raises(ValueError):
        outer_step(theta, None, deltas + deltas, OuterSpec(lr=0.7, momentum=0.9))  # duplicate worker
    with pytest.raises(ValueError):
        outer_step(theta, _rand(SHAPES[:2], 1), deltas, OuterSpec(lr=0.7, momentum=0.9))
    with pytest.raises(ValueError):
        outer_step([t.double() for t in theta], None, deltas, OuterSpec(lr=0.7, momentum=0.9))
    for bad in (dict(lr=0.0, momentum=0.9), dict(lr=float("nan"), momentum=0.9), dict(lr=1.0, momentum=1.0),
                dict(lr=1.0, momentum=0.0, clip_mult=0.0)):
        with pytest.raises(ValueError):
            OuterSpec(**bad)


# ---------------------------------------------------------------- bit-identity across processes and threads

_CHILD = textwrap.dedent("""
    import hashlib, sys
    import torch
    torch.set_num_threads(int(sys.argv[1]))
    from node.training.outer import OuterSpec, outer_step
    g = torch.Generator().manual_seed(1234)
    shapes = [(600, 1000), (400_000,), (17, 3)]
    theta = [torch.randn(*s, generator=g) * 0.02 for s in shapes]
    mom = [torch.randn(*s, generator=g) * 1e-3 for s in shapes]
    deltas = [(bytes([k]) * 32, [torch.randn(*s, generator=g) * 1e-3 * (1 + 40 * (k == 2)) for s in shapes])
              for k in (3, 0, 2, 1)]
    res = outer_step(theta, mom, deltas, OuterSpec(lr=0.7, momentum=0.9, nesterov=True, clip_mult=2.0))
    assert res.scales[bytes([2]) * 32] < 1.0  # the clip path is exercised
    h = hashlib.sha256()
    for t in res.params + res.momentum:
        h.update(t.contiguous().numpy().tobytes())
    print(torch.get_num_threads(), h.hexdigest())
""")


def test_bit_identical_across_processes_and_thread_counts():
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(n)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in (1, 2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.split())
    assert [o[0] for o in outs] == ["1", "2"]
    assert outs[0][1] == outs[1][1]
    assert len(outs[0][1]) == 64


def test_same_bits_as_the_probes_explicit_torch_ops():
    # shared/notes/diloco-probe/common.py:outer_nesterov (torch float32 elementwise ops), which reproduced the
    # probe's DiLoCo run: numpy and torch round every elementwise op the same way, so the bits must agree
    theta = _rand(SHAPES, 12)
    rounds = [[_rand(SHAPES, 200 * r + k, 1e-3) for k in range(4)] for r in range(2)]
    glob, bufs = theta, None
    for deltas in rounds:
        new_g, new_b = [], []
        for i, th in enumerate(glob):
            g = deltas[0][i].clone()
            for k in range(1, 4):
                g = g + deltas[k][i]
            g = g / 4
            b = g.clone() if bufs is None else bufs[i] * 0.9 + g
            new_g.append(th - (g + b * 0.9) * 0.7)
            new_b.append(b)
        glob, bufs = new_g, new_b
    params, mom = theta, None
    for deltas in rounds:
        res = outer_step(params, mom, [(_w(k), d) for k, d in enumerate(deltas)],
                         OuterSpec(lr=0.7, momentum=0.9, clip_mult=1e6))
        params, mom = res.params, res.momentum
    assert _sha(params) == _sha(glob) and _sha(mom) == _sha(bufs)
