"""A node restarted with the same key is heard at once (issue 28's root cause): py-libp2p numbers publications from
the start time in seconds, one per message, so a node that published faster than one message a second repeated,
after a restart, numbers its peers had seen in the last two minutes, and they dropped everything it published
(its wallet's transactions, its votes and blocks) as duplicates. Real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

import trio

from node.identity import Identity
from node.p2p.host import P2PHost
from tests.p2p.util import CHAIN, run, running_hosts

BURST = 300  # publications before the restart: far more than the seconds the test lasts


def test_a_restarted_node_is_heard_at_once_after_a_burst_of_publications():
    ident = Identity.generate()

    async def body():
        async with running_hosts(1) as (b,):
            topic = b.topic("tx")
            got: list[bytes] = []

            async def on_b(data, origin):
                got.append(data)

            await b.subscribe(topic, on_b)

            async def life(tag: bytes, n: int) -> None:
                async with P2PHost(ident, 0, CHAIN).running() as a:
                    async def on_a(data, origin):
                        pass

                    await a.subscribe(topic, on_a)
                    assert await a.connect(b.addrs) == 1
                    await a.wait_for_topic_peers(topic, 1, timeout=10)
                    before = len(got)
                    with trio.fail_after(10):  # the first publication after the mesh forms reaches b
                        k = 0
                        while len(got) == before:
                            k += 1
                            await a.publish(topic, b"%s probe %d" % (tag, k))
                            await trio.sleep(0.1)
                    for i in range(n):
                        await a.publish(topic, b"%s %d" % (tag, i))
                    with trio.fail_after(10):
                        while not any(g == b"%s %d" % (tag, n - 1) for g in got):
                            await trio.sleep(0.02)
                with trio.fail_after(10):
                    while ident.peer_id in b.connected_peers():
                        await trio.sleep(0.02)

            await life(b"first", BURST)
            first = len(got)
            await life(b"second", 20)  # the same key, seconds later
            second = [g for g in got[first:] if not g.startswith(b"second probe")]
            assert second == [b"second %d" % i for i in range(20)]

    run(body, timeout=90)
