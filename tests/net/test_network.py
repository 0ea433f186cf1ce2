"""Tally across hosts (issue 11): real ``node start`` processes in network namespaces joined by a bridge, one
server behind a NAT reached through a relay, a genesis made with ``node genesis new``; nodes of another genesis
refused. The namespaces are made and removed by the ``netns`` fixture; nothing but their addresses is dialled."""

from __future__ import annotations

import json
import sys
import time

import pytest

from node.compute.model import make_tiny
from node.compute.reference import local_generate

from .tally import ROOT, TallyNet, cli

pytestmark = [pytest.mark.netns, pytest.mark.slow]  # each starts 2-6 node processes: minutes

PROMPT_IDS = [1, 17, 42, 99, 7, 3]
SPANS = {"s1": "0:2", "s2": "2:4", "s3": "4:6"}  # s3 sits behind the NAT


@pytest.fixture
def model_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    make_tiny(cache, seed=0)
    return cache


def _generate(tn: TallyNet):
    try:
        return tn.api("c", "POST", "/v1/generate", {"prompt_ids": PROMPT_IDS, "max_new_tokens": 32})
    except AssertionError as e:
        if "no_route" in str(e):
            return None
        raise


def _receipts_final(tn: TallyNet, ids: list[str]):
    recs = [tn.api("c", "GET", f"/v1/receipts/{r}") for r in ids]
    return recs if all(r["status"] in ("valid", "invalid", "unverified") for r in recs) else None


def test_five_hosts_one_behind_nat_generate_verify_and_settle(netns, tmp_path, model_cache):
    tn = TallyNet(netns, tmp_path, model_cache)
    v = tn.add("v")
    for name in ("s1", "s2"):
        tn.add(name)
    tn.add("s3", nat=True)
    tn.add("c")
    tn.genesis = tn.make_genesis(["v"], ["s1", "s2", "s3"], ["c"], bootstrap=["v"])
    shown = json.loads(cli("genesis", "show", str(tn.genesis), "--json"))
    assert shown["genesis"]["bootstrap"] == [v.addr]

    tn.start("v")
    tn.wait_up("v")
    for name, span in SPANS.items():
        tn.start(name, "--span", span)
    tn.start("c")
    for name in ("s1", "s2", "s3", "c"):
        tn.wait_up(name)

    # the NAT'd server learns it is not reachable and announces a circuit address through a relay
    def s3_relayed():
        addrs = tn.nodes["s3"].info()["addrs"]
        return [a for a in addrs if "/p2p-circuit/" in a]

    tn.wait(s3_relayed, 60, why="s3 to announce a /p2p-circuit address")
    assert not any("/ip4/127." in a or "/ip4/0.0.0.0" in a for a in tn.nodes["s3"].info()["addrs"])

    # the client, which knows only the bootstrap validator, finds every span
    def covered():
        sw = tn.api("c", "GET", "/v1/swarm")
        return sw if sw["covered"] == sw["num_blocks"] and len(sw["servers"]) == 3 else None

    sw = tn.wait(covered, 60, why="the client to see all three spans")
    for srv in sw["servers"]:  # span records carry only addresses reachable from other hosts
        assert srv["addrs"] and not any("/ip4/127." in a or "/0.0.0.0/" in a for a in srv["addrs"]), srv

    # s3 announces its circuit address as soon as it has one (SpanServer.announce_loop); the client may have
    # heard an announcement of s3 made just before the reservation: the next one arrives within seconds
    def s3_record_relayed():
        sw = tn.api("c", "GET", "/v1/swarm")
        rec = next((s for s in sw["servers"] if s["peer"] == tn.nodes["s3"].peer_id), None)
        return rec if rec and any("/p2p-circuit/" in a for a in rec["addrs"]) else None

    tn.wait(s3_record_relayed, 20, why="the client to hear s3's circuit address")

    # on 2 loaded cores an announcement may lapse between the check above and the request: a user would retry
    gen = tn.wait(lambda: _generate(tn), 60, every=2.0, why="a generation through the route")
    assert gen["tokens"] == local_generate(make_tiny(model_cache, seed=0), PROMPT_IDS, 32)
    assert [h["peer"] for h in gen["route"]] == [tn.nodes[n].peer_id for n in ("s1", "s2", "s3")]

    recs = tn.wait(lambda: _receipts_final(tn, gen["receipts"]), 180, every=1.0, why="every receipt's verdict")
    assert {r["worker"] for r in recs} == {tn.nodes[n].peer_id for n in ("s1", "s2", "s3")}
    for r in recs:
        assert r["status"] == "valid", r
        assert len(r["votes"]) >= 2 and all(x["verdict"] == "valid" for x in r["votes"]), r


def test_a_node_of_another_genesis_is_refused_with_both_hashes(netns, tmp_path, model_cache):
    tn = TallyNet(netns, tmp_path, model_cache)
    tn.add("v")
    tn.add("x")
    tn.genesis = tn.make_genesis(["v"], [], [], bootstrap=["v"])
    other = tn.make_genesis(["x"], [], [], bootstrap=["v"], chain_id="tally-test-other",
                            path=tmp_path / "other.json")
    tn.start("v")
    iv = tn.wait_up("v")
    tn.start("x", genesis=other)
    ix = tn.wait_up("x")
    assert iv["genesis"] != ix["genesis"]

    def refused():
        log = tn.nodes["v"].log.read_text(errors="replace")
        return [line for line in log.splitlines() if "refusing peer" in line and ix["genesis"] in line
                and iv["genesis"] in line]

    lines = tn.wait(refused, 60, why="the validator to log the refusal with both genesis hashes")
    assert tn.nodes["x"].peer_id in lines[0]
    h0 = tn.api("v", "GET", "/v1/status")["height"]
    tn.wait(lambda: tn.api("v", "GET", "/v1/status")["height"] > h0 + 2, 30, why="v to keep making blocks")
    tn.wait(lambda: tn.api("x", "GET", "/v1/status")["height"] > 2, 30, why="x to make blocks of its own")
    # x's blocks never reach v: every block v holds was proposed by v's validator, and x is not v's peer
    blocks = tn.api("v", "GET", "/v1/blocks?limit=200")
    rows = blocks["blocks"] if isinstance(blocks, dict) else blocks
    assert rows and {b["proposer"] for b in rows} == {tn.nodes["v"].peer_id}
    # x stays banned (10 minutes: node.net.hello.REFUSE_S) however long the test runs: a connection either
    # side opens is closed at once, so x is out of v's peers on every look
    for _ in range(5):
        assert tn.nodes["x"].peer_id not in tn.api("v", "GET", "/v1/status")["peers"]
        time.sleep(0.5)


def _finality(tn: TallyNet, name: str, seconds: float) -> list[int]:
    """Milliseconds from each block's header time until ``name`` stored it, over ``seconds`` of polling."""
    node = tn.nodes[name]
    r = tn.net.run(node.host, [sys.executable, str(ROOT / "tests/net/poll_status.py"), str(node.data_dir),
                               str(seconds)], timeout=seconds + 30)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)["heights"]
    return sorted(first - t for t, first in list(seen.values())[1:])  # the first height was already stored


def _head_hashes(tn: TallyNet, names: list[str], height: int) -> set[str]:
    return {tn.api(n, "GET", f"/v1/blocks/{height}")["hash"] for n in names}


def test_four_validators_finalise_with_one_stopped_and_agree_after_a_cut_link(netns, tmp_path, model_cache):
    tn = TallyNet(netns, tmp_path, model_cache)
    vals = [f"v{i}" for i in range(4)]
    for v in vals:
        tn.add(v)
    tn.genesis = tn.make_genesis(vals, [], [], bootstrap=["v0"])
    for v in vals:
        tn.start(v)
    for v in vals:
        tn.wait_up(v)
    tn.wait(lambda: tn.api("v1", "GET", "/v1/status")["height"] >= 3, 90, why="4 validators to finalise")

    all4 = _finality(tn, "v1", 8)
    tn.stop("v3")
    three = _finality(tn, "v1", 12)
    assert len(three) >= 5, three  # still finalising with 3 of 4
    med = three[len(three) // 2]
    print(f"finality (ms) with 4 validators: median {all4[len(all4) // 2]} of {len(all4)}; "
          f"with one stopped: median {med} of {len(three)}, max {three[-1]}")
    assert med < 1000, three

    tn.start("v3")  # back with its data dir: it catches up by itself
    tn.wait_up("v3")
    h = tn.api("v0", "GET", "/v1/status")["height"]
    tn.wait(lambda: tn.api("v3", "GET", "/v1/status")["height"] >= h, 60, why="the restarted v3 to catch up")

    tn.net.cut(tn.nodes["v2"].host)
    time.sleep(10)
    tn.net.restore(tn.nodes["v2"].host)
    top = tn.api("v0", "GET", "/v1/status")["height"]
    tn.wait(lambda: min(tn.api(v, "GET", "/v1/status")["height"] for v in vals) >= top + 2, 90,
            why="every validator past the height reached during the cut")
    for hh in (h, top, top + 2):
        assert len(_head_hashes(tn, vals, hh)) == 1, f"validators disagree at height {hh}"


def test_one_bootstrap_address_finds_every_span_and_a_restarted_server_is_used_again(netns, tmp_path,
                                                                                        model_cache):
    tn = TallyNet(netns, tmp_path, model_cache)
    for name in ("v", "s1", "s2", "s3", "c"):
        tn.add(name)
    tn.genesis = tn.make_genesis(["v"], ["s1", "s2", "s3"], ["c"], bootstrap=["v"])
    tn.start("v")
    tn.wait_up("v")
    for name, span in SPANS.items():
        tn.start(name, "--span", span)
    for name in SPANS:
        tn.wait_up(name)

    def covered(name="c"):
        sw = tn.api(name, "GET", "/v1/swarm")
        return sw if sw["covered"] == sw["num_blocks"] and len(sw["servers"]) == 3 else None

    tn.start("c")  # its genesis file names only v
    t_up = time.monotonic()
    tn.wait_up("c")
    t_up = time.monotonic() - t_up
    t0 = time.monotonic()
    tn.wait(covered, 60, every=0.25, why="c to find every span")
    found = time.monotonic() - t0
    print(f"c up after {t_up:.1f} s; every span found {found:.1f} s later")
    assert found < 10.0, found

    tn.stop("s2")
    tn.start("s2", "--span", SPANS["s2"])
    t0 = time.monotonic()
    tn.wait_up("s2")
    t_restart = time.monotonic() - t0
    t0 = time.monotonic()
    gen = tn.wait(lambda: _generate(tn), 60, every=0.5, why="a generation through the restarted s2")
    used = time.monotonic() - t0
    print(f"s2 up again after {t_restart:.1f} s; used by the client {used:.1f} s later")
    assert tn.nodes["s2"].peer_id in [h["peer"] for h in gen["route"]]
    assert used < 15.0, used
