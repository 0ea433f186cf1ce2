"""The local node's HTTP API for the ``node job`` and ``node run`` commands: its address from
``<data-dir>/node.json``, its token from ``<data-dir>/api_token``. Every failure ends the command with one line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal, overload

import httpx


class LocalApi:
    """HTTP calls to the node whose data dir is ``data_dir``; ``prog`` (e.g. ``"node job"``) starts every error.

    Exits (``SystemExit`` with a one-line message): no running node there, the node is unreachable, it answered
    without JSON, or it refused the call (its ``code: message``).
    """

    def __init__(self, data_dir: Path, prog: str):
        self.prog = prog
        info = data_dir / "node.json"
        if not info.exists():
            sys.exit(f"{prog}: no running node in {data_dir} (start one with `node start --data-dir {data_dir}`)")
        self.url = json.loads(info.read_text())["api"]
        token = (data_dir / "api_token").read_text().strip()
        self.http = httpx.Client(timeout=600, headers={"Authorization": f"Bearer {token}"})

    @overload
    def call(self, method: str, path: str, missing_ok: Literal[False] = False, **kw: Any) -> dict[str, Any]: ...

    @overload
    def call(self, method: str, path: str, missing_ok: bool, **kw: Any) -> dict[str, Any] | None: ...

    def call(self, method: str, path: str, missing_ok: bool = False, **kw: Any) -> dict[str, Any] | None:
        """``method path`` with ``kw`` (httpx arguments); the JSON reply, or None for a 404 when ``missing_ok``."""
        try:
            r = self.http.request(method, self.url + path, **kw)
        except httpx.HTTPError as e:
            sys.exit(f"{self.prog}: cannot reach the node at {self.url}: {e}")
        try:
            body: dict[str, Any] = r.json()  # the node's API answers a JSON object
        except ValueError:
            sys.exit(f"{self.prog}: the node answered {r.status_code} without JSON")
        if r.status_code == 404 and missing_ok:
            return None
        if r.status_code >= 400:
            sys.exit(f"{self.prog}: {body.get('code')}: {body.get('message')}")
        return body


def dataset_field(args: argparse.Namespace, prog: str) -> dict[str, str]:
    """The request's dataset: ``{"play": ...}`` or ``{"text": <the --text file>}``; a file that cannot be read
    ends the command with one line."""
    if args.play:
        return {"play": args.play}
    try:
        return {"text": args.text.read_text(errors="replace")}
    except OSError as e:
        sys.exit(f"{prog}: cannot read --text {args.text}: {e.strerror or e}")
