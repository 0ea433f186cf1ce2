"""The real-model arms of ``bench/training.py --model smollm2`` (issue 40): SmolLM2-135M LoRA, K DiLoCo workers
with a top-k codec and error feedback, the same run with worker 0 slowed F× under the run's quorum, one worker and
data-parallel, all from one LoRA init per seed, on the same beacon-drawn batches.

Per round ``r`` (DiLoCo, :func:`diloco_round`): each worker loads θ_r, resets or restores its inner AdamW state,
trains H steps on its own batches (``assign_round``), encodes Δ = θ_r − θ_worker with the codec and its residual
(error feedback), and the outer step (:func:`node.training.outer.outer_step`) averages the decoded Δs it is given.
Each worker's compute time (``time.monotonic`` around its H steps) is measured in the unslowed run; the straggler
run's clock uses the same times with worker 0's × F, and :func:`bench.training_clock.round_close` (the ledger's own
quorum rule, driven block by block) says when the commit phase closes and whose Δ it took. A worker the ledger
left out is not trained that round (its Δ would be refused and never paid); its residual and inner state stay.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.training_clock import BLOCK_S, finish_blocks, round_close
from node.compute.model import ensure_smollm2
from node.compute.train import encode_text, split_tokens
from node.encoding import H
from node.training.assign import assign_round, batch_tensors, make_windows
from node.training.codec import Codec, decode, encode, payload_bytes
from node.training.inner import InnerTrainer
from node.training.outer import OuterSpec, outer_step

REAL_RANK = 8
REAL_TARGETS = ("q_proj", "v_proj")


@dataclass
class Arm:
    """One DiLoCo run's state: global θ, outer momentum, per-worker inner state and codec residual."""

    theta: list[torch.Tensor]
    momentum: list[torch.Tensor] | None = None
    kept: dict[bytes, list[torch.Tensor] | None] = field(default_factory=dict)
    residual: dict[bytes, list[torch.Tensor]] = field(default_factory=dict)
    used: int = 0  # Δs that entered an outer step
    payload: int = 0  # largest payload seen (bytes)


def diloco_round(tr: InnerTrainer, arm: Arm, per_worker: dict[bytes, list[torch.Tensor]], take: list[bytes],
                 args, spec: OuterSpec) -> dict[bytes, float]:
    """Train ``take``'s workers from ``arm.theta``, encode, outer step; returns each trained worker's compute s."""
    theta = arm.theta
    deltas, secs = [], {}
    for w in take:
        tr.load_params(theta)
        kept = arm.kept.get(w)
        if args.inner_state == "keep" and kept is not None:
            tr.load_opt_state(kept)
        else:
            tr.reset_opt_state()
        t = time.monotonic()
        tr.train(per_worker[w])
        secs[w] = time.monotonic() - t
        delta = [(a - b).contiguous() for a, b in zip(theta, tr.params(), strict=True)]
        res = arm.residual.get(w) or [torch.zeros(s) for s in tr.shapes]
        payload, arm.residual[w] = encode(delta, Codec(args.codec), res, args.topk_ppm)
        tr.set_residuals(arm.residual[w])
        arm.kept[w] = tr.opt_state()
        arm.payload = max(arm.payload, payload_bytes(payload))
        deltas.append((w, decode(payload, Codec(args.codec), tr.shapes)))
    res_o = outer_step(theta, arm.momentum, deltas, spec)
    arm.theta, arm.momentum = res_o.params, res_o.momentum
    arm.used += len(deltas)
    return secs


def run_seed_real(args, model_dir: Path, windows: torch.Tensor, held: torch.Tensor, seed: int) -> dict:
    """One seed on SmolLM2-135M LoRA: DiLoCo, DiLoCo with a straggler, one worker, data-parallel."""
    def trainer() -> InnerTrainer:
        return InnerTrainer(model_dir, "lora", REAL_RANK, REAL_TARGETS, args.lr, seed)

    tr, single, dp = trainer(), trainer(), trainer()
    theta0 = tr.params()
    base = tr.eval_loss(held)
    K = args.workers
    workers = sorted(H(b"tally/bench/worker", str(seed).encode(), str(k).encode()) for k in range(K))
    run_id = H(b"tally/bench/run", str(seed).encode())
    spec = OuterSpec(lr=args.outer_lr, momentum=args.outer_momentum, nesterov=not args.no_nesterov,
                     clip_mult=args.clip_mult)
    arm, slow = Arm([t.clone() for t in theta0]), Arm([t.clone() for t in theta0])
    F, quorum = args.straggler, args.quorum if args.quorum is not None else K - 1
    rounds, secs = [], {"diloco": 0.0, "straggler": 0.0, "single": 0.0, "dp": 0.0}
    for r in range(args.rounds):
        beacon = H(b"tally/bench/beacon", str(seed).encode(), str(r).encode())
        assignment = assign_round(beacon, run_id, r, workers, windows.shape[0], args.inner_steps, args.batch, 0)
        per_worker = {w: batch_tensors(windows, assignment[w]) for w in workers}
        t = time.monotonic()
        took_s = diloco_round(tr, arm, per_worker, workers, args, spec)
        secs["diloco"] += time.monotonic() - t
        times = [took_s[w] for w in workers]
        fair = finish_blocks(times)
        rec = {"times": times, "blocks_q": round_close(fair, quorum)[0], "blocks_all": round_close(fair, 0)[0]}
        if F > 1:
            slowed = finish_blocks([times[0] * F, *times[1:]])
            blocks, took = round_close(slowed, quorum)
            rec.update(slow_blocks_q=blocks, slow_blocks_all=round_close(slowed, 0)[0], slow_took=list(took))
            t = time.monotonic()
            diloco_round(tr, slow, per_worker, [workers[k] for k in took], args, spec)
            secs["straggler"] += time.monotonic() - t
        rounds.append(rec)
        t = time.monotonic()
        single.train(per_worker[workers[0]])  # one worker: worker 0's batches, R x H steps, state kept
        secs["single"] += time.monotonic() - t
        t = time.monotonic()
        dp.train([torch.cat([per_worker[w][i] for w in workers], 0) for i in range(args.inner_steps)])
        secs["dp"] += time.monotonic() - t
    out = {"seed": seed, "base": base, "single": single.eval_loss(held), "dp": dp.eval_loss(held), "rounds": rounds,
           "secs": secs, "payload": arm.payload, "grad": sum(t.numel() * 4 for t in theta0),
           "params": sum(t.numel() for t in theta0), "tensors": len(theta0), "held_tokens": int(held[:, 1:].numel()),
           "curve": {"diloco": [], "single": [], "dp": []}, "screened": 0, "passed": 0, "clipped": 0}
    tr.load_params(arm.theta)
    out["diloco"] = tr.eval_loss(held)
    if F > 1:
        tr.load_params(slow.theta)
        out["straggler"] = tr.eval_loss(held)
        out["straggler_used"] = slow.used
        out["used"] = arm.used
    return out


def wall_per_round(r: dict, key: str) -> float:
    """Mean seconds per round of ``key``'s block count over the seed's rounds (BLOCK_S-second blocks)."""
    return BLOCK_S * sum(x[key] for x in r["rounds"]) / len(r["rounds"])


def _spread(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.4f} ± {sd:.4f} [{min(xs):.4f} .. {max(xs):.4f}]"


def main_real(args, text: bytes) -> int:
    """``--model smollm2``: every figure of checks 1 and 2 of issue 40, per seed and over the seeds."""
    t0 = time.monotonic()
    K, R, Hs, F = args.workers, args.rounds, args.inner_steps, args.straggler
    quorum = args.quorum if args.quorum is not None else K - 1
    model_dir = ensure_smollm2(progress=False)
    train_ids, held_ids = split_tokens(encode_text(model_dir, text))
    windows, held = make_windows(train_ids, args.seq_len), make_windows(held_ids, args.seq_len)
    if args.eval_windows:  # evenly spaced over the held-out text, not only its beginning
        held = held[::max(1, held.shape[0] // args.eval_windows)][:args.eval_windows]
    print(f"training benchmark on SmolLM2-135M LoRA r={REAL_RANK} {'+'.join(REAL_TARGETS)} (issue 40): {K}-worker "
          f"DiLoCo, R={R} rounds of H={Hs} inner steps, batch {args.batch}x{args.seq_len} tokens, inner AdamW lr "
          f"{args.lr:g} (inner state: {args.inner_state}), outer lr {args.outer_lr:g} momentum "
          f"{args.outer_momentum:g} {'heavy-ball' if args.no_nesterov else 'Nesterov'}, clip {args.clip_mult:g}x "
          f"median, codec {args.codec} ({args.topk_ppm} ppm kept, error feedback); straggler run: worker 0 x{F:g}, "
          f"quorum {quorum}, {BLOCK_S} s blocks; text {args.text} ({len(text):,} bytes, {train_ids.numel():,} train "
          f"+ {held_ids.numel():,} held-out tokens, never trained on); {torch.get_num_threads()} threads", flush=True)
    results = []
    for s in range(args.first_seed, args.first_seed + args.seeds):
        ts = time.monotonic()
        r = run_seed_real(args, model_dir, windows, held, s)
        r["wall"] = time.monotonic() - ts
        results.append(r)
        print(_seed_line(r, F), flush=True)
    return _report(args, results, quorum, time.monotonic() - t0)


def _drop(r: dict, key: str) -> float:
    return (r["base"] - r[key]) / (r["base"] - r["dp"])


def _seed_line(r: dict, F: float) -> str:
    line = (f"seed {r['seed']}: held-out loss base {r['base']:.4f}  data-parallel {r['dp']:.4f}  one worker "
            f"{r['single']:.4f}  DiLoCo {r['diloco']:.4f}  | drops dp {r['base'] - r['dp']:.4f} one "
            f"{r['base'] - r['single']:.4f} DiLoCo {r['base'] - r['diloco']:.4f}  DiLoCo/dp {_drop(r, 'diloco'):.4f}  "
            f"one/dp {_drop(r, 'single'):.4f}  4 beat 1: {'yes' if r['diloco'] < r['single'] else 'no'}")
    if F > 1:
        line += (f"  | straggler x{F:g}: loss {r['straggler']:.4f} drop/dp {_drop(r, 'straggler'):.4f}, "
                 f"s/round {wall_per_round(r, 'slow_blocks_q'):.1f} vs {wall_per_round(r, 'blocks_q'):.1f} "
                 f"(ratio {wall_per_round(r, 'slow_blocks_q') / wall_per_round(r, 'blocks_q'):.3f}; "
                 f"no quorum {wall_per_round(r, 'slow_blocks_all'):.1f}), Δs used {r['straggler_used']}/{r['used']}")
    sec = r["secs"]
    return line + (f"  | compute s: DiLoCo {sec['diloco']:.0f} straggler run {sec['straggler']:.0f} one "
                   f"{sec['single']:.0f} dp {sec['dp']:.0f}; seed {r['wall']:.0f} s")


def _report(args, results: list[dict], quorum: int, wall: float) -> int:
    K, R, Hs, F = args.workers, args.rounds, args.inner_steps, args.straggler
    n, r0 = len(results), results[0]
    print(f"held-out loss, nats/token ({r0['held_tokens']:,} tokens; mean ± sd [min .. max] over {n} seeds):")
    print(f"  base model (LoRA B = 0)            {_spread([r['base'] for r in results])}")
    print(f"  (b) data-parallel {K}x batch, {R * Hs} steps {_spread([r['dp'] for r in results])}")
    print(f"  (a) one worker, {R * Hs} steps          {_spread([r['single'] for r in results])}")
    print(f"  {K}-worker DiLoCo, {R}x{Hs} steps       {_spread([r['diloco'] for r in results])}")
    frac = [_drop(r, "diloco") for r in results]
    beat = sum(r["diloco"] < r["single"] for r in results)
    dp_bytes = Hs * r0["grad"]
    ratio = r0["payload"] / dp_bytes
    print(f"bytes uploaded per worker per round ({args.codec}, {args.topk_ppm} ppm, {r0['tensors']} tensors, "
          f"{r0['params']:,} params): {r0['payload']:,}; data-parallel for the same {Hs} steps (fp32 gradients): "
          f"{Hs} x {r0['grad']:,} = {dp_bytes:,}")
    print(f"fraction of data-parallel's loss drop: {statistics.fmean(frac):.4f} (per seed "
          f"{', '.join(f'{f:.4f}' for f in frac)}; target >= 0.97)")
    print(f"bytes ratio to data-parallel: {ratio:.5f} (target <= 0.002)")
    print(f"4 workers beat one worker on {beat}/{n} seeds (target {n}/{n})")
    ok1 = min(frac) >= 0.97 and ratio <= 0.002 and beat == n
    print(f"check 1: {'met' if ok1 else 'NOT met'}")
    ok = ok1
    if F > 1:
        wr = [wall_per_round(r, "slow_blocks_q") / wall_per_round(r, "blocks_q") for r in results]
        sf = [_drop(r, "straggler") for r in results]
        wa = [wall_per_round(r, "slow_blocks_all") / wall_per_round(r, "blocks_q") for r in results]
        print(f"straggler (worker 0 x{F:g}, quorum {quorum}): wall per round ratio {statistics.fmean(wr):.3f} (per "
              f"seed {', '.join(f'{x:.3f}' for x in wr)}; target <= 1.2); without a quorum {statistics.fmean(wa):.3f}")
        print(f"straggler run's fraction of data-parallel's loss drop: {statistics.fmean(sf):.4f} (per seed "
              f"{', '.join(f'{x:.4f}' for x in sf)}; target >= 0.95)")
        ok2 = max(wr) <= 1.2 and min(sf) >= 0.95
        print(f"check 2: {'met' if ok2 else 'NOT met'}")
        ok = ok and ok2
    print(f"wall {wall:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v)
                                                  for k, v in vars(args).items()}, "seeds": results,
                                         "ratio": ratio, "fraction": frac, "met": ok}, indent=1) + "\n")
    return 0 if all(math.isfinite(r[k]) for r in results for k in ("diloco", "single", "dp")) else 1
