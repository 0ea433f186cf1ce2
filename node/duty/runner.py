"""One runner for block-driven duties: wake at each block (or when the duty asks), look at the state, do this
node's part, and back off when a step fails.

The fine-tune job worker (:mod:`node.market.worker`), the batch worker (:mod:`node.batch.worker`), the batch
offer keeper (:mod:`node.batch.offer`) and the training-run worker (:mod:`node.training.worker`) each do their work
the same way: the ledger's state says what is
this node's to do, so at every block the duty looks at the state and starts what is not started yet (in the
runner's nursery, where its tasks live as long as the runner). :class:`DutyRunner` is that loop, written once:

* a step runs at each block (:meth:`DutyRunner.on_block`, registered with the ledger's block listeners), or as
  soon as the duty calls :meth:`DutyRunner.wake` (a fetch finished: accept now rather than at the next block);
  wakes that arrive during a step are kept, and run one more step after it (never two steps at once);
* a step that raises is logged (the full traceback once, then one line per failure) and the next step waits
  ``backoff(n)`` seconds after the ``n``-th consecutive failure, doubling from :data:`BACKOFF_BASE` to
  :data:`BACKOFF_CAP` seconds, then for the next wake; one step that succeeds resets the count. A failing duty
  therefore never takes the node down nor spins at every block.

Its state is a :class:`DutyState` (for logs, ``/v1/status`` and tests).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any, Protocol

import trio

log = logging.getLogger("tally.duty")

BACKOFF_BASE = 0.5  # seconds: the wait after a second consecutive failed step (the first retries at the next wake)
BACKOFF_CAP = 30.0  # seconds: the longest wait after failed steps


class Duty(Protocol):
    """A block-driven duty of a capability: ``await step(nursery)`` looks at the ledger's current state and starts
    the work that is this node's and not started yet (tasks go into ``nursery``, which outlives the step); it
    should return quickly. ``name`` names it in logs."""

    @property
    def name(self) -> str: ...

    async def step(self, nursery: trio.Nursery) -> None: ...


class BlockHooks(Protocol):
    """What the runner needs of :class:`node.ledger.service.LedgerService`: a listener called after each block is
    stored (``fn(block, new_state)``)."""

    def on_block(self, fn: Callable[[Any, Any], None]) -> None: ...


class DutyState(enum.Enum):
    """Where a :class:`DutyRunner` is."""

    IDLE = "idle"  # built; run() not started
    WAITING = "waiting"  # for the next block or wake
    STEPPING = "stepping"  # a step is running
    BACKING_OFF = "backing_off"  # the last step failed; waiting out the backoff before the next wake
    STOPPED = "stopped"  # run() returned or was cancelled


def backoff(failures: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """Seconds to wait after ``failures`` consecutive failed steps before waiting for the next wake: 0 after the
    first, then ``base``, ``2 base``, ``4 base`` … capped at ``cap`` (no float overflow however many)."""
    if failures <= 1:
        return 0.0
    return min(cap, base * 2.0 ** min(failures - 2, 64))


class DutyRunner:
    """Runs one :class:`Duty` (module docstring).

    Args:
        duty: what to step.
        blocks: the ledger's block listeners (None: the caller wires :meth:`on_block` itself, or only wakes).
        at_start: step once as soon as :meth:`run` starts, before any block (a duty restarting with work left).
        base, cap: the backoff after consecutive failed steps, in seconds (:func:`backoff`).
    """

    def __init__(self, duty: Duty, blocks: BlockHooks | None = None, *, at_start: bool = False,
                 base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> None:
        self.duty = duty
        self.at_start = at_start
        self.base, self.cap = base, cap
        self.state = DutyState.IDLE
        self.steps = 0  # steps run
        self.failures = 0  # consecutive failed steps (0 after a step that succeeded)
        self._wake = trio.Event()
        if blocks is not None:
            blocks.on_block(self.on_block)

    def on_block(self, _block: object, _state: object) -> None:
        """Block listener: step at the next opportunity."""
        self._wake.set()

    def wake(self) -> None:
        """Ask for a step now (one more after the running one, if a step is running); never blocks."""
        self._wake.set()

    async def run(self) -> None:
        """Step the duty forever (at start when ``at_start``, then at each wake); its tasks run in this runner's
        nursery and are cancelled with it."""
        try:
            async with trio.open_nursery() as nursery:
                first = self.at_start
                while True:
                    if not first:
                        self.state = DutyState.WAITING
                        await self._wake.wait()
                    first = False
                    self._wake = trio.Event()
                    await self._step_once(nursery)
        finally:
            self.state = DutyState.STOPPED

    async def _step_once(self, nursery: trio.Nursery) -> None:
        """One step; a failure is logged and backed off (module docstring)."""
        self.state = DutyState.STEPPING
        self.steps += 1
        try:
            await self.duty.step(nursery)
        except Exception as e:  # a duty's failure must not take the node down; retried later (backoff)
            self.failures += 1
            delay = backoff(self.failures, self.base, self.cap)
            if self.failures == 1:
                log.exception("%s: step failed; retrying at the next block", self.duty.name)
            else:
                log.warning("%s: step failed again (%d in a row: %s: %s); retrying in %.1f s and a block",
                            self.duty.name, self.failures, type(e).__name__, e, delay)
            if delay > 0:
                self.state = DutyState.BACKING_OFF
                await trio.sleep(delay)
            return
        self.failures = 0


__all__ = ["BACKOFF_BASE", "BACKOFF_CAP", "BlockHooks", "Duty", "DutyRunner", "DutyState", "backoff"]
