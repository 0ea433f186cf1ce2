"""Finding a model in the model cache by name or id, for a generate request that names another model than the
node's own (:meth:`node.runtime.Node.client_for`; the API answers :class:`UnknownModel` with 404)."""

from __future__ import annotations

from pathlib import Path

from ..compute.model import ManifestError, load_manifest
from .registry import MIN_ID_PREFIX, RegistryError


class UnknownModel(ValueError):
    """A generate request names a model whose head this node does not hold."""


def find_model_dir(ref: str, cache: Path) -> Path:
    """The model dir in ``cache`` for ``ref``: a model added with ``node model add`` (name or id, see
    :func:`node.models.registry.resolve`), else a converted built-in (``tiny-0``, ``smollm2-135m``; ``tiny`` and
    ``smollm2`` name those) whose manifest has that name or an id starting with ``ref`` (at least 8 hex digits).

    Raises:
        UnknownModel: no such model in ``cache`` (the message says how to add one).
    """
    # node.models.convert imports torch (about 2 s); the API's callers of this module catch UnknownModel without it
    # local: node.models.convert imports torch (~2 s); the CLI resolves model names without it
    from .convert import model_dir_of

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
