"""Issue 25, check 1 (and 3 for these runs): the issue's topology with real ``node start`` processes.

A is public (validator, bootstrap peer, relay); B and C serve the tiny model's two halves and D is the client, each
behind a NAT of its own whose router silently drops unsolicited inbound TCP (a home router). Every node listens on
``0.0.0.0`` as the README says. With port-preserving NATs the route's connections end up direct (DCUtR's hole
punch); with ``masquerade random`` (a new random port per connection) they stay relayed through A and keep working.
Tokens equal one-process greedy decoding in both; a relayed client's streams really cross A (D's connection to
B is a circuit through A, and A counted member circuits). No node logs an ERROR line.
"""

from __future__ import annotations

import time

import pytest

from node.compute.model import make_tiny
from node.compute.reference import local_generate

from .tally import TallyNet, TallyNode, create_key

pytestmark = [pytest.mark.netns, pytest.mark.slow]  # five node processes on namespaces: minutes

PROMPT_IDS = [1, 17, 42, 99, 7, 3]
SPANS = {"b": "0:3", "c": "3:6"}


@pytest.fixture
def model_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    make_tiny(cache, seed=0)
    return cache


def _add_nat(tn: TallyNet, name: str, random_ports: bool) -> TallyNode:
    host = tn.net.add_nat_host(name, stealth=True, random_ports=random_ports)
    d = tn.tmp / name
    node = tn.nodes[name] = TallyNode(name, host, d, create_key(d))
    return node


class WildcardNet(TallyNet):
    """:class:`TallyNet` whose nodes listen on ``0.0.0.0``, as the README's nodes do."""

    def start(self, name: str, *extra: str, genesis=None) -> TallyNode:
        node = self.nodes[name]
        real = node.host.ip
        node.host.ip = "0.0.0.0"  # TallyNet.start passes --listen /ip4/<host.ip>/tcp/4001
        try:
            return super().start(name, *extra, genesis=genesis)
        finally:
            node.host.ip = real


def _peer_rows(tn: TallyNet, name: str) -> dict[str, dict]:
    net = tn.api(name, "GET", "/v1/status")["network"]
    return {r["peer"]: r for r in net["peers"]}


def _generate(tn: TallyNet):
    try:
        return tn.api("d", "POST", "/v1/generate", {"prompt_ids": PROMPT_IDS, "max_new_tokens": 16})
    except AssertionError as e:
        if "no_route" in str(e):
            return None
        raise


def _errors(tn: TallyNet) -> dict[str, list[str]]:
    out = {}
    for name, node in tn.nodes.items():
        lines = node.log.read_text(errors="replace").splitlines() if node.log and node.log.exists() else []
        bad = [ln for ln in lines if " ERROR " in ln or ln.startswith("Traceback")]
        if bad:
            out[name] = bad[:10]
    return out


@pytest.mark.parametrize("random_ports", [False, True], ids=["port-preserving", "masquerade-random"])
def test_three_nats_direct_by_hole_punching_or_relayed_and_identical_tokens(netns, tmp_path, model_cache,
                                                                            random_ports):
    tn = WildcardNet(netns, tmp_path, model_cache)
    tn.add("a")
    for name in ("b", "c", "d"):
        _add_nat(tn, name, random_ports)
    tn.genesis = tn.make_genesis(["a"], ["b", "c"], ["d"], bootstrap=["a"])
    ids = {n: tn.nodes[n].peer_id for n in tn.nodes}

    tn.start("a")
    tn.wait_up("a")
    for name, span in SPANS.items():
        tn.start(name, "--span", span)
    tn.start("d")
    for name in ("b", "c", "d"):
        tn.wait_up(name)

    def covered():
        sw = tn.api("d", "GET", "/v1/swarm")
        return sw if sw["covered"] == sw["num_blocks"] and len(sw["servers"]) == 2 else None

    tn.wait(covered, 120, why="D to see both spans")
    want = local_generate(make_tiny(model_cache, seed=0), PROMPT_IDS, 16)
    gen = tn.wait(lambda: _generate(tn), 120, every=2.0, why="a generation through B then C")
    assert gen["tokens"] == want
    assert [h["peer"] for h in gen["route"]] == [ids["b"], ids["c"]]

    if not random_ports:
        # DCUtR: D's connections to B and C become direct, from their routers' addresses
        def direct():
            rows = _peer_rows(tn, "d")
            ok = all(rows.get(ids[n], {}).get("path") == "direct" for n in ("b", "c"))
            return rows if ok else None

        rows = tn.wait(direct, 120, every=2.0, why="D's connections to B and C to become direct")
        for n in ("b", "c"):
            assert rows[ids[n]]["addr"].startswith(f"/ip4/{tn.nodes[n].host.public_ip}/tcp/"), rows[ids[n]]
    else:
        time.sleep(20)  # DCUtR has had its chances (it tries every 2 s, 3 attempts per peer)
        rows = _peer_rows(tn, "d")
        for n in ("b", "c"):
            row = rows[ids[n]]
            assert row["path"] == "relayed" and row["relay"] == ids["a"], row
            assert "/p2p-circuit" in row["addr"], row
        # the relay carried member circuits for them
        assert tn.api("a", "GET", "/v1/status")["network"]["circuits"]["member"] >= 2

    gen2 = tn.wait(lambda: _generate(tn), 120, every=2.0, why="a second generation")
    assert gen2["tokens"] == want
    hops = {h["peer"]: h for h in gen2["route"]}  # the route says how each server was reached
    for n in ("b", "c"):
        assert hops[ids[n]]["path"] == ("relayed" if random_ports else "direct"), gen2["route"]
    def measured():  # a path that changed (relayed -> direct) has no round trip until its next ping
        rows = _peer_rows(tn, "d")
        return rows if all(rows.get(ids[n], {}).get("rtt_ms") is not None for n in ("b", "c")) else None

    rows = tn.wait(measured, 60, every=2.0, why="round trips to B and C measured")
    assert all(rows[ids[n]]["rtt_ms"] > 0 for n in ("b", "c")), rows
    assert not _errors(tn), _errors(tn)
