"""Keep torch off the trio event loop: every model call goes through one :class:`TorchExecutor` per node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

_threads_set: int | None = None


class TorchExecutor:
    """Runs blocking torch work in a worker thread, one call at a time (``trio.CapacityLimiter(1)``).

    ``threads`` is passed to ``torch.set_num_threads`` (process-wide) the first time an executor is made.

    Raises:
        ValueError: ``threads < 1``.
    """

    def __init__(self, threads: int):
        global _threads_set
        if threads < 1:
            raise ValueError("threads must be >= 1")
        if _threads_set is None:
            # local: torch takes ~2 s to import; callers that do not compute (the CLI) never load it
            import torch

            torch.set_num_threads(threads)
            _threads_set = threads
        self.threads = threads
        self.limiter = trio.CapacityLimiter(1)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await``-able ``fn(*args)`` in the worker thread; returns its result or re-raises its exception.

        On cancellation the call still finishes (torch cannot be interrupted) before the cancel is delivered.
        """
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)
