"""Issue 23, checks 1 and 5: every attack class of the hostile-peer suite against a real target node (validator and
span server, ``node start`` process), each played by a separate attacker process for ~15 s while an honest client
on another /24 generates. Each asserts (:meth:`tests.security.devnet.Verdict.problems`): the target's process
lives, its API answers and its height advances; its peak RSS grows by less than 64 MiB; every honest generation
that overlapped the attack is the reference greedy decoding, and at least one completed; and after the attack a
fresh identity from the attacker's address and one from another address connect, ping and complete the hello
within :data:`~tests.security.devnet.PROBE_S` seconds (check 5); and that the attack happened: its attacker
reported what it did, measured on its own sockets and streams, and that reaches its class's least effect
(:func:`~tests.security.devnet.attack_shortfalls`; an attacker that crashed, hung or never reached the target
fails the test).

The devnet is started once per module (~1 min on 2 cores) and restarted when an attack killed the target. Each
test prints its verdict (``-s`` shows them). 8-15 minutes in all on 2 loaded cores: ``slow``.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from tests.inference.procs import spawn, wait_info
from tests.security.devnet import MODEL, ROOT

SECONDS = 15.0  # each attack's duration


def check(v) -> None:
    print(v.summary())
    assert not v.problems(), f"{v.problems()}\n{v.summary()}"


@pytest.mark.slow
def test_bombs_before_the_hello(devnet):
    """Nested empty maps, 65,536-element arrays, deep nesting and lying lengths on the protocols read before the
    hello, from identities that never complete it (a fresh one whenever the last is banned)."""
    check(devnet.play("bomb", "--phase", "pre", seconds=SECONDS))


@pytest.mark.slow
def test_bombs_after_the_hello(devnet):
    """Every bomb on every ``/tally/*`` protocol and the libp2p ones, from members (valid hello)."""
    check(devnet.play("bomb", "--phase", "post", "--streams", "2", seconds=SECONDS))


@pytest.mark.slow
def test_idle_sockets_from_one_address(devnet):
    """400 raw TCP connections from one address that never send a byte (py-libp2p's inbound slots are 250)."""
    check(devnet.play("idle", "--sockets", "400", seconds=SECONDS))


@pytest.mark.slow
def test_idle_sockets_from_one_slash24(devnet):
    """400 silent connections spread over 248 addresses of one /24 (per-address limits alone do not help)."""
    check(devnet.play("idle", "--sockets", "400", "--spread", src="127.0.3.2", seconds=SECONDS))


@pytest.mark.slow
def test_identity_flood(devnet):
    """Fresh libp2p identities, each connecting and saying a valid hello, up to 300 held at once."""
    check(devnet.play("identities", "--hold", "300", seconds=SECONDS))


@pytest.mark.slow
def test_readers_that_never_read(devnet):
    """Requests for the 16 MiB head file, a model block, a snapshot chunk, a sync batch and a header batch on
    100 streams, never read."""
    check(devnet.play("noread", "--model-id", devnet.model_id, "--streams", "100", seconds=SECONDS))


@pytest.mark.slow
def test_slow_drips(devnet):
    """One byte per second of a frame on 4 streams of every protocol, and of the multistream handshake on 32 raw
    sockets."""
    check(devnet.play("drip", seconds=SECONDS))


@pytest.mark.slow
def test_relay_abuse_by_non_members(devnet):
    """A non-member reserves a slot on the target; another opens a circuit to it through the target and pushes
    bytes on 4 streams. Beyond the checks of every attack: a non-member's circuit must not carry more than
    circuit relay v2's default 128 KiB."""
    v = devnet.play("relay", seconds=SECONDS)
    check(v)
    assert v.attack.get("received", 0) <= 128 << 10, f"a non-member's circuit carried {v.attack['received']} bytes"


@pytest.mark.slow
def test_crashing_and_lying_state_sync_peers(devnet, tmp_path):
    """Check 1, class 4: a node started with ``--state-sync`` next to a crashing peer (an offer whose commit is
    ``5``), a garbage one (manifest ``5``) and a lying one (a manifest claiming height 10^12 and 16,000 chunks,
    chunks dripped) stays up and state-syncs from the honest target without asking any of them for a chunk (each
    offer is refused on its shape or its certified header first); meanwhile the honest client generates."""
    attackers, lines = [], {}
    for i, mode in enumerate(["crash", "garbage", "lie"]):
        p = subprocess.Popen(devnet.attacker_argv("snapserve", "--mode", mode, src=f"127.0.0.{10 + i}",
                                                  seconds=150), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT)
        attackers.append(p)
        lines[mode] = []
        threading.Thread(target=lambda p=p, m=mode: lines[m].extend(p.stdout), daemon=True).start()
    victim = None
    try:
        deadline = time.monotonic() + 90
        while not all(any(x.startswith("READY") for x in lines[m]) for m in lines):
            assert time.monotonic() < deadline, f"snapshot attackers not ready: {lines}"
            assert all(p.poll() is None for p in attackers), [p.stderr.read()[-800:] for p in attackers]
            time.sleep(0.5)
        addrs = [next(x for x in lines[m] if x.startswith("READY")).split()[1] for m in lines]
        t0 = time.time()
        victim = spawn(tmp_path, 3, devnet.genesis_file, devnet.cache, "--state-sync", "--bootstrap",
                       *addrs, devnet.target_addr, model=MODEL)
        info = wait_info(tmp_path, 3, victim, 120)
        log = tmp_path / "p3" / "stdout.log"
        deadline = time.monotonic() + 120
        while "state synced to height" not in log.read_text(errors="replace"):
            assert victim.poll() is None, f"the state-syncing node exited {victim.returncode}:\n" \
                                          f"{log.read_text(errors='replace')[-3000:]}"
            assert time.monotonic() < deadline, f"no state sync within 120 s:\n" \
                                                f"{log.read_text(errors='replace')[-3000:]}"
            time.sleep(0.5)
        text = log.read_text(errors="replace")
        print("state-sync node:", [x for x in text.splitlines() if "snapshot" in x or "state sync" in x][-8:])
        assert victim.poll() is None and info["api"]
        asked = {m: [x for x in lines[m] if x.startswith("CHUNK")] for m in lines}
        assert not any(asked.values()), f"chunks asked of a bad offer (checked only after fetching): {asked}"
        t1 = time.time()
        assert devnet.alive() and devnet.status() is not None
        gens = devnet.honest.between(t0, t1)
        assert gens and all(g.get("tokens") == devnet.want for g in gens), gens
    finally:
        for p in attackers + ([victim] if victim is not None else []):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)

