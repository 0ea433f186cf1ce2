"""Tokenizer files of a fetched model: checked by content hash where the model commits to them, else marked as a
peer's and never trusted.

A model id (:mod:`node.compute.model`) is the Merkle root of the head, block and config hashes. Tokenizer files are
not among them, so on their own they are only as good as the peer that sent them. The config *is* covered:
a model whose ``config.json`` carries ``"tally_tokenizer": {file name: hex BLAKE2b-256 of the file's bytes}``
commits to its tokenizer through its model id, and :func:`check_tokenizer` accepts exactly those files with
those hashes, as blocks are accepted against the manifest (:mod:`node.verify.blockfetch`). Such a dir is trusted.

Models converted today (``save_model_dir``) do not carry the commitment: adding it changes their model ids, and
``save_pretrained`` writes tokenizer bytes that may differ between transformers versions, which would split one
model into several ids. Their tokenizer files stay **unverified**: every fetched dir is born with the
:data:`UNVERIFIED_TOKENIZER` marker (written before the dir is moved into place, so no crash leaves a fetched dir
looking like the node's own), and only a committed, checked tokenizer removes it. A replay of training on an
unverified tokenizer abstains instead of voting INVALID when the worker's committed batches do not match
(:func:`node.compute.model.tokenizer_trusted`, which owns the marker; :mod:`node.market.check`,
:mod:`node.training.replay`); a replay whose batches match used the committed token ids, whichever tokenizer
produced them. Nothing here runs code from the files: every tokenizer load passes ``trust_remote_code=False``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..compute.model import UNVERIFIED_TOKENIZER, ManifestError, config_dict, tokenizer_trusted
from ..encoding import H
from .blockserve import TOKENIZER_FILES

COMMIT_KEY = "tally_tokenizer"  # config.json key: {tokenizer file name: hex hash of its bytes}
TOKENIZER_ASKED = "tokenizer.asked"  # marker file: peers were asked for the tokenizer (with or without a reply)

__all__ = ["COMMIT_KEY", "TOKENIZER_ASKED", "UNVERIFIED_TOKENIZER", "check_tokenizer", "committed_tokenizer",
           "install_tokenizer", "tokenizer_trusted"]


def committed_tokenizer(model_dir: Path) -> dict[str, bytes] | None:
    """The tokenizer hashes ``model_dir``'s config commits to (``{file name: 32-byte hash}``, names among
    :data:`~node.verify.blockserve.TOKENIZER_FILES`), or None when it commits to none or the commitment is
    malformed (then nothing can be verified)."""
    try:
        raw = config_dict(model_dir).get(COMMIT_KEY)
    except (ManifestError, OSError):
        return None
    if not isinstance(raw, dict) or not raw or not set(raw) <= set(TOKENIZER_FILES):
        return None
    out: dict[str, bytes] = {}
    for name, h in raw.items():
        try:
            digest = bytes.fromhex(h) if isinstance(h, str) else b""
        except ValueError:
            return None
        if len(digest) != 32:
            return None
        out[name] = digest
    return out


def check_tokenizer(files: dict[str, bytes], committed: dict[str, bytes]) -> None:
    """Check that ``files`` are exactly the committed files, each hashing (BLAKE2b-256 of its bytes) to its
    commitment.

    Raises:
        ValueError: a file missing, extra, or with other bytes.
    """
    if set(files) != set(committed):
        raise ValueError(f"tokenizer files {sorted(files)}, the model commits to {sorted(committed)}")
    for name, data in files.items():
        got = H(data)
        if got != committed[name]:
            raise ValueError(f"{name} hashes to {got.hex()[:16]}, the model commits to {committed[name].hex()[:16]}")


def install_tokenizer(d: Path, files: dict[str, bytes], verified: bool) -> None:
    """Write ``files`` into the fetched dir ``d`` (temp file then ``os.replace`` each). The
    :data:`UNVERIFIED_TOKENIZER` marker is written before them and removed after them only when ``verified``
    (checked with :func:`check_tokenizer`), so no crash leaves a peer's files looking checked."""
    (d / UNVERIFIED_TOKENIZER).write_text("tokenizer files from a peer: not covered by the model id\n")
    for name, data in files.items():
        tmp = d / f"{name}.tmp{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, d / name)
    if verified:
        (d / UNVERIFIED_TOKENIZER).unlink()
