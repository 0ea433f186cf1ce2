"""``node ledger``: inspect and re-verify a node's ledger while the node is stopped.

``node ledger info`` prints the head, the stored state's height and the bytes stored per kind of key;
``node ledger verify`` re-checks every block from genesis (signatures, commits, the state transition) and
compares the result with the stored state, with a progress bar (plain lines when output is not a terminal);
``--repair`` rewrites a stored state that differs. A node itself only opens its stored state at start
(:meth:`node.ledger.store.LedgerStore.replay`), however long the chain.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import IO, TextIO

from ..lockfile import LockHeld, hold
from ..progress import Progress
from . import statedb
from .genesis import GenesisError, load_genesis
from .store import LedgerStore, StoreCorrupt, StoreLocked

KINDS = {b"B": "blocks", b"S/": "state", b"i/": "explorer index", b"X/": "history log", b"T/": "state tree"}


def add_ledger_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_data_dir: Path) -> None:
    """Register ``node ledger info|verify`` on an argparse subparsers object."""
    p = sub.add_parser("ledger", help="inspect or re-verify this node's ledger (the node must be stopped)",
                       description="Inspect and re-verify a node's ledger while the node is stopped: `info` prints "
                                   "what is stored, `verify` re-checks every block from genesis against the stored "
                                   "state.")
    lsub = p.add_subparsers(dest="ledger_cmd", required=True)
    for name, text in (("info", "head height, stored state and bytes per kind of key"),
                       ("verify", "re-check every block from genesis and compare with the stored state")):
        q = lsub.add_parser(name, help=text, description=text)
        q.add_argument("--data-dir", type=Path, default=default_data_dir,
                       help="the node's data directory (default: %(default)s)")
        q.add_argument("--genesis", type=Path,
                       help="the genesis file the node runs (default: the embedded devnet)")
        if name == "verify":
            q.add_argument("--repair", action="store_true",
                           help="rewrite the stored state from the replay when they differ")


def _open(args: argparse.Namespace) -> tuple[LedgerStore, IO[str]]:
    path = args.data_dir / "ledger"
    if not path.is_dir():
        sys.exit(f"node ledger: no ledger in {args.data_dir} (start a node there first)")
    try:
        lock = hold(args.data_dir / "node.lock")
    except LockHeld as e:
        sys.exit(f"node ledger: a node (pid {e.pid}) is running in {args.data_dir}; stop it first")
    try:
        genesis = load_genesis(args.genesis)
    except (GenesisError, OSError) as e:
        sys.exit(f"node ledger: bad genesis: {e}")
    try:
        return LedgerStore(path, genesis), lock
    except (StoreLocked, StoreCorrupt) as e:
        sys.exit(f"node ledger: {e}")


def run_ledger_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run ``node ledger info|verify``. Returns the exit status (verify: 1 when the stored state differs and
    was not repaired, 2 when a block does not verify)."""
    store, _lock = _open(args)
    try:
        if args.ledger_cmd == "info":
            sizes: dict[str, int] = {}
            counts: dict[str, int] = {}
            for k, v in store.db.iterator():
                kind = next((n for p, n in KINDS.items() if k.startswith(p)), "other")
                sizes[kind] = sizes.get(kind, 0) + len(k) + len(v)
                counts[kind] = counts.get(kind, 0) + 1
            meta = statedb.read_meta(store.db)
            print(f"head: {store.head}", file=out)
            print(f"stored state: {'none (replayed from genesis at the next start)' if meta is None else meta[0]}",
                  file=out)
            for kind in sorted(sizes):
                print(f"{kind}: {counts[kind]} keys, {sizes[kind]} bytes", file=out)
            return 0
        t0 = time.monotonic()
        total = store.head
        # a bar on a terminal, else a plain line every 10 % of the blocks
        with Progress(total, "block", "verify", out, every=total // 10) as bar:
            try:
                diffs = store.verify(progress=lambda h: bar.show(h, line=f"verified {h}/{total} blocks"),
                                     repair=args.repair)
            except StoreCorrupt as e:
                bar.close()
                print(f"node ledger verify: {e}", file=out)
                return 2
        took = time.monotonic() - t0
        if not diffs:
            print(f"ok: {store.head} blocks verified from genesis in {took:.1f} s; the stored state matches",
                  file=out)
            return 0
        print(f"the stored state differs from the replay ({len(diffs)} shown):", file=out)
        for d in diffs:
            print(f"  {d}", file=out)
        print("repaired: the stored state was rewritten from the replay" if args.repair
              else "run again with --repair to rewrite it from the blocks", file=out)
        return 0 if args.repair else 1
    finally:
        store.close()


__all__ = ["add_ledger_parser", "run_ledger_command"]

