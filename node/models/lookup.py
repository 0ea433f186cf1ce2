"""Finding a model in the model cache by name or id: an added model's dir (:func:`model_dir_of`, for ``--model``), and
any model's for a generate request that names another model than the node's own
(:meth:`node.runtime.Node.client_for`; the API answers :class:`UnknownModel` with 404). No torch: ``node start``
resolves its ``--model`` with it."""

from __future__ import annotations

from pathlib import Path

from ..compute.model import ManifestError, default_cache_dir, load_manifest
from . import registry
from .registry import MIN_ID_PREFIX, RegistryError


class UnknownModel(ValueError):
    """A generate request names a model whose head this node does not hold."""


def model_dir_of(ref: str, cache_dir: Path | None = None) -> Path:
    """The model dir of added model ``ref`` (name or id), checked to hold a manifest.

    Raises:
        node.models.registry.RegistryError: unknown name/id.  FileNotFoundError / ManifestError: its dir is gone
            or damaged.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = registry.resolve(registry.load(cache), ref)
    d = cache / entry.dir
    load_manifest(d)
    return d


def find_model_dir(ref: str, cache: Path) -> Path:
    """The model dir in ``cache`` for ``ref``: a model added with ``node model add`` (name or id, see
    :func:`node.models.registry.resolve`), else a converted built-in (``tiny-0``, ``smollm2-135m``; ``tiny`` and
    ``smollm2`` name those) whose manifest has that name or an id starting with ``ref`` (at least 8 hex digits).

    Raises:
        UnknownModel: no such model in ``cache`` (the message says how to add one).
    """
    try:
        return model_dir_of(ref, cache)
    except (RegistryError, ManifestError, FileNotFoundError):
        pass
    want = {"tiny": "tiny-0", "smollm2": "smollm2-135m"}.get(ref, ref)
    low = ref.lower()
    hits = []
    for d in sorted(Path(cache).glob("*/manifest.json")) if Path(cache).is_dir() else []:
        try:
            m = load_manifest(d.parent)
        except (ManifestError, OSError):
            continue
        if m.name == want or (len(low) >= MIN_ID_PREFIX and m.model_id.hex().startswith(low)):
            hits.append(d.parent)
    if len(hits) == 1:
        return hits[0]
    raise UnknownModel(f"model {ref!r}: " + (f"{len(hits)} models in {cache} match; give the full id" if hits else
                       f"not in the model cache {cache}; this node can generate only for a model whose head and "
                       "tokenizer it holds: add it with 'node model add PATH --name NAME' (same --model-cache)"))
