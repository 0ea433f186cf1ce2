"""The registry of models added with ``node model add``: ``<model cache>/registry.json``.

Each added model lives in ``<model cache>/<model id hex>/`` in the per-block format of :mod:`node.compute.model`
and has one entry here: its human name, id, architecture, sizes and where it came from. The file is
``{"version": 1, "models": [entry, ...]}``; it is rewritten whole (temp file, fsync, ``os.replace``) under the
lock file ``<model cache>/.registry.lock``, so a crash leaves either the old or the new registry, never a torn one.
The built-in models (``smollm2``, ``tiny``) are not in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REGISTRY = "registry.json"
LOCK = ".registry.lock"
BUILTIN = ("smollm2", "tiny")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]+$")
MIN_ID_PREFIX = 8  # hex digits: a shorter prefix of a model id is not accepted as a reference


class RegistryError(ValueError):
    """The registry file is unreadable, or a name/reference is invalid, taken or unknown."""


@dataclass(frozen=True)
class Entry:
    """One added model. ``model_id`` is hex (64 digits); ``dir`` is relative to the cache; ``bytes`` on disk."""

    name: str
    model_id: str
    dir: str
    model_type: str
    architecture: str
    num_blocks: int
    hidden_size: int
    vocab_size: int
    bytes: int
    source: str
    quantization: str | None = None  # "int8" for a copy made with --quantize int8 (node.models.quantize)


def check_name(name: str) -> str:
    """``name`` if usable as a model name: 1–64 of ``A-Z a-z 0-9 . _ -``, not starting with a punctuation mark,
    not a built-in name and not all hex digits of 8 or more (it would read as a model id).

    Raises:
        RegistryError: otherwise, saying why.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise RegistryError(f"model name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a "
                            "letter or digit")
    if name in BUILTIN:
        raise RegistryError(f"model name {name!r} is reserved for the built-in model")
    if len(name) >= MIN_ID_PREFIX and _HEX.match(name):
        raise RegistryError(f"model name {name!r} looks like a model id; choose a name with a non-hex letter")
    return name


def default_name(source: Path) -> str:
    """A model name derived from a checkpoint dir or GGUF file name (``Qwen2.5-0.5B``)."""
    stem = source.name if source.is_dir() else source.stem
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:64] or "model"
    if name in BUILTIN or (len(name) >= MIN_ID_PREFIX and _HEX.match(name)):
        name = f"m-{name}"[:64]
    return name


def load(cache: Path) -> list[Entry]:
    """Entries of ``cache/registry.json`` (empty when there is none).

    Raises:
        RegistryError: the file is not a registry (not JSON, wrong shape or fields).
    """
    path = Path(cache) / REGISTRY
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (ValueError, UnicodeDecodeError) as e:
        raise RegistryError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict) or raw.get("version") != 1 or not isinstance(raw.get("models"), list):
        raise RegistryError(f"{path} is not a Tally model registry (version 1)")
    out = []
    for i, item in enumerate(raw["models"]):
        try:
            out.append(Entry(**item))
        except TypeError as e:
            raise RegistryError(f"{path}: entry {i} is malformed: {e}") from None
    return out


def _write(cache: Path, entries: list[Entry]) -> None:
    body = json.dumps({"version": 1, "models": [asdict(e) for e in entries]}, indent=1) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".registry.tmp-", dir=cache)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, Path(cache) / REGISTRY)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    """Hold ``cache/.registry.lock`` (``fcntl.flock``, exclusive) for a read-modify-write of the registry."""
    Path(cache).mkdir(parents=True, exist_ok=True)
    with open(Path(cache) / LOCK, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def resolve(entries: list[Entry], ref: str) -> Entry:
    """The entry named ``ref``, or whose model id is ``ref`` or starts with it (at least 8 hex digits).

    Raises:
        RegistryError: no such model, or an id prefix that matches several.
    """
    for e in entries:
        if e.name == ref:
            return e
    low = ref.lower()
    if len(low) >= MIN_ID_PREFIX and _HEX.match(low):
        hits = [e for e in entries if e.model_id.startswith(low)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise RegistryError(f"model id prefix {ref} matches {len(hits)} models: "
                                f"{', '.join(e.name for e in hits)}; give more digits")
    known = ", ".join(e.name for e in entries) or "none"
    raise RegistryError(f"no added model named or with id {ref!r} (added models: {known}; built-in: "
                        f"{', '.join(BUILTIN)}); add one with: node model add PATH --name NAME")


def add(cache: Path, entry: Entry) -> None:
    """Append ``entry`` (caller holds :func:`locked`).

    Raises:
        RegistryError: the name is taken, or the same model id is already added (under its name).
    """
    entries = load(cache)
    for e in entries:
        if e.name == entry.name:
            raise RegistryError(f"a model named {entry.name!r} is already added (id {e.model_id[:16]}…); "
                                "remove it first or choose another --name")
        if e.model_id == entry.model_id:
            raise RegistryError(f"this model (id {e.model_id[:16]}…) is already added as {e.name!r}")
    _write(cache, [*entries, entry])


def remove(cache: Path, ref: str) -> Entry:
    """Drop the entry ``ref`` (name or id, see :func:`resolve`) and return it (caller holds :func:`locked`)."""
    entries = load(cache)
    e = resolve(entries, ref)
    _write(cache, [x for x in entries if x is not e])
    return e
