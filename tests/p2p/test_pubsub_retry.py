"""A peer whose pubsub stream could not be negotiated at connection time still joins gossip
(:func:`node.p2p.gossipsub.retry_pubsub_streams`)."""

from __future__ import annotations

import trio

from .util import run, running_hosts


def test_gossip_reaches_a_peer_whose_first_pubsub_negotiation_failed():
    """Host A's first ``/meshsub`` stream to B fails as a negotiation timeout does on a loaded machine
    (``StreamFailure``, raised where py-libp2p raises it: ``BasicHost.new_stream``); A must retry while B stays
    connected, so that A's publications reach B. (Without the retry, py-libp2p 0.8.1 gives B up for good: B stays
    connected and hears nothing from A.)"""
    from libp2p.host.exceptions import StreamFailure

    async def body():
        async with running_hosts(2) as (a, b):
            topic = a.topic("shards")
            got = []

            async def on_b(data, origin):
                got.append((data, origin))

            async def on_a(data, origin):
                pass

            await a.subscribe(topic, on_a)
            await b.subscribe(topic, on_b)
            basic = a._host
            real_new_stream = basic.new_stream
            failed = []

            async def new_stream(peer_id, protocols, *args, **kw):
                if not failed and any("meshsub" in str(p) for p in protocols):
                    failed.append(peer_id)
                    raise StreamFailure(f"failed to open a stream to peer {peer_id}")
                return await real_new_stream(peer_id, protocols, *args, **kw)

            basic.new_stream = new_stream
            assert await b.connect(a.addrs) == 1
            with trio.fail_after(10):
                while not failed:
                    await trio.sleep(0.05)
            assert [str(p) for p in failed] == [b.peer_id]  # the failure happened, on A's stream to B
            n = 0
            with trio.fail_after(15):  # the library's retry backoff starts at 0.5 s
                while not got:
                    n += 1
                    await a.publish(topic, b"announcement %d" % n)
                    await trio.sleep(0.25)
            assert got[0][1] == a.peer_id and got[0][0].startswith(b"announcement ")
            assert b.peer_id in a.connected_peers()

    run(body, timeout=40)
