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

An item file comes from the requester, who may be an attacker who never ran :func:`parse_items` on it: the parser
bounds each line's size and, before ``json.loads`` (whose C scanner recurses once per ``[`` or ``{``: one 60 KB line
of ``[`` raised ``RecursionError``, issue 24 finding 1), its nesting depth, by a linear scan outside strings
(:func:`nesting_too_deep`). :func:`parse_posted` is the workers' entry point: any failure at all, of any kind,
is the deterministic "bad item file" answer, never an exception.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..encoding import H
from ..ledger.core.batchtx import GENERATE, MAX_ITEMS, SCORE, TASK_KINDS, items_root

MAX_FILE_BYTES = 32 << 20  # an item file is at most 32 MiB (it travels in one libp2p message)
MAX_LINE_BYTES = 64 << 10  # one item line is at most 64 KiB
MAX_PROMPT_IDS = 8192
MAX_DEPTH = 8  # arrays/objects nested in one line, at most (an item needs 2: an object holding "prompt_ids")

# A JSON string from its opening quote to its closing one (or to the end of the line, for an unterminated one:
# json.loads stops there too). The possessive ``*+`` never backtracks, and an unterminated string consumes the
# rest of the line, so a search over a line is linear in its length whatever quotes and backslashes it holds.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+"?')
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


class ItemsError(ValueError):
    """An item file that cannot be posted; the message names the line (1-based) and what is wrong with it."""


@dataclass(frozen=True)
class ItemFile:
    """A parsed, checked item file: ``lines`` (each line's bytes without its newline) and ``items`` (the decoded
    objects, one per line); ``root`` is the ``items_root`` a :class:`BatchPost` carries."""

    kind: str
    lines: tuple[bytes, ...]
    items: tuple[dict[str, Any], ...]

    @property
    def root(self) -> bytes:
        return items_root(self.lines)

    def data(self) -> bytes:
        """The file's bytes as stored and served: the lines joined by ``\\n``, with a final newline."""
        return b"".join(line + b"\n" for line in self.lines)


def _check_item(obj: object, kind: str, n: int) -> dict[str, Any]:
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


def nesting_too_deep(line: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """Whether JSON text ``line`` opens arrays/objects deeper than ``max_depth`` or leaves one unclosed, decided
    without recursion and without parsing: strings are cut out (:data:`_STRING`), every byte but ``[]{}`` is
    dropped, ``{}`` become ``[]``, then ``max_depth`` times every innermost pair ``[]`` is deleted (each pass
    removes exactly one level: the leaves of the bracket forest); an opener left after that is nested deeper, or
    never closed. Linear: at most ``max_depth + 2`` passes over the line at C speed (a 32 MiB file of ``[]`` takes
    ~0.2 s, the worst case measured, 16-deep pairs, ~1 s).

    Sound for ``json.loads``: its scanner recurses only on ``[`` and ``{`` outside strings, and reads strings
    exactly as :data:`_STRING` does (to the first unescaped quote); a false "too deep" is possible only for text
    that is not valid JSON anyway (an unclosed bracket).
    """
    br = _STRING.sub(b"", line).translate(_SQUARE, _NOT_BRACKET)
    if br.count(b"[") <= max_depth:  # depth <= openers: the common case, one pass
        return False
    for _ in range(max_depth):
        br = br.replace(b"[]", b"")
    return b"[" in br


def parse_items(data: bytes, kind: str, max_items: int = MAX_ITEMS) -> ItemFile:
    """Parse and check an item file (bytes as read from disk). A final newline is optional; ``\\r\\n`` is not
    accepted (the hash is over the exact bytes, so the file must not change with the platform that reads it).

    Raises:
        ItemsError: unknown kind, empty file, larger than :data:`MAX_FILE_BYTES`, more than ``max_items`` lines,
            a line over :data:`MAX_LINE_BYTES`, nested deeper than :data:`MAX_DEPTH`, not UTF-8, not JSON (or
            JSON that ``json.loads`` could not hold: ``RecursionError``, ``MemoryError``), or not an item of
            ``kind`` (line number given).
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
        if nesting_too_deep(line):
            raise ItemsError(f"line {n}: arrays/objects nested deeper than {MAX_DEPTH} (or left unclosed)")
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise ItemsError(f"line {n}: not UTF-8") from None
        except json.JSONDecodeError as e:
            raise ItemsError(f"line {n}: bad JSON ({e.msg} at column {e.colno})") from None
        except (RecursionError, MemoryError) as e:  # not expected after the depth check; never let one escape
            raise ItemsError(f"line {n}: JSON the parser could not hold ({type(e).__name__})") from None
        items.append(_check_item(obj, kind, n))
    return ItemFile(kind, tuple(lines), tuple(items))


def parse_posted(data: bytes, kind: str, n_items: int) -> tuple[ItemFile | None, str]:
    """A worker's parse of a posted batch's item file (already checked against its ``items_root``): the parsed file
    and ``""``, or ``None`` and the reason when the file cannot be worked (any :func:`parse_items` error, a count
    other than the post's ``n_items``, or any exception at all). Never raises ``Exception``: the file is fixed by
    its hash, so every honest worker reaches the same answer and returns the same ``bad_item_file`` result rather
    than failing and paying the absent penalty. CPU-bound (up to ~1 s for 32 MiB): run it off the event loop.
    """
    try:
        f = parse_items(data, kind)
        if len(f.items) != n_items:
            return None, f"{len(f.items)} items, the post says {n_items}"
        return f, ""
    except ItemsError as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - anything else (a bug, MemoryError) is the same answer too
        return None, f"{type(e).__name__}: {e}"


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


__all__ = ["GENERATE", "MAX_DEPTH", "SCORE", "ContentStore", "ItemFile", "ItemsError", "nesting_too_deep",
           "parse_items", "parse_posted", "result_hash"]
