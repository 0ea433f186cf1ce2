"""A stream handler's exception stays with its stream (found by the hostile-peer suite's post-hello bomb).

Ten bytes on ``/meshsub/1.1.0`` from a peer that completed the hello (any fresh identity can) made py-libp2p's
pubsub handler raise ``DecodeError`` (protobuf), which escaped the swarm's stream handler and stopped the node.
Here a real in-process node (validator, tiny model span) gets those bytes from a second libp2p host on 127.0.0.1:
the node must keep making blocks and answering, and the sender must be penalised for it.
"""

from __future__ import annotations

import struct

import trio

from node.compute.model import make_tiny
from node.net.hello import HELLO_PROTOCOL
from node.runtime import Node

from ..e2e.swarm import node_config, tiny_genesis
from ..p2p.util import hello_peer

# a Tally frame (4-byte length, 1 flag byte) around a msgpack map32 header claiming 2^32-1 pairs: as protobuf, a
# field with a wire type that does not exist
LYING = struct.pack(">IB", 5, 0) + b"\xdf" + struct.pack(">I", 0xFFFFFFFF)


def test_garbage_on_meshsub_penalises_the_sender_and_the_node_keeps_going(tmp_path):
    g = tiny_genesis(1)
    tiny = make_tiny(tmp_path / "models", seed=0)
    seen: dict = {}

    async def main() -> None:
        async with trio.open_nursery() as n:
            node = Node(node_config(tmp_path, 0, g, tiny, span=(0, 6)))
            n.start_soon(node.run)
            await node.started.wait()
            async with hello_peer(node, g, agent="garbage") as (client, hello):
                before = node.host.scores.score(client.peer_id)
                sent = 0
                for _ in range(3):  # one stream is enough to stop an unguarded node; three show it stays up
                    stream = await client.open_stream(node.host.peer_id, "/meshsub/1.1.0", timeout=10)
                    await stream.write(LYING)
                    sent += len(LYING)
                    with trio.move_on_after(2):  # the node resets the stream (or the connection) after the error
                        while True:
                            try:
                                if not await stream.read(1024):
                                    break
                            except Exception:  # noqa: BLE001 - a reset of any libp2p kind ends the read
                                break
                    if node.host.banned(client.peer_id):
                        break
                seen["sent"] = sent
                seen["penalty"] = before - node.host.scores.score(client.peer_id)
                height = node.ledger.state.height
                await node.ledger.wait_for_height(height + 2, timeout=30)  # the node still makes blocks
                seen["heights"] = (height, node.ledger.state.height)
                async with hello_peer(node, g, agent="fresh") as (other, _):  # and still serves a fresh peer
                    reply = await other.request(node.host.peer_id, HELLO_PROTOCOL, hello, timeout=10)
                    seen["fresh_hello"] = reply["genesis"] == g.hash.hex()
            n.cancel_scope.cancel()

    trio.run(main)
    print(seen)
    assert seen["sent"] >= len(LYING)  # the attack happened
    assert seen["penalty"] > 0, "the sender of garbage on /meshsub was not penalised"
    assert seen["heights"][1] >= seen["heights"][0] + 2 and seen["fresh_hello"]
