"""Child process of tests/training/test_replay_threads.py: produce round receipts at one torch thread count, or
replay them at another. Tensors travel between the two as safetensors files (never pickle).

Usage: python -m tests.training.replay_proc produce|replay THREADS DIR N_BEACONS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from node.compute.model import make_tiny
from node.encoding import H, commitments_root
from node.ledger.core.runtx import RunPost
from node.ledger.core.tx import VALID
from node.training import rounds as rd
from node.training.assign import batch_tensors

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md").read_bytes()
WORKERS = [bytes([i]) * 32 for i in (1, 2, 3, 4)]


def _post() -> RunPost:
    return RunPost("tally-test", b"s" * 32, b"t" * 16, "t", b"m" * 32, b"d" * 32, "lora", 4, "q_proj,v_proj", 5,
                   b"\x01" * 32, 10_000, 2, 16, 4, "keep", 0, 3, 3, 4, 1_000_000, 0, 1, 2_000_000, "int8", 0, 1, 1,
                   0, 10, 100, 0)


def _pack(prefix: str, ts: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{i}": t.contiguous() for i, t in enumerate(ts)}


def _unpack(d: dict[str, torch.Tensor], prefix: str) -> list[torch.Tensor]:
    n = sum(1 for k in d if k.startswith(prefix + "."))
    return [d[f"{prefix}.{i}"] for i in range(n)]


def main(mode: str, threads: int, out: Path, n_beacons: int) -> None:
    torch.set_num_threads(threads)
    model = make_tiny(out / "models", seed=0)
    p = _post()
    trainer = rd.make_trainer(model, p)
    windows = rd.run_windows(model, p, TEXT)
    theta = trainer.params()
    report = {"n": 0, "invalid": 0, "max_distance": 0.0}
    for b in range(n_beacons):
        beacon = H(b"beacon", b.to_bytes(4, "big"))
        for w in WORKERS:
            a = rd.assignment(p, beacon, 0, WORKERS, windows.shape[0], w)
            batches = batch_tensors(windows, a)
            path = out / f"r{b}-{w[0]}.safetensors"
            opt0 = rd.zero_opt(trainer)
            if mode == "produce":
                work = rd.train_round(trainer, p, theta, opt0, batches)
                save_file({**_pack("opt_before", opt0), **_pack("params_after", work.params_after),
                           **_pack("opt_after", work.opt_after), **_pack("payload", work.payload),
                           "delta_bytes": torch.tensor([work.delta_bytes])}, str(path))
                continue
            d = load_file(str(path))
            verdict, dist, _why = rd.replay_round(
                trainer, p, theta, _unpack(d, "opt_before"), rd.zero_opt(trainer), batches,
                commitments_root(batches), _unpack(d, "params_after"), _unpack(d, "opt_after"),
                _unpack(d, "payload"), int(d["delta_bytes"].item()))
            report["n"] += 1
            report["invalid"] += verdict != VALID
            report["max_distance"] = max(report["max_distance"], dist)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
