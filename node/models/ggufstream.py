"""Streaming GGUF conversion: one tensor at a time, each block written as soon as its tensors are read (issue 36).

transformers' GGUF loader dequantizes the whole file into one float32 model (1.5× the float32 size at peak: a
1.04 GiB Q4_K_M file took 9.9 GiB). Here the file is memory-mapped (``gguf.GGUFReader``: nothing is read until a
tensor's bytes are touched) and each tensor is handled once, in file order:

- its GGUF name maps to the transformers name by transformers' own table (``get_gguf_hf_weights_map`` over the
  architecture's model built on the ``meta`` device: no allocation), its shape is checked against that model;
- a quantized or 16-bit tensor is **kept as GGUF bytes** (:mod:`node.compute.ggufq`: dequantized at load), unless
  ``float32`` or ``bf16`` storage is asked for (then it is dequantized here, and with ``bf16`` rounded to bfloat16
  and kept as GGUF BF16 bytes); transformers' per-architecture fix-up of a tensor (``TENSOR_PROCESSORS``: the
  row order of Llama's q/k projections) is applied to the kept rows when it is a permutation of rows, found by
  running the fix-up on the row indices; any other fix-up (Gemma's ``norm - 1``) dequantizes that tensor here;
- a block's file is written, hashed and dropped as soon as its last tensor is read.

Tensors are read with ``pread``, not through the reader's memory map, whose touched pages would count in the
process's RSS. Peak memory is the head (kept until the end: the embedding comes first in llama.cpp's files, the
final norm and LM head last) plus about two blocks as stored. ``span=range(a, b)`` writes only those blocks (a
server's span) but still hashes every block as stored, so the manifest and model id are the whole model's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from node.compute.arch import architecture
from node.compute.ggufq import TYPES, pack_float, stored_name
from node.compute.model import (
    HEAD_FILE,
    MANIFEST,
    Manifest,
    block_file,
    compute_model_id,
    config_dict,
    config_hash,
    tensors_hash,
)

_HEAD_NAMES = {"model.embed_tokens.weight": "embed_tokens.weight", "model.norm.weight": "norm.weight",
               "lm_head.weight": "lm_head.weight"}


class Storage(str, Enum):
    """How a converted model stores its block and head tensors (``node model add --storage``)."""

    # a GGUF file's tensors in their own GGUF types, dequantized at load (disk about the GGUF's size); a checkpoint
    # dir's in their own dtype (16-bit floats kept in 16 bits, read back exactly; float64 stored as float32)
    NATIVE = "native"
    FLOAT32 = "float32"  # dequantized / cast once, here (disk about 4 bytes per parameter)
    # every tensor of rank >= 2 rounded to bfloat16 (2 bytes per parameter), norms float32; read back as float32
    BF16 = "bf16"


class GGUFConversionError(ValueError):
    """The GGUF file cannot be converted; the message says why. The caller removes what was written."""


@dataclass(frozen=True)
class _Tensor:
    gguf_name: str
    hf_name: str
    block: int | None  # None: a head tensor
    key: str  # the name inside its block or head file, before any GGUF type suffix


def _row_permutation(process: Callable[[np.ndarray, str], np.ndarray], name: str, rows: int) -> np.ndarray | None:
    """The row order transformers' fix-up gives tensor ``name`` of ``rows`` rows, or None when the fix-up is not a
    pure permutation of rows (so the tensor must be dequantized before it is applied)."""
    idx = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    try:
        out = process(idx, name)
    except (ValueError, TypeError):  # a fix-up that needs the real shape (e.g. heads over columns)
        return None
    if out.shape != idx.shape:
        return None
    order = out.reshape(rows)
    if not np.array_equal(np.sort(order), idx.reshape(rows)):
        return None
    return order.astype(np.int64)


class GGUFStream:
    """A GGUF file checked against its architecture, to be written block by block (see the module docstring).

    Args:
        path: the ``.gguf`` file.  cfg: its transformers config (``AutoConfig.from_pretrained(gguf_file=...)``).

    Raises (constructor):
        GGUFConversionError: a tensor has no transformers name or the wrong shape, one is missing, or its type is
            one Tally does not store.
    """

    def __init__(self, path: Path, cfg: Any):
        # local: transformers' GGUF helpers import its GGUF integration; only `node model add X.gguf` needs them
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
            load_gguf_checkpoint,
        )

        self.path, self.cfg = Path(path), cfg
        self.reader = GGUFReader(str(path), "r")
        # transformers leaves its GGUF helpers unannotated
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # type: ignore[no-untyped-call]
        gguf_arch = str(self.reader.fields["general.architecture"].contents())
        processor = TENSOR_PROCESSORS.get(gguf_arch, TensorProcessor)(config=parsed["config"])  # type: ignore[no-untyped-call]  # likewise

        def process(w: np.ndarray, n: str) -> np.ndarray:
            done = processor.process(weights=w, name=n, tensor_key_mapping={},  # type: ignore[no-untyped-call]  # likewise
                                     parsed_parameters={"tensors": {}})
            out: np.ndarray = done.weights
            return out

        self._process: Callable[[np.ndarray, str], np.ndarray] = process
        with torch.device("meta"):
            skeleton = architecture(cfg).causal_cls(cfg)
        name_map = get_gguf_hf_weights_map(skeleton, processor)
        want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
        self.num_blocks = int(cfg.num_hidden_layers)
        self.tied = bool(getattr(cfg, "tie_word_embeddings", False))
        self.tensors: list[_Tensor] = []
        seen: set[str] = set()
        for t in self.reader.tensors:
            hf = name_map.get(t.name)
            if hf is None:
                continue  # transformers ignores it too (e.g. rope_freqs, recomputed)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if hf not in want or want[hf] != shape:
                raise GGUFConversionError(f"{path.name}: tensor {t.name} ({hf}) has shape {shape}, the "
                                          f"{cfg.model_type} config expects {want.get(hf)}")
            type_name = t.tensor_type.name
            if type_name != "F32" and type_name not in TYPES:
                raise GGUFConversionError(f"{path.name}: tensor {t.name} is {type_name}, a GGUF type Tally does "
                                          f"not store (supported: F32, {', '.join(TYPES)})")
            parts = hf.split(".")
            if hf.startswith("model.layers."):
                block, key = int(parts[2]), ".".join(parts[3:])
            elif hf in _HEAD_NAMES:
                block, key = None, _HEAD_NAMES[hf]
            else:
                raise GGUFConversionError(f"{path.name}: tensor {t.name} ({hf}) is neither in a block nor the head")
            self.tensors.append(_Tensor(t.name, hf, block, key))
            seen.add(hf)
        missing = sorted(k for k in want if k not in seen and not (self.tied and k == "lm_head.weight"))
        if missing:
            raise GGUFConversionError(f"{path.name} lacks {len(missing)} tensors, e.g. {', '.join(missing[:3])}")
        self._by_name = {t.name: t for t in self.reader.tensors}
        self.per_block = [sum(1 for t in self.tensors if t.block == i) for i in range(self.num_blocks)]

    def _stored(self, tensor: _Tensor, storage: Storage) -> tuple[str, torch.Tensor]:
        """``(stored name, tensor)`` of one GGUF tensor, per the module docstring."""
        from gguf import dequantize  # local: see __init__

        t = self._by_name[tensor.gguf_name]
        type_name = t.tensor_type.name
        # read with pread, not through the reader's memory map: mapped pages would stay in this process's RSS
        with open(self.path, "rb") as f:
            buf = os.pread(f.fileno(), int(t.n_bytes), int(t.data_offset))
        if len(buf) != int(t.n_bytes):
            raise GGUFConversionError(f"{self.path.name}: tensor {t.name} is cut short ({len(buf)} of "
                                      f"{int(t.n_bytes)} bytes)")
        shape: tuple[int, ...] = tuple(int(d) for d in t.data.shape)
        data = np.frombuffer(buf, dtype=t.data.dtype).reshape(shape)
        if type_name != "F32" and storage is Storage.NATIVE and len(shape) >= 2:
            rows = shape[0]
            order = _row_permutation(self._process, tensor.gguf_name, rows)
            if order is not None:
                raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)[order]
                return stored_name(tensor.key, type_name), torch.from_numpy(np.ascontiguousarray(raw))
        floats = dequantize(data, t.tensor_type)
        floats = self._process(floats, tensor.gguf_name)
        value = torch.from_numpy(np.array(floats, dtype=np.float32, copy=True))
        if storage is Storage.BF16 and value.dim() >= 2:
            return pack_float(tensor.key, value, "BF16")
        return tensor.key, value

    def blocks(self, storage: Storage) -> Iterator[tuple[int | None, dict[str, torch.Tensor]]]:
        """``(block index, {stored name: tensor})`` for every block as soon as it is whole, then ``(None, head)``."""
        pending: dict[int, dict[str, torch.Tensor]] = {}
        head: dict[str, torch.Tensor] = {}
        for tensor in self.tensors:
            name, value = self._stored(tensor, storage)
            if tensor.block is None:
                head[name] = value
                continue
            sd = pending.setdefault(tensor.block, {})
            sd[name] = value
            if len(sd) == self.per_block[tensor.block]:
                yield tensor.block, pending.pop(tensor.block)
        yield None, head

    def write(self, out: Path, name: str, tokenizer: Any, storage: Storage = Storage.NATIVE,
              span: range | None = None,
              wrap: Callable[[Iterable[Any]], Iterable[Any]] | None = None) -> Manifest:
        """Write the model (or only the blocks in ``span`` and the head) into the empty dir ``out``.

        ``wrap`` wraps the iterator of finished blocks (a progress bar). Returns the manifest of the whole model.

        Raises:
            GGUFConversionError: the file ends before a block is whole.
        """
        hashes: dict[int, bytes] = {}
        head: dict[str, torch.Tensor] = {}
        items: Iterable[tuple[int | None, dict[str, torch.Tensor]]] = self.blocks(storage)
        for index, sd in (wrap(items) if wrap is not None else items):
            if index is None:
                head = sd
                continue
            hashes[index] = tensors_hash(sd)
            if span is None or index in span:
                save_file(sd, str(out / block_file(index)))
        if len(hashes) != self.num_blocks:
            raise GGUFConversionError(f"{self.path.name}: only {len(hashes)} of {self.num_blocks} blocks are whole")
        save_file(head, str(out / HEAD_FILE))  # a tied LM head is the embedding: stored once (load_head)
        cfg = self.cfg
        cfg.dtype = torch.float32
        cfg.save_pretrained(str(out))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(out))
        block_hashes = [hashes[i] for i in range(self.num_blocks)]
        head_h, cfg_h = tensors_hash(head), config_hash(config_dict(out))
        manifest = Manifest(name=name, num_blocks=self.num_blocks, hidden_size=int(cfg.hidden_size),
                            vocab_size=int(cfg.vocab_size), max_length=int(cfg.max_position_embeddings),
                            block_hashes=tuple(block_hashes), head_hash=head_h, config_hash=cfg_h,
                            model_id=compute_model_id(head_h, block_hashes, cfg_h))
        (out / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")
        return manifest
