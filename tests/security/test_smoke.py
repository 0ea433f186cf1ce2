"""The hostile-peer suite's smoke test: a nested-map bomb on the hello before the handshake, then an idle-socket
flood, against a real target node while an honest client on another /24 generates; each followed by check 5
(fresh peers connect, ping and say hello), and each must show it happened (its attacker's measured effect,
:func:`tests.security.devnet.attack_shortfalls`). Then the honest client's speed under the idle flood beside
without it, as ``bench/attack.py`` measures it."""

from __future__ import annotations

import pytest

from bench.attack import measure
from tests.security.devnet import ATTACKER_SRC, attack_shortfalls

SPEED_RATIO = 0.5  # honest tokens/s under the attack / in the baseline windows beside it, at least (2 loaded cores)


# ~90 s with its devnet: the default suite must stay under 15 min; the slow step runs it with the security suite
@pytest.mark.slow
def test_hello_bomb_then_idle_flood(devnet):
    v = devnet.play("bomb", "--phase", "pre", "--protocols", "/tally/hello/1.0.0", "--kinds", "empty_maps",
                    "wide_array", "--size", str(8 << 20), "--streams", "4", seconds=6)
    print(v.summary())
    assert not v.problems(), v.summary()
    v = devnet.play("idle", "--sockets", "300", seconds=6)
    print(v.summary())
    assert not v.problems(), v.summary()


@pytest.mark.slow
@pytest.mark.alone  # a speed ratio: beside two other xdist workers it measured 0.33 (issue 35); CI runs it alone
def test_honest_speed_under_idle_flood(devnet):
    """``bench/attack.py``'s :func:`~bench.attack.measure`, unpinned: two rounds of an 8 s baseline window and an
    8 s idle flood (300 sockets from one address), A B then B A; the honest client's tokens/s in the attack
    windows is at least :data:`SPEED_RATIO` of that in the baseline windows, every honest generation is the
    reference decoding, and each flood shows its effect. A ratio of one run, never an absolute speed: on 2 cores
    shared with other jobs even no attack at all gave 0.62-1.38 (docs/security.md), hence 0.5 and not the
    bench's 0.8."""
    r = measure(devnet, "idle", "idle", ["--sockets", "300"], ATTACKER_SRC, seconds=8.0, rounds=2, others={},
                spin_baseline=False)
    print(f"idle flood: honest tokens/s {r['tokens_s_attack']:.2f} under attack / {r['tokens_s_base']:.2f} "
          f"without = {r['tokens_ratio']:.2f}; attacks {r['attacks']}")
    for attack in r["attacks"]:
        assert not attack_shortfalls("idle", attack), attack_shortfalls("idle", attack)
    assert r["alive"] and not r["bad_gens"], r
    assert r["tokens_s_base"] > 0, f"no honest generation completed in the baseline windows: {r}"
    assert r["tokens_ratio"] >= SPEED_RATIO, (f"honest tokens/s {r['tokens_s_attack']:.2f} under the idle flood, "
                                              f"{r['tokens_s_base']:.2f} without: ratio {r['tokens_ratio']:.2f}")
