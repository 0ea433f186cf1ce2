"""Security of the local wallet API: loopback Host, same-origin requests, the API token, response headers.

The model is Bitcoin Core's RPC cookie: the node's API token is a file in its data dir (mode 0600); whoever can
read it may move the node's credits. Browsers are kept out of state changes three ways:

* DNS rebinding: a page on ``evil.example`` whose name later resolves to 127.0.0.1 sends ``Host: evil.example``.
  Every request whose ``Host`` is not a loopback name (``127.x.y.z``, ``localhost``, ``[::1]``, optional port) is
  refused with 403 ``forbidden_host`` — also when ``--api-host`` binds elsewhere.
* Cross-site requests: a request with an ``Origin`` other than this server's own (``http://<Host>``) is refused
  with 403 ``forbidden_origin`` (``Origin: null`` too), and so is a fetch a browser labels
  ``Sec-Fetch-Site: cross-site`` that is not a top-level navigation. No CORS headers are ever sent.
* Every state-changing request needs ``Authorization: Bearer <token>`` (401 ``unauthorized``;
  :func:`node.web.deps.require_token`, which the routes name as ``dependencies=AUTH``). The token is never put in
  a cookie, a page or a log, so a browser never sends it on its own.

Every response carries a strict Content-Security-Policy (scripts and styles from this server only, no inline
script, no framing), ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_HOST = re.compile(r"^(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|\[::1\])(:\d{1,5})?$")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# Swagger UI sets style attributes from its own bundle; only /docs allows inline styles.
DOCS_CSP = CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
STATIC_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                  (b"x-frame-options", b"DENY"), (b"cross-origin-resource-policy", b"same-origin")]


def _refusal(code: str, message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"code": code, "message": message}).encode()
    return body, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


def check_request(headers: dict[bytes, bytes]) -> tuple[str, str] | None:
    """``(code, message)`` if a request with these (lower-case) headers must be refused, else None."""
    host = headers.get(b"host", b"").decode("latin-1")
    if not LOOPBACK_HOST.match(host):
        return "forbidden_host", "Host must be a loopback name (127.0.0.1, localhost or [::1])"
    origin = headers.get(b"origin")
    if origin is not None and origin.decode("latin-1") != f"http://{host}":
        return "forbidden_origin", "cross-origin requests are refused"
    if headers.get(b"sec-fetch-site") == b"cross-site" and headers.get(b"sec-fetch-mode") != b"navigate":
        return "forbidden_origin", "cross-site requests are refused"
    return None


class SecurityMiddleware:
    """Pure ASGI middleware: refuses foreign ``Host``/``Origin`` before any route runs (so a refused request
    changes nothing) and adds the security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])  # ASGI header names are lower-case
        is_docs = scope["path"] == "/docs"
        extra = [*STATIC_HEADERS, (b"content-security-policy", (DOCS_CSP if is_docs else CSP).encode())]
        refused = check_request(headers)
        if refused is not None:
            body, hdrs = _refusal(*refused)
            await send({"type": "http.response.start", "status": 403, "headers": hdrs + extra})
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
