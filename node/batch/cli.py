"""``node batch ...``: batch jobs from the command line (post an item file, follow its progress, fetch the accepted
results), talking to the local node's HTTP API like ``node job``. torch-free: the file is checked here, the work is
done by the workers."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, cast

from ..encoding import parse_amount
from ..ledger.core.batchtx import MAX_GENERATE_TOKENS, MAX_REPLICATION, TASK_KINDS
from ..localapi import LocalApi
from ..progress import Progress
from .items import ItemsError, parse_items

FINAL = {"settled", "cancelled"}
FOLLOW_LIMIT = 7 * 24 * 3600  # seconds --follow waits at most


def _amount(text: str) -> str:
    try:
        parse_amount(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{n} is not in {low}..{high}")
        return n
    return parse


def add_batch_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_data_dir: Path) -> None:
    b = sub.add_parser("batch", help="batch jobs checked by majority vote: post, status, fetch, cancel",
                       description="Pay credits for generation or scoring of many items, each done by k bonded "
                                   "workers drawn by a block beacon and decided by majority vote (commit-reveal): "
                                   "agreeing workers are paid, dissenting ones slashed, items without a quorum "
                                   "re-issued and then refunded. Talks to the local node (its API URL and token "
                                   "are read from --data-dir).")
    b.add_argument("--data-dir", type=Path, default=default_data_dir, help="the node's data dir (default: %(default)s)")
    bs = b.add_subparsers(dest="batch_cmd", required=True)
    p = bs.add_parser("post", help="post a JSONL item file with escrow",
                      description='FILE has one JSON object per line: {"prompt": "..."} or {"prompt_ids": [...]} '
                                  'for generate, {"text": "..."} for score. The item index is the 0-based line. '
                                  "Escrow: items × k × price × (1 + max reissues), the unspent part refunded. Keep "
                                  "the node running until the workers have fetched the file from it.")
    p.add_argument("file", type=Path, help="the JSONL item file")
    p.add_argument("--kind", required=True, choices=TASK_KINDS,
                   help="generate: greedy completion of --max-tokens tokens; score: per-token log-likelihoods")
    p.add_argument("-k", "--replication", type=_int_in(2, MAX_REPLICATION), default=3,
                   help="workers per item (default: %(default)s)")
    p.add_argument("--quorum", type=_int_in(2, MAX_REPLICATION), default=None,
                   help="equal results that decide an item, more than k/2 (default: k // 2 + 1)")
    p.add_argument("--price", type=_amount, default="0.001",
                   help="credits per item per agreeing worker, plain decimal (default: %(default)s)")
    p.add_argument("--max-tokens", type=_int_in(1, MAX_GENERATE_TOKENS), default=32,
                   help="generate: new tokens per item (default: %(default)s)")
    p.add_argument("--max-reissues", type=_int_in(0, 8), default=1,
                   help="re-issues to fresh workers of an item without a quorum (default: %(default)s)")
    p.add_argument("--commit-window", type=_int_in(1, 10_000), default=600,
                   help="blocks a drawn worker has to commit its result (default: %(default)s; the devnet makes "
                        "2 blocks a second)")
    p.add_argument("--reveal-window", type=_int_in(1, 10_000), default=120,
                   help="blocks to reveal after the commit window (default: %(default)s)")
    p.add_argument("--follow", action="store_true", help="show progress until the batch is settled")
    s = bs.add_parser("status", help="list batches, or show one with its progress")
    s.add_argument("batch_id", nargs="?")
    s.add_argument("--follow", action="store_true", help="show progress until the batch is settled")
    s.add_argument("--json", action="store_true", help="print the API's JSON")
    f = bs.add_parser("fetch", help="write the accepted results as JSONL, each with the workers that agreed")
    f.add_argument("batch_id")
    f.add_argument("-o", "--out", type=Path, help="output file (default: standard output)")
    c = bs.add_parser("cancel", help="cancel a batch none of whose items has been drawn (full refund)")
    c.add_argument("batch_id")


def read_items(path: Path, kind: str) -> str:
    """The item file's text, checked as the node will check it (so a bad file never reaches the node).

    Exits: unreadable, not UTF-8, or not a valid item file (the line number and reason)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        sys.exit(f"node batch: cannot read {path}: {e.strerror or e}")
    try:
        parse_items(data, kind)
        return data.decode("utf-8")
    except ItemsError as e:
        sys.exit(f"node batch: {path}: {e}")
    except UnicodeDecodeError:
        sys.exit(f"node batch: {path}: not UTF-8")


def _call(api: LocalApi, method: str, path: str, **kw: Any) -> dict[str, Any]:
    """``api.call`` without ``missing_ok``: the node's JSON object (a 404 or any error ends the command there)."""
    # cast: LocalApi.call returns None only for a 404 with missing_ok=True, which this never passes
    return cast(dict[str, Any], api.call(method, path, **kw))


def summary(b: dict[str, Any]) -> str:
    rate = "—" if b["agreement_rate"] is None else f"{100 * b['agreement_rate']:.1f} %"
    return (f"batch {b['batch_id']}  {b['status']:9} {b['kind']:8} {b['decided']}/{b['n_items']} decided "
            f"({b['accepted']} accepted, {b['refunded_items']} refunded), agreement {rate}, paid "
            f"{b['paid']['credits']} credits, slashed {b['slashed']['credits']}")


def follow(api: LocalApi, batch_id: str, out: TextIO | None = None) -> dict[str, Any]:
    """Poll every second until the batch is settled or cancelled (or :data:`FOLLOW_LIMIT` passed): a bar over its
    items on a terminal, else its :func:`summary` line on each change (:class:`node.progress.Progress`). Returns the
    last batch seen.

    Exits: the batch is not on the ledger within 60 s."""
    deadline = time.monotonic() + 60
    while (b := api.call("GET", f"/v1/batches/{batch_id}", missing_ok=True)) is None:  # not in a block yet
        if time.monotonic() > deadline:
            sys.exit(f"node batch: batch {batch_id} did not appear on the ledger within 60 s")
        time.sleep(0.5)
    end = time.monotonic() + FOLLOW_LIMIT
    with Progress(b["n_items"], "item", f"batch {batch_id[:8]}", out) as bar:
        while True:
            agree = "n/a" if b["agreement_rate"] is None else f"{b['agreement_rate']:.2f}"
            bar.show(b["decided"], f"status={b['status']}, accepted={b['accepted']}, agree={agree}", line=summary(b))
            if b["status"] in FINAL or time.monotonic() > end:
                return b
            time.sleep(1)
            b = _call(api, "GET", f"/v1/batches/{batch_id}")


def run_batch_command(args: argparse.Namespace) -> int:
    if args.batch_cmd == "post":
        text = read_items(args.file, args.kind)  # before contacting the node
        api = LocalApi(args.data_dir, "node batch")
        body = {"items": text, "kind": args.kind, "replication": args.replication, "quorum": args.quorum,
                "price": args.price, "max_tokens": args.max_tokens, "max_reissues": args.max_reissues,
                "commit_window": args.commit_window, "reveal_window": args.reveal_window}
        out = _call(api, "POST", "/v1/batches", json=body)
        esc = int(out["escrow"]["base_units"])
        print(f"posted batch {out['batch_id']} ({out['n_items']} items, {esc / 1e9:g} credits in escrow)")
        if args.follow:
            print(summary(follow(api, out["batch_id"])))
        return 0
    api = LocalApi(args.data_dir, "node batch")
    if args.batch_cmd == "status":
        if args.batch_id is None:
            for b in _call(api, "GET", "/v1/batches")["batches"]:
                print(summary(b))
            return 0
        b = follow(api, args.batch_id) if args.follow else _call(api, "GET", f"/v1/batches/{args.batch_id}")
        print(json.dumps(b, indent=2) if args.json else summary(b))
    elif args.batch_cmd == "fetch":
        res = _call(api, "POST", f"/v1/batches/{args.batch_id}/fetch", json={})
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in res["results"])
        if args.out is None:
            sys.stdout.write(lines)
        else:
            tmp = args.out.with_name(args.out.name + ".tmp")
            tmp.write_text(lines)
            tmp.replace(args.out)
            print(f"{len(res['results'])} accepted results of {res['n_items']} items written to {args.out} "
                  f"(batch {res['status']})", file=sys.stderr)
    elif args.batch_cmd == "cancel":
        print(_call(api, "POST", f"/v1/batches/{args.batch_id}/cancel")["status"])
    return 0
