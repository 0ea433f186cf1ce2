"""The JSONL item file of a batch job, its ``items_root``, and the content store of item files and result bytes.

One item per line, UTF-8 JSON objects, in file order (the item index is the 0-based line number; blank lines are
refused rather than skipped, so the index a user sees in an editor is the index on the ledger):

- ``generate``: ``{"prompt": str}`` or ``{"prompt_ids": [int, ...]}`` (the number of new tokens, ``T``, is the
  post's ``max_tokens``);
- ``score``: ``{"text": str}``.

The ledger commits to the file by :func:`node.ledger.core.batchtx.items_root` over the lines' bytes (without the
newline); a fetched file is checked against that root before any line is used. Result bytes are addressed by
:func:`result_hash`. Both live as files under ``<data dir>/batch/store/`` (temp file + rename: a crash leaves the
old file or the new one, never half of one).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..encoding import H
from ..ledger.core.batchtx import GENERATE, MAX_ITEMS, SCORE, TASK_KINDS, items_root

MAX_FILE_BYTES = 32 << 20  # an item file is at most 32 MiB (it travels in one libp2p message)
MAX_LINE_BYTES = 64 << 10  # one item line is at most 64 KiB
MAX_PROMPT_IDS = 8192


class ItemsError(ValueError):
    """An item file that cannot be posted; the message names the line (1-based) and what is wrong with it."""


@dataclass(frozen=True)
class ItemFile:
    """A parsed, checked item file: ``lines`` (each line's bytes without its newline) and ``items`` (the decoded
    objects, one per line); ``root`` is the ``items_root`` a :class:`BatchPost` carries."""

    kind: str
    lines: tuple[bytes, ...]
    items: tuple[dict, ...]

    @property
    def root(self) -> bytes:
        return items_root(self.lines)

    def data(self) -> bytes:
        """The file's bytes as stored and served: the lines joined by ``\\n``, with a final newline."""
        return b"".join(line + b"\n" for line in self.lines)


def _check_item(obj, kind: str, n: int) -> dict:
    if not isinstance(obj, dict):
        raise ItemsError(f"line {n}: an item is a JSON object, got {type(obj).__name__}")
    if kind == GENERATE:
        keys = set(obj) & {"prompt", "prompt_ids"}
        if len(keys) != 1:
            raise ItemsError(f'line {n}: a generate item has exactly one of "prompt" (text) or "prompt_ids"')
        if "prompt" in obj:
            if not isinstance(obj["prompt"], str) or not obj["prompt"]:
                raise ItemsError(f'line {n}: "prompt" must be a non-empty string')
        else:
            ids = obj["prompt_ids"]
            if (not isinstance(ids, list) or not ids or len(ids) > MAX_PROMPT_IDS
                    or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
                raise ItemsError(f'line {n}: "prompt_ids" must be a list of 1..{MAX_PROMPT_IDS} non-negative ints')
    else:
        if not isinstance(obj.get("text"), str) or not obj["text"]:
            raise ItemsError(f'line {n}: a score item is {{"text": "..."}} with a non-empty string')
    return obj


def parse_items(data: bytes, kind: str, max_items: int = MAX_ITEMS) -> ItemFile:
    """Parse and check an item file (bytes as read from disk). A final newline is optional; ``\\r\\n`` is not
    accepted (the hash is over the exact bytes, so the file must not change with the platform that reads it).

    Raises:
        ItemsError: unknown kind, empty file, larger than :data:`MAX_FILE_BYTES`, more than ``max_items`` lines,
            a line over :data:`MAX_LINE_BYTES`, not UTF-8, not JSON, or not an item of ``kind`` (line number given).
    """
    if kind not in TASK_KINDS:
        raise ItemsError(f"kind must be one of {', '.join(TASK_KINDS)} (got {kind!r})")
    if len(data) > MAX_FILE_BYTES:
        raise ItemsError(f"the item file is {len(data)} bytes; at most {MAX_FILE_BYTES} are accepted")
    if not data.strip():
        raise ItemsError("the item file is empty: give one JSON object per line")
    raw = data[:-1] if data.endswith(b"\n") else data
    lines = raw.split(b"\n")
    if len(lines) > max_items:
        raise ItemsError(f"the item file has {len(lines)} items; at most {max_items} per batch")
    items = []
    for n, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_BYTES:
            raise ItemsError(f"line {n}: {len(line)} bytes, at most {MAX_LINE_BYTES}")
        if line.endswith(b"\r"):
            raise ItemsError(f"line {n}: ends in \\r (use \\n line endings)")
        if not line.strip():
            raise ItemsError(f"line {n}: blank (every line is an item)")
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise ItemsError(f"line {n}: not UTF-8") from None
        except json.JSONDecodeError as e:
            raise ItemsError(f"line {n}: bad JSON ({e.msg} at column {e.colno})") from None
        items.append(_check_item(obj, kind, n))
    return ItemFile(kind, tuple(lines), tuple(items))


def result_hash(data: bytes) -> bytes:
    """The 32-byte content hash of an item's result bytes: what a worker commits to and reveals."""
    return H(b"tally/batch-result/v1", data)


class ContentStore:
    """Item files (keyed by ``items_root``) and result bytes (keyed by :func:`result_hash`) under
    ``<root>/batch/store``. Keys are 32 bytes; values are checked against their key by whoever fetches them."""

    def __init__(self, root: Path):
        self.dir = Path(root) / "batch" / "store"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: bytes) -> Path:
        return self.dir / key.hex()

    def put(self, key: bytes, data: bytes) -> None:
        """Store ``data`` under ``key`` (atomically; a second put of the same key is a no-op)."""
        path = self._path(key)
        if path.exists():
            return
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def put_result(self, data: bytes) -> bytes:
        key = result_hash(data)
        self.put(key, data)
        return key

    def put_items(self, f: ItemFile) -> bytes:
        key = f.root
        self.put(key, f.data())
        return key

    def get(self, key: bytes) -> bytes | None:
        if not isinstance(key, bytes) or len(key) != 32:
            return None
        path = self._path(key)
        return path.read_bytes() if path.exists() else None


__all__ = ["GENERATE", "SCORE", "ContentStore", "ItemFile", "ItemsError", "parse_items", "result_hash"]
