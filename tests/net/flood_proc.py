"""A hostile peer in its own process: passes the genesis handshake, then opens N streams and M connections to a
target in a loop; prints one JSON line of what it managed (test infra for tests/net/test_flood_while_generating.py).

    python tests/net/flood_proc.py TARGET_MULTIADDR CHAIN_ID GENESIS_HEX PROTOCOL N_STREAMS N_CONNS
"""

import json
import sys

import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from node.identity import Identity
from node.net.service import NetworkService
from node.p2p.host import P2PHost


async def main(target: str, chain: str, genesis: bytes, proto: str, n_streams: int, n_conns: int) -> dict:
    bad = P2PHost(Identity.generate(), 0, chain, genesis_hash=genesis)
    net = NetworkService(bad, genesis)
    stats = {"streams_opened": 0, "stream_failures": 0, "conns_opened": 0, "conn_failures": 0}
    held = []
    async with bad.running():
        await bad.start_service(net.run)
        assert await bad.connect([target]) == 1
        pid = ID.from_base58(target.rsplit("/p2p/", 1)[1])
        with trio.fail_after(20):
            while not net.hello.verified(pid.to_base58()):
                await trio.sleep(0.05)
        lib = bad.libp2p
        for _ in range(n_streams):  # in a loop, each stream held open
            with trio.move_on_after(1.0):
                try:
                    held.append(await lib.new_stream(pid, [proto]))
                    stats["streams_opened"] += 1
                    continue
                except Exception:  # noqa: BLE001 - the flooder counts failures of any kind
                    pass
            stats["stream_failures"] += 1
        addr = Multiaddr(target.rsplit("/p2p/", 1)[0])
        for _ in range(n_conns):
            with trio.move_on_after(1.0):
                try:
                    await lib.get_network().dial_addr(addr, pid)
                    stats["conns_opened"] += 1
                    continue
                except Exception:  # noqa: BLE001 - the flooder counts failures of any kind
                    pass
            stats["conn_failures"] += 1
    return stats


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps(trio.run(main, a[0], a[1], bytes.fromhex(a[2]), a[3], int(a[4]), int(a[5]))), flush=True)
