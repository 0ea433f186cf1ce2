"""A response cache in front of the hottest reads: ``GET /v1/blocks/{height}`` and ``GET /v1/accounts/{peer}``.

Runs inside :class:`~node.api.security.SecurityMiddleware` (a request is checked before the cache is consulted,
and cached responses get the security headers like any other). A stored block never changes (Tendermint blocks
are final), so its 200 response is kept as long as it stays among the ``size`` most recent entries; an account's
200 response is valid only while the ledger state object it was rendered from is still the node's current state
(a new block replaces the state). Anything else — errors, query strings, other paths, other methods — goes to
the application.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .deps import NodeAPI

HOT = re.compile(r"^/v1/(blocks/[0-9]{1,19}|accounts/[0-9A-Za-z]{1,128})$")
IMMUTABLE = object()


class ResponseCache:
    """Pure ASGI middleware: answers the hot reads above from memory (``size`` entries, least recently used
    evicted), else passes the request on to ``app`` and keeps its complete 200 response."""

    def __init__(self, app: ASGIApp, node: NodeAPI, size: int = 2048) -> None:
        self.app, self.node, self.size = app, node, size
        # path -> (validity: IMMUTABLE or the state it was rendered from, status, raw headers, body)
        self.entries: OrderedDict[str, tuple[object, int, list[tuple[bytes, bytes]], bytes]] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["query_string"] \
                or not HOT.match(scope["path"]):
            return await self.app(scope, receive, send)
        path = scope["path"]
        state = self.node.ledger.state
        hit = self.entries.get(path)
        if hit is not None and (hit[0] is IMMUTABLE or hit[0] is state):
            self.entries.move_to_end(path)
            await send({"type": "http.response.start", "status": hit[1], "headers": hit[2]})
            await send({"type": "http.response.body", "body": hit[3]})
            return
        captured: dict[str, Any] = {}

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                captured["start"] = message
            elif message["type"] == "http.response.body":
                captured.setdefault("body", []).append(message.get("body", b""))
                captured["more"] = message.get("more_body", False)
            await send(message)

        await self.app(scope, receive, capture)
        start = captured.get("start")
        if start is None or start["status"] != 200 or captured.get("more"):
            return
        validity = IMMUTABLE if path.startswith("/v1/blocks/") else state
        self.entries[path] = (validity, 200, list(start.get("headers", [])), b"".join(captured["body"]))
        self.entries.move_to_end(path)
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
