"""Weight-only int8 quantization of a Tally model dir (``node model add SOURCE --quantize int8``).

The scheme (symmetric, per output channel, after LLM.int8()), which tensors it applies to, and how a span loads
and runs an int8 block are :mod:`node.compute.int8`; this module writes the int8 copy of a float model dir.

A block file of an int8 model stores ``<module>.weight`` as int8 and ``<module>.weight_scale`` (float32,
``(out,)``) beside the float tensors; the block hashes of the manifest are of these stored tensors, so the
model id differs from the float model's. ``config.json`` gets ``"tally_quantization": "int8"`` (so the config
hash, hence the id, commits to it) and the manifest ``"quantization": "int8"``; :func:`node.compute.model.
load_manifest` checks that both agree.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Protocol

from safetensors.torch import save_file

from node.compute.int8 import CONFIG_KEY, INT8, QUANTIZATIONS, quantize_block
from node.compute.model import (
    HEAD_FILE,
    MANIFEST,
    Manifest,
    block_file,
    compute_model_id,
    config_dict,
    config_hash,
    load_checked,
    load_manifest,
    tensors_hash,
)

from .progress import progress_iter


def quantize_dir(src: Path, out: Path, name: str, progress: bool = False) -> Manifest:
    """Write the int8 copy of float model dir ``src`` into the existing empty dir ``out``; returns its manifest.

    Every block of ``src`` is checked against its manifest as it is read; the head, tokenizer and other files are
    copied unchanged; ``config.json`` gains ``tally_quantization``; ``manifest.json`` is written last.

    Raises:
        ValueError: ``src`` is already quantized, or a file of ``src`` does not match its manifest.
        FileNotFoundError: a file of ``src`` is missing.
    """
    src, out = Path(src), Path(out)
    m = load_manifest(src)
    if m.quantization is not None:
        raise ValueError(f"{src} is already quantized ({m.quantization})")
    t0 = time.monotonic()
    skip = {MANIFEST, "config.json", HEAD_FILE} | {block_file(i) for i in range(m.num_blocks)}
    for p in src.iterdir():  # tokenizer files and the like
        if p.is_file() and p.name not in skip:
            shutil.copyfile(p, out / p.name)
    load_checked(src, HEAD_FILE, m.head_hash, "head")
    shutil.copyfile(src / HEAD_FILE, out / HEAD_FILE)
    cfg = config_dict(src)
    cfg[CONFIG_KEY] = INT8
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    hashes = []
    for i in progress_iter(range(m.num_blocks), m.num_blocks, "quantizing blocks", progress):
        q = quantize_block(load_checked(src, block_file(i), m.block_hashes[i], f"block {i}"))
        save_file(q, str(out / block_file(i)))
        hashes.append(tensors_hash(q))
    cfg_h = config_hash(config_dict(out))
    qm = Manifest(name=name, num_blocks=m.num_blocks, hidden_size=m.hidden_size, vocab_size=m.vocab_size,
                  max_length=m.max_length, block_hashes=tuple(hashes), head_hash=m.head_hash, config_hash=cfg_h,
                  model_id=compute_model_id(m.head_hash, hashes, cfg_h), quantization=INT8)
    (out / MANIFEST).write_text(json.dumps(qm.to_json(), indent=1) + "\n")
    if progress:
        print(f"quantized {m.num_blocks} blocks to int8 in {time.monotonic() - t0:.1f} s", flush=True)
    return qm


class FloatPlan(Protocol):
    """What :class:`QuantizePlan` needs of a checked source (:class:`~node.models.checkpoint.HFPlan`,
    :class:`~node.models.checkpoint.GGUFPlan`): writing the float model into a dir."""

    def write(self, out: Path, name: str, progress: bool = False) -> Manifest: ...


class QuantizePlan:
    """Makes the int8 copy of a source: ``inner`` (a checked :mod:`node.models.sources` plan, written to a temp
    float dir first) or ``model_dir`` (an already converted float model dir). Same ``write`` as the other plans."""

    def __init__(self, quantization: str, inner: FloatPlan | None = None, model_dir: Path | None = None):
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantization!r}; expected one of {QUANTIZATIONS}")
        if (inner is None) == (model_dir is None):
            raise ValueError("QuantizePlan needs exactly one of inner and model_dir")
        if model_dir is not None and load_manifest(model_dir).quantization is not None:
            raise ValueError(f"{model_dir} is already quantized")
        self.quantization, self.inner, self.model_dir = quantization, inner, model_dir

    def write(self, out: Path, name: str, progress: bool = False) -> Manifest:
        if self.model_dir is not None:
            return quantize_dir(self.model_dir, out, name, progress)

        assert self.inner is not None  # exactly one of inner and model_dir (checked in the constructor)
        tmp = Path(tempfile.mkdtemp(prefix=".add-tmp-float-", dir=Path(out).parent))
        try:
            self.inner.write(tmp, name, progress)
            return quantize_dir(tmp, out, name, progress)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
