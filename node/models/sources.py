"""What ``node model add`` accepts, checked before anything is written: a Hugging Face checkpoint dir
(:class:`HFPlan`) or a GGUF file (:class:`GGUFPlan`), chosen by :func:`plan`; each plan then writes the model dir
(:mod:`node.compute.model`) into a dir the caller gives it (:mod:`node.models.convert` registers it).

A **checkpoint dir** holds ``config.json``, its tokenizer (``tokenizer.json`` or ``tokenizer.model``, with
``tokenizer_config.json``) and the weights as ``*.safetensors`` (one file, or shards listed by
``model.safetensors.index.json``). Conversion streams: each decoder block's tensors are read from the shards
(:func:`safetensors.safe_open`, nothing else), kept in the checkpoint's own precision (see ``--storage``), checked
against the shapes transformers' own decoder layer of that architecture expects (built on the ``meta`` device, no
allocation), checked finite, and written as ``block_NNN.safetensors``; then ``head.safetensors`` (embedding, final
norm, LM head — the embedding when ``tie_word_embeddings``). Memory stays around one block plus the head.

A **GGUF file** is streamed tensor by tensor (:mod:`node.models.ggufstream`): each tensor kept in its GGUF type
and dequantized at load, bit for bit as transformers' GGUF loader dequantizes it; its tokenizer comes from the
file. ``--storage`` (:class:`~node.models.ggufstream.Storage`) keeps a checkpoint's 16-bit tensors in 16 bits by
default, or stores everything as float32, or rounds it to bfloat16.

Refused (:class:`CheckpointError`), with nothing written: a pickled checkpoint (``pytorch_model.bin``, ``*.pt``,
``*.pth``, ``*.ckpt`` or a "safetensors" file that is really a zip/pickle — recognised by name and magic bytes and
never opened by a loader; there is no ``torch.load`` here), an architecture outside
:data:`node.compute.families.SUPPORTED`, a missing tokenizer, a truncated or corrupt safetensors file (bad header,
data not covering the header's offsets, a tensor of the wrong shape, missing or unexpected tensors, NaN/inf
weights), a quantized HF checkpoint (``quantization_config``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from node.compute.arch import architecture, check_model_type
from node.compute.ggufq import pack_float
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

from .ggufstream import GGUFConversionError, GGUFStream, Storage
from .progress import progress_iter

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
INDEX = "model.safetensors.index.json"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")  # old checkpoints stored this buffer; it is recomputed


class CheckpointError(ValueError):
    """The checkpoint cannot be added; the message says why and what to do. Nothing was written."""


class _Slice(Protocol):
    """A tensor of an open safetensors file, before it is read: its header's shape and dtype."""

    def get_shape(self) -> list[int]: ...

    def get_dtype(self) -> str: ...


class _Shard(Protocol):
    """An open safetensors file (:class:`safetensors.safe_open`, whose methods are unannotated)."""

    def keys(self) -> list[str]: ...

    def get_tensor(self, name: str) -> torch.Tensor: ...

    def get_slice(self, name: str) -> _Slice: ...


_Where = dict[str, tuple[_Shard, str]]  # tensor name -> (open file holding it, file name)


# ---------------------------------------------------------------- refusals

def _magic(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(8)


def _is_pickle_bytes(head: bytes) -> bool:
    """Zip (``torch.save`` since 1.6) or a raw pickle stream (protocol 2-5 opcode ``\\x80``)."""
    return head.startswith(b"PK\x03\x04") or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _pickles(src: Path) -> list[str]:
    return sorted(p.name for p in src.iterdir() if p.is_file() and p.name.lower().endswith(PICKLE_SUFFIXES))


def _refuse_pickle(what: str) -> CheckpointError:
    return CheckpointError(
        f"{what} is a pickled PyTorch checkpoint; Tally refuses pickles (loading one can run arbitrary code) and "
        "never opens it. Use the model's safetensors release, or convert it yourself in a sandbox you trust "
        "(e.g. transformers' save_pretrained(..., safe_serialization=True)) and add that directory")


# ---------------------------------------------------------------- HF checkpoint dirs

def _weight_files(src: Path) -> list[Path]:
    index = src / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index} is not a safetensors index (no weight_map)") from None
        missing = [f for f in files if not (src / f).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that are missing: {', '.join(missing[:5])}")
        return [src / f for f in files]
    files = sorted(src.glob("*.safetensors"))
    if not files:
        pickles = _pickles(src)
        if pickles:
            raise _refuse_pickle(f"{src}/{pickles[0]}")
        raise CheckpointError(f"{src} has no *.safetensors weights")
    return files


def _open_all(files: list[Path]) -> _Where:
    """``{tensor name: (open safetensors handle, file name)}``; raises CheckpointError for a bad file."""
    where: _Where = {}
    for path in files:
        if _is_pickle_bytes(_magic(path)):
            raise _refuse_pickle(str(path))
        try:
            handle: _Shard = safe_open(str(path), framework="pt")
            names = list(handle.keys())
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path} is not a valid safetensors file (truncated or corrupt?): {e}") from None
        for n in names:
            if n in where:
                raise CheckpointError(f"tensor {n} appears in both {where[n][1]} and {path.name}")
            where[n] = (handle, path.name)
    return where


def _read_raw(where: _Where, name: str) -> torch.Tensor:
    """Tensor ``name`` in its checkpoint dtype, checked finite."""
    handle, fname = where[name]
    try:
        t = handle.get_tensor(name)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{fname}: tensor {name} is unreadable (corrupt file?): {e}") from None
    if not torch.isfinite(t).all():
        raise CheckpointError(f"{fname}: tensor {name} holds NaN or inf values (corrupt file?)")
    return t


_SIXTEEN = {torch.bfloat16: "BF16", torch.float16: "F16"}


def _stored(where: _Where, key: str, name: str, storage: Storage) -> tuple[str, torch.Tensor]:
    """``(stored name, tensor)`` of checkpoint tensor ``name`` under block/head key ``key``, as ``storage`` keeps
    it (:class:`~node.models.ggufstream.Storage`): 16-bit tensors of rank ≥ 2 kept in their own type (``native``)
    or every rank ≥ 2 tensor rounded to bfloat16 (``bf16``), as GGUF F16/BF16 bytes that load back as float32
    (:func:`node.compute.ggufq.pack_float`); everything else float32."""
    t = _read_raw(where, name)
    if t.dim() >= 2:
        if storage is Storage.NATIVE and t.dtype in _SIXTEEN:
            return pack_float(key, t, _SIXTEEN[t.dtype])
        if storage is Storage.BF16:
            return pack_float(key, t, "BF16")
    return key, t.to(torch.float32).contiguous()


_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def _check_shapes(where: _Where, names: dict[str, str], want: dict[str, tuple[int, ...]], what: str) -> None:
    """``names`` maps the Tally key to the checkpoint key; shapes and dtypes come from the safetensors headers."""
    missing, extra = sorted(set(want) - set(names)), sorted(set(names) - set(want))
    if missing or extra:
        raise CheckpointError(f"{what}: tensors missing {missing[:4]} / unexpected {extra[:4]} for this "
                              "architecture (is config.json the checkpoint's own?)")
    for k, shape in want.items():
        handle, fname = where[names[k]]
        sl = handle.get_slice(names[k])
        got, dtype = tuple(sl.get_shape()), sl.get_dtype()
        if got != tuple(shape):
            raise CheckpointError(f"{what}: tensor {names[k]} in {fname} has shape {got}, the architecture "
                                  f"expects {tuple(shape)}")
        if dtype not in _FLOAT_DTYPES:
            raise CheckpointError(f"{what}: tensor {names[k]} in {fname} has dtype {dtype}; quantized or integer "
                                  "weights are not supported")


def load_hf_config(src: Path) -> PretrainedConfig:
    """The transformers config of checkpoint dir ``src``, checked: supported ``model_type``, not quantized.

    Raises:
        CheckpointError: no/invalid config.json, unsupported architecture, quantized checkpoint.
    """
    # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
    from transformers import AutoConfig

    path = src / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{src} has no config.json; not a Hugging Face checkpoint directory")
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    try:
        check_model_type(raw.get("model_type"))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    quant = raw.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise CheckpointError(f"{path} describes a quantized checkpoint ({method}); add the float release")
    try:
        cfg: PretrainedConfig = AutoConfig.from_pretrained(str(src), trust_remote_code=False)
    except (ValueError, OSError, TypeError, KeyError) as e:
        raise CheckpointError(f"{path}: transformers cannot read this config: {e}") from None
    return cfg


def load_tokenizer(src: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer (``AutoTokenizer``, no remote code).

    Raises:
        CheckpointError: no tokenizer files, or transformers cannot load them.
    """
    # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
    from transformers import AutoTokenizer

    if not any((src / f).is_file() for f in TOKENIZER_FILES):
        raise CheckpointError(f"{src} has no tokenizer (tokenizer.json or tokenizer.model): clients could not "
                              "turn text into tokens; copy the model's tokenizer files into the directory")
    try:
        tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(src), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 -- tokenizer back ends raise many types; all mean "cannot load"
        raise CheckpointError(f"{src}: the tokenizer cannot be loaded: {type(e).__name__}: {e}") from None
    return tok


class HFPlan:
    """A checked checkpoint dir, ready to write: every refusal that needs only headers happened in the
    constructor (config, architecture, tokenizer, safetensors headers, tensor names, shapes and dtypes), before
    anything is written anywhere.

    Raises (constructor):
        CheckpointError: see the module docstring.
    """

    def __init__(self, src: Path, span: range | None = None, storage: Storage = Storage.NATIVE):
        self.src, self.span, self.storage = src, span, storage
        self.cfg = cfg = load_hf_config(src)
        self.arch = architecture(cfg)
        files = _weight_files(src)
        self.tokenizer = load_tokenizer(src)
        self.where = where = _open_all(files)
        self.num_blocks = L = int(cfg.num_hidden_layers)
        _check_span(span, L)
        with torch.device("meta"):
            skeleton = self.arch.causal_cls(cfg)
        self.blocks: list[dict[str, str]] = [{} for _ in range(L)]
        top: dict[str, str] = {}
        for n in where:
            if _IGNORED.search(n):
                continue
            m = _LAYER.match(n)
            if m and int(m.group(1)) < L:
                self.blocks[int(m.group(1))][m.group(2)] = n
            else:
                top[n] = n
        allowed_top = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
        if set(top) - allowed_top:
            raise CheckpointError(f"unexpected tensors for a {self.arch.name} checkpoint with {L} layers: "
                                  f"{sorted(set(top) - allowed_top)[:4]}")
        self.tied = bool(getattr(cfg, "tie_word_embeddings", False))
        if not self.tied and "lm_head.weight" not in top:
            raise CheckpointError("the checkpoint lacks lm_head.weight and does not tie it to the embedding")
        self.head = {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
        if not self.tied:
            self.head["lm_head.weight"] = "lm_head.weight"
        want_head = {"embed_tokens.weight": skeleton.model.embed_tokens.weight.shape,
                     "norm.weight": skeleton.model.norm.weight.shape}
        if not self.tied:
            want_head["lm_head.weight"] = skeleton.lm_head.weight.shape
        _check_shapes(where, {k: v for k, v in self.head.items() if v in where}, want_head, "head")
        for i in range(L):
            want = {k: tuple(v.shape) for k, v in skeleton.model.layers[i].state_dict().items()}
            _check_shapes(where, self.blocks[i], want, f"block {i}")

    def write(self, out: Path, name: str, progress: bool = False) -> Manifest:
        """Write the model into the existing empty dir ``out``; returns its manifest.

        Raises:
            CheckpointError: a tensor is unreadable or not finite (the caller deletes ``out``).
        """
        _check_span(self.span, self.num_blocks)
        block_hashes = []
        for i in progress_iter(range(self.num_blocks), self.num_blocks, "converting blocks", progress):
            sd = dict(_stored(self.where, k, full, self.storage) for k, full in self.blocks[i].items())
            if self.span is None or i in self.span:  # every block is hashed: the model id is the whole model's
                save_file(sd, str(out / block_file(i)))
            block_hashes.append(tensors_hash(sd))
        head = dict(_stored(self.where, k, full, self.storage) for k, full in self.head.items())
        if self.tied:  # as before storage options existed (the model id of a float32 checkpoint is unchanged)
            for k in [k for k in head if k.startswith("embed_tokens.weight")]:
                head["lm_head.weight" + k[len("embed_tokens.weight"):]] = head[k].clone()
        save_file(head, str(out / HEAD_FILE))
        cfg = self.cfg
        cfg.dtype = torch.float32
        cfg.save_pretrained(str(out))
        self.tokenizer.save_pretrained(str(out))
        head_h, cfg_h = tensors_hash(head), config_hash(config_dict(out))
        manifest = Manifest(name=name, num_blocks=self.num_blocks, hidden_size=int(cfg.hidden_size),
                            vocab_size=int(cfg.vocab_size), max_length=int(cfg.max_position_embeddings),
                            block_hashes=tuple(block_hashes), head_hash=head_h, config_hash=cfg_h,
                            model_id=compute_model_id(head_h, block_hashes, cfg_h))
        (out / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")
        return manifest


def _check_span(span: range | None, num_blocks: int) -> None:
    """Raises CheckpointError when ``span`` (``--blocks A:B``) is not a non-empty range inside the model."""
    if span is not None and not (0 <= span.start < span.stop <= num_blocks):
        raise CheckpointError(f"--blocks {span.start}:{span.stop} is outside the model's {num_blocks} blocks "
                              f"(0:{num_blocks})")


# ---------------------------------------------------------------- GGUF files

class GGUFPlan:
    """A checked GGUF file (magic bytes, readable metadata, supported architecture); nothing written yet.

    Raises (constructor):
        CheckpointError: not a GGUF file, unreadable, or an unsupported architecture.
    """

    def __init__(self, path: Path, storage: Storage = Storage.NATIVE, span: range | None = None):
        # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
        from transformers import AutoConfig

        self.src, self.storage, self.span = path, storage, span
        if _magic(path)[:4] != b"GGUF":
            raise CheckpointError(f"{path} is not a GGUF file (no GGUF magic bytes)")
        try:
            self.cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
        except Exception as e:  # noqa: BLE001 -- the GGUF reader raises many types for bad files
            raise CheckpointError(f"{path}: transformers cannot read this GGUF file: {type(e).__name__}: {e}") \
                from None
        try:
            check_model_type(self.cfg.model_type)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        _check_span(span, int(self.cfg.num_hidden_layers))

    def write(self, out: Path, name: str, progress: bool = False) -> Manifest:
        """Stream the file into ``out`` tensor by tensor (:mod:`node.models.ggufstream`): each tensor kept in its
        GGUF type (or float32 with ``storage=float32``), only the blocks of ``span`` written when one is set.

        Raises:
            CheckpointError: a tensor is missing, misshapen or of a type Tally does not store, or transformers
                cannot read the file's tokenizer.
        """
        # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
        from transformers import AutoTokenizer

        path = self.src
        try:
            stream = GGUFStream(path, self.cfg)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
        except GGUFConversionError as e:
            raise CheckpointError(str(e)) from None
        except Exception as e:  # noqa: BLE001 -- the GGUF reader and tokenizer raise many types for bad files
            raise CheckpointError(f"{path}: cannot be read: {type(e).__name__}: {e}") from None
        _check_span(self.span, stream.num_blocks)
        if progress:
            what = "all blocks" if self.span is None else f"blocks {self.span.start}:{self.span.stop}"
            print(f"converting {path.name} ({path.stat().st_size / 1e6:.0f} MB), {what}, stored as "
                  f"{self.storage.value}", flush=True)
        try:
            return stream.write(out, name, tok, self.storage, self.span, wrap=lambda items: progress_iter(
                items, stream.num_blocks + 1, "converting blocks and head", progress))
        except GGUFConversionError as e:
            raise CheckpointError(str(e)) from None


def plan(source: Path, storage: Storage = Storage.NATIVE, span: range | None = None) -> HFPlan | GGUFPlan:
    """Check ``source`` (checkpoint dir or GGUF file) without writing anything. ``storage`` applies to a GGUF
    file (a checkpoint dir's blocks are float32); ``span`` limits the blocks written (all are hashed).

    Raises:
        CheckpointError: refused (pickle, unsupported architecture, no tokenizer, corrupt safetensors, ...).
        FileNotFoundError: ``source`` does not exist.
    """
    src = Path(source).expanduser()
    if not src.exists():
        raise FileNotFoundError(f"{src} does not exist")
    if src.is_dir():
        return HFPlan(src, span, storage)
    if src.name.lower().endswith(PICKLE_SUFFIXES) or _is_pickle_bytes(_magic(src)):
        raise _refuse_pickle(str(src))
    if src.suffix.lower() != ".gguf" and _magic(src)[:4] != b"GGUF":
        raise CheckpointError(f"{src} is neither a checkpoint directory nor a .gguf file")
    return GGUFPlan(src, storage, span)
