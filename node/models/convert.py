"""``node model add|list|remove`` on the model cache: a checked source (:mod:`node.models.sources`: a Hugging Face
checkpoint dir or a GGUF file, or :mod:`node.models.quantize`'s int8 copy) converted once into the per-block format
(:mod:`node.compute.model`) and registered by name (:mod:`node.models.registry`); a fetched model dir registered
(:func:`register_dir`); the added models listed and removed.

Everything is written into a temp dir ``<cache>/.add-tmp-*`` and renamed to ``<cache>/<model id hex>/`` only
when complete; the registry entry (:mod:`node.models.registry`) is added after that, under its lock.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from node.compute.families import SUPPORTED
from node.compute.model import Manifest, config_dict, default_cache_dir, ensure_smollm2, load_manifest, make_tiny

from . import registry
from .ggufstream import Storage
from .lookup import model_dir_of
from .quantize import QuantizePlan
from .sources import CheckpointError, GGUFPlan, HFPlan, plan


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def _clean_stale(cache: Path) -> None:
    for stale in [*cache.glob(".add-tmp-*"), *cache.glob(".trash-*")]:  # from a killed process; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)


def add_model(source: Path, cache_dir: Path | None = None, name: str | None = None,
              progress: bool = False, quantize: str | None = None, storage: Storage = Storage.NATIVE,
              span: range | None = None) -> registry.Entry:
    """Convert ``source`` (checkpoint dir or ``.gguf`` file) into ``cache_dir`` and register it as ``name``.

    ``name`` defaults to the dir / file name (:func:`node.models.registry.default_name`). Holds the registry
    lock for the whole conversion (one ``add``/``remove`` at a time per cache). Returns the new entry.

    ``storage`` is how tensors are kept (:class:`~node.models.ggufstream.Storage`: a GGUF file's in their GGUF types and
    a checkpoint's 16-bit tensors in 16 bits by default, or float32, or bfloat16); ``span`` (``--blocks A:B``)
    writes only those blocks and the head, for a server of that span.

    ``quantize="int8"`` registers only the int8 copy (:mod:`node.models.quantize`; default name ``<name>-int8``).
    With it ``source`` may also be an added model's name or id, or the built-in ``smollm2`` / ``tiny``, when no
    file or dir of that name exists: the copy is made from its converted float dir.

    Raises:
        node.models.sources.CheckpointError: the checkpoint is refused (see :mod:`node.models.sources`).
        node.models.registry.RegistryError: bad or taken name, model already added, unreadable registry.
        FileNotFoundError: ``source`` does not exist.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    src = Path(source).expanduser()
    added_dir = _quantize_source(str(source), cache) if quantize is not None and not src.exists() else None
    if name is None:
        name = registry.default_name(src) if added_dir is None else added_dir[1]
        name = f"{name}-{quantize}"[:64] if quantize is not None else name
    name = registry.check_name(name)
    if any(e.name == name for e in registry.load(cache)):  # checked again under the lock below
        raise registry.RegistryError(f"a model named {name!r} is already added; remove it first or choose "
                                     "another --name")
    # every refusal that needs no writing happens here, before the cache is touched
    if span is not None and quantize is not None:
        raise CheckpointError("--blocks and --quantize cannot be combined: quantize a whole added model")
    inner = plan(src, storage, span) if added_dir is None else None
    checked: HFPlan | GGUFPlan | QuantizePlan
    if quantize is not None:
        try:
            checked = QuantizePlan(quantize, inner=inner, model_dir=added_dir[0] if added_dir else None)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    else:
        assert inner is not None  # added_dir is set only to quantize
        checked = inner
    cache.mkdir(parents=True, exist_ok=True)
    with registry.locked(cache):
        entries = registry.load(cache)
        if any(e.name == name for e in entries):
            raise registry.RegistryError(f"a model named {name!r} is already added; remove it first or choose "
                                         "another --name")
        _clean_stale(cache)
        tmp = Path(tempfile.mkdtemp(prefix=".add-tmp-", dir=cache))
        try:
            manifest = checked.write(tmp, name, progress)
            mid = manifest.model_id.hex()
            target = cache / mid
            entry = _entry(manifest, tmp, name,
                           str(src.resolve()) if added_dir is None else str(added_dir[0]))
            for other in entries:
                if other.model_id == mid:
                    raise registry.RegistryError(f"this model (id {mid[:16]}…) is already added as {other.name!r}")
            if target.exists():  # converted before but never registered (a crash in between): replace it
                shutil.rmtree(target)
            os.chmod(tmp, 0o755)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _add_or_remove(cache, entry, target)
    return entry


def _add_or_remove(cache: Path, entry: registry.Entry, target: Path) -> None:
    """Register ``entry`` (the caller holds the registry lock); on any failure delete its dir ``target``, so that no
    unregistered model dir is left behind. Raises what :func:`node.models.registry.add` raises."""
    try:
        registry.add(cache, entry)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _entry(manifest: Manifest, d: Path, name: str, source: str) -> registry.Entry:
    """The registry entry of the model dir ``d`` (its manifest ``manifest``) registered as ``name``."""
    cfg, mid = config_dict(d), manifest.model_id.hex()
    return registry.Entry(name=name, model_id=mid, dir=mid, model_type=cfg["model_type"],
                          architecture=SUPPORTED[cfg["model_type"]], num_blocks=manifest.num_blocks,
                          hidden_size=manifest.hidden_size, vocab_size=manifest.vocab_size, bytes=_dir_bytes(d),
                          source=source, quantization=manifest.quantization)


def register_dir(src: Path, cache_dir: Path, name: str, source: str) -> registry.Entry:
    """Move the model dir ``src`` (a manifest, its config and some or all of its blocks, e.g. fetched from peers:
    :mod:`node.verify.modelfetch`) into ``cache_dir`` as ``<model id hex>/`` and register it as ``name``. A dir of
    the same model already there is replaced only when it is not registered.

    Raises:
        node.models.registry.RegistryError: bad or taken name, or the model is already added.
        node.compute.model.ManifestError, FileNotFoundError: ``src`` holds no consistent manifest and config.
    """
    manifest = load_manifest(src)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    name = registry.check_name(name)
    with registry.locked(cache):
        entries = registry.load(cache)
        mid = manifest.model_id.hex()
        for other in entries:
            if other.name == name:
                raise registry.RegistryError(f"a model named {name!r} is already added; remove it first or choose "
                                             "another --name")
            if other.model_id == mid:
                raise registry.RegistryError(f"this model (id {mid[:16]}…) is already added as {other.name!r}")
        entry = _entry(manifest, src, name, source)
        target = cache / mid
        if target.exists():  # a dir of this model nobody registered (a crash in between): replace it
            shutil.rmtree(target)
        shutil.move(str(src), str(target))
        _add_or_remove(cache, entry, target)
    return entry


def _quantize_source(ref: str, cache: Path) -> tuple[Path, str]:
    """``(float model dir, name)`` of added model or built-in ``ref`` (converted first when built-in).

    Raises:
        node.models.registry.RegistryError: no such file, dir or model.
    """
    if ref == "smollm2":
        return ensure_smollm2(cache, progress=True), "smollm2"
    if ref == "tiny":
        return make_tiny(cache), "tiny"
    try:
        return model_dir_of(ref, cache), registry.resolve(registry.load(cache), ref).name
    except registry.RegistryError as e:
        raise registry.RegistryError(f"{ref} is neither a file or directory nor an added model: {e}") from None


def list_models(cache_dir: Path | None = None) -> list[registry.Entry]:
    """The added models of ``cache_dir`` in the order they were added."""
    return registry.load(Path(cache_dir) if cache_dir is not None else default_cache_dir())


def remove_model(ref: str, cache_dir: Path | None = None) -> registry.Entry:
    """Unregister model ``ref`` (name or id) and delete its dir; returns the removed entry.

    The registry entry goes first (atomic), then the dir is renamed to ``.trash-*`` and deleted, so a crash never
    leaves a registered model with missing files.

    Raises:
        node.models.registry.RegistryError: unknown name/id.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    with registry.locked(cache):
        entry = registry.remove(cache, ref)
        d = cache / entry.dir
        if d.exists():
            trash = cache / f".trash-{entry.dir}"
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(d, trash)
            shutil.rmtree(trash, ignore_errors=True)
    return entry
