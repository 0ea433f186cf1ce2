"""The wallet's view of a local node: its HTTP API address from ``<data-dir>/node.json`` and its token from
``<data-dir>/api_token`` (the same routes and token as the HTTP wallet, :mod:`node.api.wallet`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from ..identity import TOKEN_FILE
from ..lockfile import holder

INFO_FILE = "node.json"  # written by node.runtime.Node once its API listens
LOCK_FILE = "node.lock"
POLL_S = 0.25  # seconds between looks for a submitted transaction


class WalletError(RuntimeError):
    """Something the user must be told in one line: the node is not running, the API refused, a timeout."""


class ApiRefused(WalletError):
    """The node answered with an error ``{"code", "message"}`` (HTTP ``status``)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


class NotIncluded(WalletError):
    """A submitted transaction the wallet stopped waiting for: dropped (``dropped`` True, the node's reason in the
    message) or still pending at the deadline (why, in the message). ``status`` is the node's
    ``/v1/txs/{id}/status`` answer (``TxStatusOut``), or None where the node could not give one."""

    def __init__(self, message: str, dropped: bool, status: dict[str, Any] | None):
        super().__init__(message)
        self.dropped, self.status = dropped, status


class NodeApi:
    """HTTP calls to the node whose data dir is ``data_dir``.

    Raises (from the constructor and every call):
        WalletError: no node runs there (no ``node.json``, nothing answers) or its token is unreadable.
        ApiRefused: the API answered an error.
    """

    def __init__(self, data_dir: Path, timeout: float = 30.0):
        self.data_dir = data_dir
        info = data_dir / INFO_FILE
        try:
            doc = json.loads(info.read_text())
            self.url, self.peer_id = str(doc["api"]).rstrip("/"), str(doc["peer_id"])
        except FileNotFoundError:
            pid = holder(data_dir / LOCK_FILE)
            if pid is not None:
                raise WalletError(f"the node in {data_dir} (pid {pid}) is still starting: its API is not up yet; "
                                  "try again in a moment") from None
            raise WalletError(f"no node is running in {data_dir} (no {INFO_FILE}); start one with "
                              f"`node start --data-dir {data_dir}`, or give --data-dir") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise WalletError(f"cannot read {info}: {e}") from None
        self.http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _token(self) -> str:
        path = self.data_dir / TOKEN_FILE
        try:
            return path.read_text().strip()
        except OSError as e:
            raise WalletError(f"cannot read the API token {path}: {e.strerror or e} (state changes need it)") from None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request; the decoded JSON body of a 2xx answer."""
        headers = {"Authorization": f"Bearer {self._token()}"} if method != "GET" else {}
        try:
            r = self.http.request(method, self.url + path, json=body, params=params, headers=headers)
        except httpx.HTTPError as e:
            pid = holder(self.data_dir / LOCK_FILE)
            if pid is None:
                raise WalletError(f"no node is running in {self.data_dir} (nothing answers at {self.url}); start "
                                  f"one with `node start --data-dir {self.data_dir}`") from None
            raise WalletError(f"the node in {self.data_dir} (pid {pid}) does not answer at {self.url}: "
                              f"{type(e).__name__} {e}") from None
        try:
            out = r.json()
        except ValueError:
            out = None
        if r.status_code >= 400:
            if isinstance(out, dict) and "code" in out:
                raise ApiRefused(r.status_code, str(out["code"]), str(out.get("message", "")))
            raise ApiRefused(r.status_code, f"http_{r.status_code}", r.text[:200])
        if not isinstance(out, dict):
            raise WalletError(f"the node at {self.url} answered {path} with something that is not a JSON object")
        return out

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """``GET path`` with the query ``params`` that are not None."""
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None} or None)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST path`` with the JSON ``body`` (authorised with the node's token)."""
        return self.call("POST", path, body=body)

    def tx_status(self, tid: str) -> dict[str, Any] | None:
        """The node's ``/v1/txs/{id}/status`` answer; None from a node without that route (an older one)."""
        try:
            return self.get(f"/v1/txs/{tid}/status")
        except ApiRefused as e:
            if e.status == 404:
                return None
            raise

    def wait_included(self, submitted: dict[str, Any], timeout: float,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
        """Poll ``/v1/txs/{id}`` until the submitted transaction is in a stored (finalized) block; its ``TxOut``.

        Raises:
            NotIncluded: the node dropped it (its reason; believed on the second look in a row, as the block that
                holds it may be stored between two looks), or the account's nonce moved past it while it is in
                no block (a node that forgot it), or it is still pending after ``timeout`` seconds (the node's
                reason: waiting for a block, or for a missing nonce; how long; how often it was re-sent).
            WalletError: the node stopped answering.
        """
        tid, nonce = submitted["id"], int(submitted["nonce"])
        deadline = clock() + timeout
        passed = dropped = 0  # consecutive looks that found the nonce past ours / the transaction dropped
        while True:
            try:
                return self.get(f"/v1/txs/{tid}")
            except ApiRefused as e:
                if e.status != 404:
                    raise
                dropped = dropped + 1 if e.code == "dropped" else 0
                if dropped >= 2:
                    raise NotIncluded(f"transaction {tid} was dropped by the node: {e.message}", True,
                                      self.tx_status(tid)) from None
            passed = passed + 1 if int(self.get(f"/v1/accounts/{self.peer_id}")["nonce"]) > nonce else 0
            if passed >= 2:
                raise NotIncluded(f"transaction {tid} was dropped: the account's nonce moved past {nonce} and it "
                                  "is in no block", True, self.tx_status(tid))
            if clock() >= deadline:
                st = self.tx_status(tid)
                why = st["summary"] if st else "the node says nothing more"
                if st and st.get("resent"):
                    why += f"; re-sent to peers {st['resent']} times"
                raise NotIncluded(f"transaction {tid} is not in a block after {timeout:g} s: {why}. It may still be "
                                  f"included: look again with GET /v1/txs/{tid}/status or `node wallet history`",
                                  bool(st and st["status"] == "dropped"), st)
            sleep(POLL_S)
