"""A client node as its own process, for tests that kill or freeze a client mid-generation.

``python -m tests.inference.client_proc DATA_DIR GENESIS MODEL_DIR KEY BOOTSTRAP N_SERVERS HANG_AFTER TOKENS PROMPT...``
prints ``TOKEN i t`` after each new token and, after token ``HANG_AFTER``, ``HANG`` and then waits forever
with its sessions open (never closing its streams).
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from node.identity import dev_seed
from node.ledger.genesis import load_genesis
from node.runtime import Node, NodeConfig


def main() -> None:
    data, gfile, model, key, boot, n_servers, hang_after, tokens, *prompt = sys.argv[1:]
    cfg = NodeConfig(data_dir=Path(data), genesis=load_genesis(Path(gfile)), model_dir=Path(model), span=None,
                     seed=dev_seed(int(key)), bootstrap=[boot], announce_period=0.5)

    async def run() -> None:
        node = Node(cfg)
        async with trio.open_nursery() as n:
            n.start_soon(node.run)
            await node.started.wait()
            with trio.fail_after(60):
                while len(node.swarm.live(node.manifest.model_id)) < int(n_servers):
                    await trio.sleep(0.1)

            async def on_token(i, tok, route):
                print(f"TOKEN {i} {tok}", flush=True)
                if i == int(hang_after):
                    print("HANG", flush=True)
                    await trio.sleep_forever()

            await node.generate([int(t) for t in prompt], int(tokens), on_token=on_token)

    trio.run(run)


if __name__ == "__main__":
    main()
