"""Calibrate the comparison tolerance: honest distances versus cheat distances, measured side by side.

For sessions through a span of the model, measures the distance (``node.compute.compare.distance``: worst
per-token relative L2) between a worker's committed outputs and a committee's re-execution:
  * honest: incremental decoding (KV cache) vs one prefill; worker and committee at 1 or 2 torch threads;
    the committee's prefill as a batch of one or stacked with another session (batch of two);
  * every cheat of ``node.compute.cheats`` (the smallest distance over the sessions).
Prints a table and the margins: tolerance ÷ worst honest distance, and smallest cheat distance ÷ tolerance.

Usage: ``.venv/bin/python bench/calibrate.py [--model tiny|smollm2] [--sessions N]``
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from node.compute.cheats import FAULTS
from node.compute.compare import DEFAULT_TOLERANCE, distance
from node.compute.span import SpanModel


def session(span, x, prompt, threads):
    torch.set_num_threads(threads)
    cache = span.new_cache()
    outs = [span.forward(x[:, :prompt], cache)]
    outs += [span.forward(x[:, t:t + 1], cache) for t in range(prompt, x.shape[1])]
    return torch.cat(outs, dim=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    ap.add_argument("--sessions", type=int, default=12)
    args = ap.parse_args()
    from node.compute.model import ensure_smollm2, make_tiny

    model_dir = make_tiny(Path("/tmp/tally-bench-models"), 0) if args.model == "tiny" else ensure_smollm2()
    n_blocks = SpanModel(model_dir, 0, 1).manifest.num_blocks
    span = (0, min(10, n_blocks))
    honest = SpanModel(model_dir, *span)
    head = None
    if args.model == "smollm2":  # realistic inputs: embeddings of real text, not Gaussian noise
        from node.compute.head import ClientHead

        head = ClientHead(model_dir)
    rng = random.Random(0)
    inputs = []
    for i in range(args.sessions):
        n = rng.randint(24, 64)
        if head is not None:
            ids = torch.randint(0, head.vocab_size, (1, n), generator=torch.Generator().manual_seed(i))
            inputs.append((head.embed(ids), rng.randint(1, n // 2)))
        else:
            inputs.append((torch.randn(1, n, honest.hidden_size, generator=torch.Generator().manual_seed(i)),
                           rng.randint(1, n // 2)))
    rows = []
    worst_honest = 0.0
    for wt in (1, 2):
        for ct in (1, 2):
            for batch in (1, 2):
                worst = 0.0
                for x, prompt in inputs:
                    committed = session(honest, x, prompt, wt)
                    torch.set_num_threads(ct)
                    xb = torch.cat([x, x.flip(1)]) if batch == 2 else x
                    worst = max(worst, distance(committed, honest.prefill(xb)[:1]))
                rows.append((f"honest: worker {wt} thr, committee {ct} thr, batch {batch}", worst))
                worst_honest = max(worst_honest, worst)
    torch.set_num_threads(1)
    least_cheat = float("inf")
    for fault in [f for f in FAULTS if f is not None]:
        cheat = SpanModel(model_dir, *span, fault=fault)
        ds = []
        for j, (x, prompt) in enumerate(inputs):
            committed = session(cheat, x, prompt, 1)
            if fault == "replay" and j == 0:
                continue  # the first session only records outputs to replay later
            ds.append(distance(committed, honest.prefill(x)))
        rows.append((f"cheat: {fault}", min(ds)))
        least_cheat = min(least_cheat, min(ds))
    print(f"calibration on {honest.manifest.name}, blocks [{span[0]}, {span[1]}), {len(inputs)} sessions "
          f"of 24-64 tokens; metric: worst per-token relative L2 distance")
    for name, d in rows:
        print(f"   {name:48} {d:12.3g}")
    print(f"tolerance {DEFAULT_TOLERANCE:g}: {DEFAULT_TOLERANCE / max(worst_honest, 1e-12):.0f}x the worst honest "
          f"distance; the closest cheat is {least_cheat / DEFAULT_TOLERANCE:.0f}x the tolerance")


if __name__ == "__main__":
    main()
