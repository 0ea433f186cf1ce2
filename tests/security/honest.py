"""The honest client of the hostile-peer suite, as its own process on another loopback address.

    python -m tests.security.honest --data-dir DIR --genesis FILE --model-dir DIR --key N --bootstrap ADDR \\
        --servers N --src 127.0.1.2 --tokens N --prompt-ids ID...

A full :class:`~node.runtime.Node` without a span that listens on ``--src`` and dials from it
(:func:`tests.security.srcaddr.bind_source`), so the target sees it as a peer of another /24 than the attackers.
Once it has heard ``--servers`` span announcements and connected to them it prints ``READY``, then generates
``--tokens`` tokens greedily from the prompt in a loop, forever, printing one line per generation::

    GEN {"t0": wall s, "t1": wall s, "tokens": [...]}            a generation that completed
    ERR {"t0": wall s, "t1": wall s, "error": "Type: message"}   one that raised (the loop goes on)

(``t0``/``t1``: ``time.time()`` at its start and end). It stops on EOF on stdin or SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import trio

from node.config import NodeConfig
from node.identity import dev_seed
from node.ledger.genesis import load_genesis
from node.runtime import Node
from tests.inference.client_proc import connect_servers
from tests.security.srcaddr import bind_source

WAIT_SERVERS = 120.0  # seconds for the servers' announcements on loaded cores


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="honest", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--genesis", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--key", type=int, required=True, help="dev key of the client")
    p.add_argument("--bootstrap", required=True, help="multiaddr of the target")
    p.add_argument("--servers", type=int, required=True, help="live span announcements to wait for")
    p.add_argument("--src", required=True, help="loopback address to listen on and dial from")
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--prompt-ids", type=int, nargs="+", required=True)
    p.add_argument("--pause", type=float, default=0.2, help="seconds between generations")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    bind_source(a.src)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = NodeConfig(data_dir=a.data_dir, genesis=load_genesis(a.genesis), model_dir=a.model_dir, span=None,
                     seed=dev_seed(a.key), bootstrap=[a.bootstrap], announce_period=0.5,
                     listen=[f"/ip4/{a.src}/tcp/0"], step_timeout=15.0)

    async def run() -> None:
        node = Node(cfg)
        async with trio.open_nursery() as n:
            n.start_soon(node.run)
            await node.started.wait()

            async def stdin_eof() -> None:
                await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
                n.cancel_scope.cancel()

            n.start_soon(stdin_eof)
            with trio.move_on_after(WAIT_SERVERS) as waiting:
                while True:
                    while len(node.swarm.live(node.manifest.model_id)) < a.servers:
                        await trio.sleep(0.1)
                    await connect_servers(node)
                    if len(node.swarm.live(node.manifest.model_id)) >= a.servers:
                        break
            if waiting.cancelled_caught:
                sys.exit(f"honest: heard {len(node.swarm.live(node.manifest.model_id))} of {a.servers} servers")
            print("READY", flush=True)
            while True:
                t0 = time.time()
                try:
                    gen = await node.generate(a.prompt_ids, a.tokens)
                    print("GEN", json.dumps({"t0": t0, "t1": time.time(), "tokens": gen.tokens}), flush=True)
                except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
                    print("ERR", json.dumps({"t0": t0, "t1": time.time(),
                                             "error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
                await trio.sleep(a.pause)

    trio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
