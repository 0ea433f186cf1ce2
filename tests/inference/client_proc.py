"""A client node as its own process, for tests that stop a client, or a server under it, mid-generation.

    python -m tests.inference.client_proc --data-dir DIR --genesis FILE --model-dir DIR --key N \\
        --bootstrap MULTIADDR --servers N --tokens N (--prompt-ids ID... | --prompt-text TEXT)
        [--hang-after I | --pause-at I]

A full :class:`~node.runtime.Node` without a span (its own ledger follows the chain; it submits the receipts of
replaced hops). It waits until it has heard ``--servers`` live span announcements and has connected to those
servers, prints ``PROMPT <json ids>``, then generates greedily and prints ``TOKEN i t`` after each new token
(1-based ``i``). Then:

* ``--hang-after I``: after token ``I`` prints ``HANG`` and waits forever with its sessions open (never closing
  its streams), for the test to SIGKILL or SIGSTOP it;
* ``--pause-at I``: after token ``I`` prints ``PAUSE <json route>`` (``[[peer, start, end], ...]``) and waits for
  one line on stdin (the test kills a server meanwhile), then goes on;
* at the end prints ``RESULT <json>``: ``tokens``, ``failovers`` (``token``, ``dead``, ``span``, ``replayed``) and
  ``receipts`` (``id`` hex, ``worker`` peer ID, ``span``, ``tokens``, ``price`` base units), and exits 0 — with
  ``--linger``, only after a line (or EOF) on stdin: until then the node stays up as a user's node does, serving
  the blobs of the receipts it submitted for replaced hops (a killed server's inputs and outputs exist nowhere
  else) to the committees that re-execute them.

Exits 1 with a message on stderr when the servers are not heard within 300 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import trio

from node.config import NodeConfig
from node.identity import account_to_str, dev_seed
from node.ledger.genesis import load_genesis
from node.runtime import Node

WAIT_SERVERS = 300.0  # seconds; six SmolLM2 server processes on two loaded cores take minutes to come up


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="client_proc", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--genesis", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--key", type=int, required=True, help="dev key of the client")
    p.add_argument("--bootstrap", required=True, help="multiaddr of a peer to dial (the validator)")
    p.add_argument("--servers", type=int, required=True, help="live span announcements to wait for")
    p.add_argument("--tokens", type=int, required=True, help="new tokens to generate")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", type=int, nargs="+")
    prompt.add_argument("--prompt-text")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--hang-after", type=int, metavar="I")
    stop.add_argument("--pause-at", type=int, metavar="I")
    p.add_argument("--linger", action="store_true", help="after RESULT, stay up until a line on stdin")
    return p.parse_args(argv)


def result_json(gen) -> str:
    """The ``RESULT`` line's JSON for a :class:`~node.inference.client.Generation`."""
    return json.dumps({
        "tokens": gen.tokens,
        "failovers": [{"token": f.token, "dead": f.dead, "span": list(f.span), "replayed": f.replayed}
                      for f in gen.failovers],
        "receipts": [{"id": r.id.hex(), "worker": account_to_str(r.worker), "span": [r.span_start, r.span_end],
                      "tokens": r.tokens, "price": r.price} for r in gen.receipts]})


async def connect_servers(node: Node, timeout: float = 60.0) -> None:
    """Dial every live server at the addresses it announced before the first session, as a client that has been
    on the network a while is: connection set-up (TCP, Noise, yamux, the genesis handshake) takes seconds on
    shared cores, and a server's step timeout runs from the moment it answers a session's open."""
    with trio.move_on_after(timeout):
        while True:
            missing = [p for p, _, _ in node.swarm.live(node.manifest.model_id)
                       if p not in node.host.connected_peers()]
            if not missing:
                return
            for p in missing:
                addrs = [x for x in node.swarm.entries[p]["addrs"] if x.endswith("/p2p/" + p)]
                await node.host.connect(addrs[:4])
            await trio.sleep(0.2)


def main(argv: list[str]) -> int:
    a = parse(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("libp2p", "multiaddr", "hypercorn", "httpx", "httpcore"):  # as `node start` does
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = NodeConfig(data_dir=a.data_dir, genesis=load_genesis(a.genesis), model_dir=a.model_dir, span=None,
                     seed=dev_seed(a.key), bootstrap=[a.bootstrap], announce_period=0.5)

    async def run() -> None:
        node = Node(cfg)
        async with trio.open_nursery() as n:
            n.start_soon(node.run)
            await node.started.wait()
            with trio.move_on_after(WAIT_SERVERS) as waiting:
                while True:  # dialling takes seconds on loaded cores: announcements may expire meanwhile
                    while len(node.swarm.live(node.manifest.model_id)) < a.servers:
                        await trio.sleep(0.1)
                    await connect_servers(node)
                    if len(node.swarm.live(node.manifest.model_id)) >= a.servers:
                        break
            if waiting.cancelled_caught:
                sys.exit(f"client_proc: heard {len(node.swarm.live(node.manifest.model_id))} of {a.servers} "
                         f"servers within {WAIT_SERVERS:.0f} s")
            # the tokenizer (and the head, built at first use) load off the event loop: loading them on it held
            # the loop for tens of seconds on loaded cores, and the servers' announcements expired meanwhile
            prompt = a.prompt_ids or await trio.to_thread.run_sync(node.encode_prompt, a.prompt_text)
            print("PROMPT", json.dumps(prompt), flush=True)

            async def on_token(i, tok, route):
                print(f"TOKEN {i} {tok}", flush=True)
                logging.getLogger("client_proc").info("token %d: %d", i, tok)
                if i == a.hang_after:
                    print("HANG", flush=True)
                    await trio.sleep_forever()
                if i == a.pause_at:
                    print("PAUSE", json.dumps([list(hop) for hop in route]), flush=True)
                    await trio.to_thread.run_sync(sys.stdin.readline)

            gen = await node.generate(prompt, a.tokens, on_token=on_token)
            print("RESULT", result_json(gen), flush=True)
            if a.linger:
                await trio.to_thread.run_sync(sys.stdin.readline)
            n.cancel_scope.cancel()

    trio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
