""":meth:`tests.security.devnet.Verdict.problems` fails an attack that did not happen (issue 35): an attacker that
crashed or hung (``{"error": ...}``), no report or one of another class, a report that lacks a count, and an
attack whose measured effect is below its class's least (:data:`tests.security.devnet.EFFECTS`); a real attack's
report (counts as measured in the hostile-peer suite on 2 loaded cores, trimmed) passes. No process: default
suite."""

from __future__ import annotations

import copy

import pytest

from tests.security.devnet import EFFECTS, Verdict

WANT = [1, 2, 3]
TALLY = ["/tally/hello/1.0.0", "/tally/dialback/1.0.0", "/tally/sync/1.0.0"]

REAL = {  # one measured report per attack class (tests/security/attacker.py), trimmed
    "bomb": {"protocols": [*TALLY, "/meshsub/1.1.0"], "identities": 27, "connected": 27, "connect_failed": 0,
             "written": 163, "streams": 304, "refused": 424, "cut": 255, "replies": 49, "bytes": 39062055,
             "per_protocol": {"/tally/hello/1.0.0": {"streams": 200, "bytes": 10749514, "refused": 216, "cut": 151},
                              "/tally/dialback/1.0.0": {"streams": 100, "bytes": 28312541, "refused": 200, "cut": 100},
                              "/tally/sync/1.0.0": {"streams": 2, "bytes": 10, "refused": 4, "cut": 2},
                              "/meshsub/1.1.0": {"streams": 0, "bytes": 0, "refused": 4, "cut": 0}}},
    "idle": {"sockets": 400, "sources": 1, "connects": 189, "failed": 2634, "closed_by_target": 189, "open_now": 0,
             "open_peak": 91, "held_s": 192.4, "sources_connected": 1, "held_mean": 12.8},
    "identities": {"identities": 97, "connected": 32, "hello_ok": 32, "failed": 65, "dropped": 32, "held_peak": 32,
                   "held_at_end": 32},
    "noread": {"asked": 100, "streams": 100, "requests": 100, "refused": 0, "kinds_asked": ["head", "block", "chunk",
               "sync", "light"], "kinds": ["block", "chunk", "head", "light", "sync"],
               "per_kind": {"head": 20, "block": 20, "chunk": 20, "sync": 20, "light": 20}, "held_at_end": 100},
    "drip": {"stream_bytes": 171, "streams": 40, "socket_bytes": 96, "sockets": 32, "cut": 72},
    "relay": {"reserved": True, "circuit": True, "streams": 4, "pushed": 131072, "received": 65524, "cut": 4,
              "cut_by": "StreamError: Write operation failed: "},
}
ASKED = {"idle": {"sockets", "sources"}, "noread": {"asked"}}  # what the attack was asked to do, not what it did


def verdict(cls: str, attack: dict) -> Verdict:
    """A verdict whose every other check passes: only ``attack`` can make a problem."""
    return Verdict(cls, attack, alive=True, api_ok=True, heights=(10, 40), rss_before=100 << 20,
                   rss_peak=110 << 20, gens=[{"tokens": WANT}], want=WANT, probes={"after": {"ok": True}})


def report(cls: str, **changes) -> dict:
    return {**copy.deepcopy(REAL[cls]), "class": cls, "elapsed_s": 15.1, "t0": 1.0, "t1": 16.1, **changes}


def zeroed(cls: str, x):
    """``x`` with every count and flag the attack measured set to zero (what an attacker that cannot connect
    reports), what it was asked left as it was."""
    if isinstance(x, dict):
        return {k: v if k in ASKED.get(cls, ()) or k == "class" else zeroed(cls, v) for k, v in x.items()}
    if isinstance(x, bool):
        return False
    return 0 if isinstance(x, (int, float)) else x


def test_every_class_has_a_least_effect():
    assert set(REAL) == set(EFFECTS)


@pytest.mark.parametrize("cls", sorted(REAL))
def test_a_real_attack_passes(cls):
    assert verdict(cls, report(cls)).problems() == []


@pytest.mark.parametrize("cls", sorted(REAL))
def test_a_crashed_or_hung_attacker_fails(cls):
    for attack in ({"class": cls, "error": "exit 0: "}, {"class": cls, "error": "attacker hung past its deadline"},
                   report(cls, error="ConnectionError: attacker: could not connect to the target")):
        problems = verdict(cls, attack).problems()
        assert any(f"the {cls} attacker failed" in p for p in problems), (attack, problems)


@pytest.mark.parametrize("cls", sorted(REAL))
def test_a_missing_or_foreign_report_fails(cls):
    other = "drip" if cls != "drip" else "relay"
    for attack in ({}, {"class": cls}, report(other), {k: v for k, v in report(cls).items() if k != "class"}):
        problems = verdict(cls, attack).problems()
        assert problems and "did too little" not in problems[0], (attack, problems)
    bare = {"class": cls, "elapsed_s": 0.1}
    assert any("lacks" in p for p in verdict(cls, bare).problems())


@pytest.mark.parametrize("cls", sorted(REAL))
def test_an_attack_without_effect_fails(cls):
    problems = verdict(cls, zeroed(cls, report(cls))).problems()
    assert problems and all(f"the {cls} attack did too little" in p for p in problems), problems


@pytest.mark.parametrize(("cls", "change", "what"), [
    ("bomb", {"per_protocol": {**REAL["bomb"]["per_protocol"],
                               "/tally/dialback/1.0.0": {"streams": 0, "bytes": 0, "refused": 0, "cut": 0}}},
     "bytes written on /tally/dialback/1.0.0"),  # a protocol the attack names and never reached
    ("bomb", {"per_protocol": {**REAL["bomb"]["per_protocol"],
                               "/meshsub/1.1.0": {"streams": 0, "bytes": 0, "refused": 0, "cut": 0}}},
     "streams tried on /meshsub/1.1.0"),
    ("idle", {"open_peak": 7}, "sockets held open at once"),  # half of the 16 one address may have pending
    ("idle", {"connects": 100, "failed": 299}, "connection attempts"),  # fewer than the 400 sockets asked for
    ("idle", {"sources": 248, "sources_connected": 100}, "source addresses that connected"),
    ("identities", {"hello_ok": 4, "held_peak": 4}, "identities that completed the hello"),
    ("noread", {"per_kind": {"head": 30, "block": 30, "sync": 20, "light": 20}}, "chunk requests held unread"),
    ("noread", {"requests": 24}, "requests held unread"),
    ("drip", {"socket_bytes": 0, "sockets": 0}, "sockets dripped on"),
    ("relay", {"circuit": False, "streams": 0, "pushed": 0}, "circuit opened"),
    ("relay", {"pushed": 0, "cut": 0}, "bytes pushed through the circuit, or pushes the relay cut"),
])
def test_each_least_effect(cls, change, what):
    problems = verdict(cls, report(cls, **change)).problems()
    assert any(what in p for p in problems), problems


def test_the_other_checks_still_count():
    v = verdict("idle", report("idle"))
    v.alive = False
    assert v.problems() == ["the target process died"]
