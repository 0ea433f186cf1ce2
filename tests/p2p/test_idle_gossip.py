"""An idle network gossips only what its protocol needs: counts per block and per announcement period, not times.

A validator and two tiny-model span servers on a quiet chain (``heartbeat_ms`` 1 s; full
:class:`node.runtime.Node` s, real libp2p on 127.0.0.1, real LevelDB) sit idle; over a window every node's gossip
counters (:class:`node.p2p.gossip.GossipCounts`) must stay within bounds derived from the protocol:

* blocks: at most one per heartbeat (``heartbeat_ms``; ``block_time_ms`` when it is 0) in the window, plus the
  two at its edges;
* consensus originated: the validator's 4 messages per height (proposal, prevote, precommit, block) plus at most
  one re-broadcast of the 3 signed ones per ``RESEND_PERIOD``; nothing from a non-validator;
* shards originated: one message per announcement period (a presence message, or on a server its span
  announcement, which carries the same addresses), plus one at the window's edge;
* publish items sent: each distinct message at most once to each other peer, plus the messages in flight at the
  window's edges;
* control: IHAVE ids at most the gossipsub history (3 heartbeats) times the messages times the peers; GRAFT and
  PRUNE at most one per topic per peer (the mesh is built before the window).

An idle loop that re-publishes, a chain that makes blocks while idle, a forwarding loop or mesh churn fails it.
"""

from __future__ import annotations

import pytest
import trio

from node.compute.model import make_tiny
from node.ledger.driver import RESEND_PERIOD
from node.p2p.gossip import TOPIC_NAMES
from tests.inference.procs import config, start_nodes, write_genesis

PERIOD = 1.0  # announcement (and presence) period of every node, s
WINDOW = 6.0  # idle seconds watched
HEARTBEAT_MS = 1000  # a quiet chain: an idle validator makes a block a second
HISTORY = 3  # gossipsub's history_gossip: heartbeats an id is announced in IHAVE


def snapshot(node) -> dict:
    c = node.host.gossip_counts()
    return {"sent": dict(c.sent), "published": dict(c.published), "delivered": dict(c.delivered),
            "height": node.ledger.state.height}


def delta(a: dict, b: dict) -> dict:
    out = {"height": b["height"] - a["height"]}
    for k in ("sent", "published", "delivered"):
        out[k] = {key: b[k].get(key, 0) - a[k].get(key, 0) for key in b[k]}
    return out


@pytest.mark.slow  # out of the default suite for its time (~20 s; it took 18 min here); CI runs it
def test_idle_gossip_stays_within_protocol_bounds(tmp_path):
    tiny = make_tiny(tmp_path / "models", 0)
    gfile = write_genesis(tmp_path, servers=[1, 2], clients=[], heartbeat_ms=HEARTBEAT_MS)

    async def main():
        async with trio.open_nursery() as n:
            (validator,) = await start_nodes(n, [config(tmp_path, 0, gfile, tiny, announce_period=PERIOD)])
            boot = [validator.host.addrs[0]]
            servers = await start_nodes(n, [config(tmp_path, k, gfile, tiny, span=(3 * k - 3, 3 * k), bootstrap=boot,
                                                   announce_period=PERIOD) for k in (1, 2)])
            nodes = [validator, *servers]
            with trio.fail_after(60):
                for nd in nodes:  # every announcement heard by everyone, every mesh built
                    while len(nd.swarm.live(nd.manifest.model_id)) < 2 or any(
                            len(nd.host.mesh_peers(nd.host.topic(t))) < 2 for t in TOPIC_NAMES):
                        await trio.sleep(0.1)
            await trio.sleep(2 * PERIOD)
            before = [snapshot(nd) for nd in nodes]
            t0 = trio.current_time()
            await trio.sleep(WINDOW)
            after = [snapshot(nd) for nd in nodes]
            elapsed = trio.current_time() - t0
            with trio.fail_after(30):  # the servers follow the chain (gossip, or their sync backstop)
                while any(s.ledger.state.height < after[0]["height"] for s in servers):
                    await trio.sleep(0.1)
            n.cancel_scope.cancel()
        return [delta(a, b) for a, b in zip(before, after, strict=True)], elapsed, validator.genesis.params

    deltas, elapsed, p = trio.run(main)
    peers = len(deltas) - 1
    blocks = deltas[0]["height"]
    assert 1 <= blocks <= elapsed * 1000 / p.heartbeat() + 2, (blocks, elapsed)
    periods = elapsed / PERIOD + 1
    for i, d in enumerate(deltas):
        pub, sent = d["published"], d["sent"]
        if i == 0:
            assert pub.get("consensus", 0) <= 4 * (blocks + 1) + 3 * (elapsed / RESEND_PERIOD + 1), (pub, blocks)
        else:
            assert pub.get("consensus", 0) == 0, pub
        assert pub.get("tx", 0) == 0, pub
        assert pub.get("shards", 0) <= periods, (i, pub, elapsed)
        for topic in TOPIC_NAMES:
            seen = pub.get(topic, 0) + d["delivered"].get(topic, 0)
            assert sent.get(("publish", topic), 0) <= (seen + 3) * peers, (i, topic, sent, seen)
        msgs = sum(pub.values()) + sum(d["delivered"].values())
        ihave = sum(v for (k, _t), v in sent.items() if k in ("ihave", "iwant"))
        assert ihave <= HISTORY * msgs * peers, (i, ihave, msgs)
        churn = sum(v for (k, _t), v in sent.items() if k in ("graft", "prune"))
        assert churn <= len(TOPIC_NAMES) * peers, (i, sent)


def test_a_cached_signed_peer_record_still_refuses_a_changed_or_foreign_one():
    """The per-RPC signed-record check is skipped only for bytes already accepted from that peer by that host
    (:func:`node.p2p.gossipsub.cache_signed_records`): a tampered record, or the same record arriving from another
    peer, is still checked and refused."""
    import multiaddr
    from libp2p import new_host
    from libp2p.peer.peerstore import env_to_send_in_RPC
    from libp2p.pubsub import pubsub as pubsub_mod
    from libp2p.pubsub.pb.rpc_pb2 import RPC

    from node.identity import Identity, dev_seed
    from node.p2p.gossipsub import cache_signed_records
    from node.p2p.host import libp2p_keypair

    cache_signed_records()
    cache_signed_records()  # idempotent
    consume = pubsub_mod.maybe_consume_signed_record
    a = new_host(key_pair=libp2p_keypair(Identity.from_seed(dev_seed(1))),
                 listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")])
    b = new_host(key_pair=libp2p_keypair(Identity.from_seed(dev_seed(2))))
    c = new_host(key_pair=libp2p_keypair(Identity.from_seed(dev_seed(3))))
    rpc = RPC()
    rpc.senderRecord = env_to_send_in_RPC(a)[0]
    assert consume(rpc, b, a.get_id()) and consume(rpc, b, a.get_id())  # checked, then remembered
    assert not consume(rpc, b, c.get_id())  # a's record sent by c: refused
    bad = bytearray(rpc.senderRecord)
    bad[-5] ^= 1
    tampered = RPC()
    tampered.senderRecord = bytes(bad)
    assert not consume(tampered, b, a.get_id())
    assert consume(rpc, c, a.get_id())  # another host checks it for itself
    assert consume(RPC(), b, a.get_id())  # no record: nothing to check, as in py-libp2p
