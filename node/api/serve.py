"""Serving the API with hypercorn's trio worker inside the node's nursery."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from .app import create_app
from .deps import NodeAPI

if TYPE_CHECKING:
    from trio_typing import TaskStatus


async def serve_api(node: NodeAPI, host: str, port: int,
                    task_status: TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve :func:`node.api.app.create_app` on ``host:port`` (port 0: any free port).

    ``task_status.started`` receives the base URL, e.g. ``"http://127.0.0.1:8700"``.
    """
    cfg = Config()
    cfg.bind = [f"{host}:{port}"]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("tally.api")
    cfg.graceful_timeout = 1.0

    async def _serve(task_status: TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        app = create_app(node)
        await serve(app, cfg, task_status=task_status)  # type: ignore[arg-type]  # an ASGI 3 app, typed otherwise

    async with trio.open_nursery() as n:
        binds = await n.start(_serve)
        task_status.started(binds[0].replace("0.0.0.0", "127.0.0.1"))
