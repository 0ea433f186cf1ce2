"""Keep torch off the trio event loop: every model call goes through one :class:`TorchExecutor` per node.

Making an executor imports nothing: torch is imported (and its thread count set) in the worker thread, at the first
call an executor runs, so a node that never runs a model never imports torch (issue 35) and the first import does
not stall the event loop (:func:`load_torch`: the same before torch work on the loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

_threads_set: int | None = None


def _call(threads: int, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    """Worker thread: the first time in this process, import torch and set its thread count; then ``fn(*args)``."""
    global _threads_set
    if _threads_set is None:
        import torch  # local: torch takes ~2 s to import; only a node that runs a model (a call here) loads it

        torch.set_num_threads(threads)
        _threads_set = threads
    return fn(*args)


class Runner(Protocol):
    """An executor as :func:`load_torch` uses it (:class:`TorchExecutor`, or the Protocols of the node's parts)."""

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any: ...


async def load_torch(executor: Runner) -> None:
    """Before torch work on the event loop (decoding fetched tensors, a local import of a module that imports torch):
    have ``executor`` import torch in its thread first, unless an executor already ran a call in this process. The
    first import (~2 s) would otherwise stall the loop, and consensus and every peer's requests with it."""
    if _threads_set is None:
        await executor.run(_nothing)


def _nothing() -> None:
    """A call for :func:`load_torch`: :func:`_call` does the work."""


class TorchExecutor:
    """Runs blocking torch work in a worker thread, one call at a time (``trio.CapacityLimiter(1)``).

    ``threads`` is passed to ``torch.set_num_threads`` (process-wide) before the first call any executor runs, in
    its worker thread (torch is imported there). Every call is torch work: code that does not need torch runs on
    the event loop instead.

    Raises:
        ValueError: ``threads < 1``.
    """

    def __init__(self, threads: int):
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.threads = threads
        self.limiter = trio.CapacityLimiter(1)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await``-able ``fn(*args)`` in the worker thread; returns its result or re-raises its exception.

        On cancellation the call still finishes (torch cannot be interrupted) before the cancel is delivered.
        """
        return await trio.to_thread.run_sync(_call, self.threads, fn, args, limiter=self.limiter)
