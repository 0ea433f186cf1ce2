"""The node's HTTP surface: the wallet/credits API (``/v1``, OpenAPI at ``/docs`` and ``/openapi.json``), the
block explorer (HTML pages) and ``/metrics`` (Prometheus).

Served by hypercorn's trio worker on the node's own event loop, so handlers await node services directly.
Binds to 127.0.0.1 by default; requests must carry a loopback ``Host`` and no foreign ``Origin``; state-changing
requests need the node's API token (``Authorization: Bearer <data-dir>/api_token``); see
:mod:`node.api.security`. Amounts are strings of base units with a decimal display beside them; errors are JSON
``{"code", "message"}`` (HTML pages on explorer routes). The signing key never leaves the node: no route reads
the data dir, and static files come only from the package's ``static/`` folder (and Swagger UI's, when the
``swagger-ui-bundle-v2`` package is installed).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import swagger_ui_bundle  # ships no type information: pyproject's mypy overrides
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..capabilities import CAPABILITIES
from ..ledger.core.tx import InvalidTx
from ..web.errors import ApiError
from ..web.models import ErrorOut
from . import modelsapi, pages, wallet
from .cache import ResponseCache
from .deps import NodeAPI
from .metrics import CONTENT_TYPE, metrics_registry, render
from .pages import error_page
from .queries import Queries
from .security import SecurityMiddleware
from .views import proof_from_json, receipt_json  # noqa: F401  (re-exported for callers and tests)

log = logging.getLogger("tally.api")
STATIC = Path(__file__).parent / "static"
JSON_PATHS = ("/v1/", "/metrics", "/openapi.json", "/static/", "/docs")
HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
              405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type"}

DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tally node API</title>
<link rel="stylesheet" href="/static/swagger/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/static/swagger/swagger-ui-bundle.js"></script><script src="/static/docs.js"></script></body></html>
"""
NO_DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tally node API</title></head>
<body><h1>Tally node API</h1><p>Swagger UI's files are not installed (pip package swagger-ui-bundle-v2), and this
page loads nothing from a CDN. The OpenAPI schema is at <a href="/openapi.json">/openapi.json</a>.</p></body></html>
"""


def swagger_dir() -> Path | None:
    """Where Swagger UI's files are (the ``swagger-ui-bundle-v2`` package), or None without them."""
    p = Path(swagger_ui_bundle.swagger_ui_path)
    return p if (p / "swagger-ui-bundle.js").exists() else None


def _wants_json(request: Request) -> bool:
    path = request.url.path
    return path.startswith(JSON_PATHS) or "text/html" not in request.headers.get("accept", "")


def _error(request: Request, status: int, code: str, message: str,
           details: list[dict[str, Any]] | None = None) -> Response:
    """``{"code", "message"[, "details"]}`` with ``status`` for API paths and clients that do not ask for HTML; the
    explorer's error page otherwise."""
    if _wants_json(request):
        body = {"code": code, "message": message, **({"details": details} if details is not None else {})}
        return JSONResponse(body, status_code=status)
    return error_page(request, status, code, message)


async def _api_error(request: Request, exc: ApiError) -> Response:
    return _error(request, exc.status, exc.code, exc.message)


async def _invalid_tx(request: Request, exc: InvalidTx) -> Response:  # the mempool's reason for a refusal
    return _error(request, 400, "invalid_tx", str(exc))


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    code = HTTP_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code
    if exc.status_code == 404:
        message = "no such page or resource"
    return _error(request, exc.status_code, code, message)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    details: list[dict[str, Any]] = [
        {"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()[:20]]
    first: dict[str, Any] = details[0] if details else {"loc": [], "msg": "invalid request"}
    message = f"{'.'.join(first['loc'])}: {first['msg']}" if first["loc"] else first["msg"]
    return _error(request, 422, "bad_request", message, details)


async def _internal(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return _error(request, 500, "internal", "internal error")


Handler = Callable[[Request, Any], Awaitable[Response]]
Responses = dict[int | str, dict[str, Any]]
ERROR_HANDLERS: tuple[tuple[type[Exception], Handler], ...] = (
    (ApiError, _api_error), (InvalidTx, _invalid_tx), (StarletteHTTPException, _http_error),
    (RequestValidationError, _validation_error), (Exception, _internal))
ERRORS: Responses = {c: {"model": ErrorOut} for c in (400, 401, 403, 404, 409, 422, 503)}


def routers() -> tuple[tuple[APIRouter, Responses | None], ...]:
    """(router, the error responses it documents), in mount order: /v1's wallet routes, each capability's router
    (:data:`node.capabilities.CAPABILITIES`: jobs, runs, batches, tabs, each in its package's ``api`` module) and
    the models' with ERRORS at inclusion, the explorer's pages (which declare theirs)."""
    caps = tuple((make(), ERRORS) for make in (c.router for c in CAPABILITIES) if make is not None)
    return ((wallet.router, None), *caps, (modelsapi.router, ERRORS), (pages.router, None))


def create_app(node: NodeAPI) -> FastAPI:
    """The API, explorer and metrics of ``node`` (a :class:`~node.runtime.Node`). The module-level routers reach
    the node through ``app.state.node`` (:func:`node.web.deps.get_node`); one process may build several apps."""
    app = FastAPI(title="Tally node API", version="1", description=__doc__, docs_url=None, redoc_url=None)
    app.add_middleware(ResponseCache, node=node)  # inner: sees only requests the security checks let through
    app.add_middleware(SecurityMiddleware)  # outermost (Starlette runs the last added first)
    q = Queries(node)
    app.state.node = node  # read by the routers' dependencies (node.web.deps.get_node, require_token)
    app.state.queries = q
    for exc, handler in ERROR_HANDLERS:
        app.add_exception_handler(exc, handler)
    for router, errors in routers():
        if errors is None:
            app.include_router(router)
        else:
            app.include_router(router, responses=errors)

    registry = metrics_registry(node, q)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)

    sw = swagger_dir()

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(DOCS_HTML if sw else NO_DOCS_HTML)

    if sw is not None:
        app.mount("/static/swagger", StaticFiles(directory=str(sw)), name="swagger")
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    return app
