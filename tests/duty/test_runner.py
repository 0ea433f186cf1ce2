"""The one runner of block-driven duties (node.duty.runner): steps at each block and on request, never two at once,
tasks outliving a step, a failing step logged and backed off without taking the runner down."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from node.duty.runner import BACKOFF_CAP, DutyRunner, DutyState, backoff


class Hooks:
    """The ledger's block listeners, as a test drives them."""

    def __init__(self) -> None:
        self.fns: list = []

    def on_block(self, fn) -> None:
        self.fns.append(fn)

    def block(self) -> None:
        for fn in self.fns:
            fn(None, None)


class Recorder:
    """A duty that records when it steps; ``slow`` seconds per step; raises while ``fail`` is positive."""

    name = "recorder"

    def __init__(self, slow: float = 0.0, fail: int = 0) -> None:
        self.times: list[float] = []
        self.slow, self.fail = slow, fail
        self.running = 0
        self.overlap = False
        self.task_done = trio.Event()

    async def step(self, nursery: trio.Nursery) -> None:
        self.running += 1
        self.overlap |= self.running > 1
        try:
            self.times.append(trio.current_time())
            if self.slow:
                await trio.sleep(self.slow)
            if self.fail > 0:
                self.fail -= 1
                raise RuntimeError("boom")
        finally:
            self.running -= 1


def run_with(duty, script, **kw) -> DutyRunner:
    hooks = Hooks()
    runner = DutyRunner(duty, hooks, **kw)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(runner.run)
            await trio.sleep(0)
            await script(runner, hooks)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return runner


def test_steps_at_each_block_and_not_before():
    duty = Recorder()

    async def script(runner, hooks):
        await trio.sleep(5)
        assert duty.times == [] and runner.state is DutyState.WAITING  # no block yet: no step
        for _ in range(3):
            hooks.block()
            await trio.sleep(1)

    runner = run_with(duty, script)
    assert duty.times == [5.0, 6.0, 7.0] and runner.steps == 3
    assert runner.state is DutyState.STOPPED


def test_at_start_steps_once_before_any_block():
    duty = Recorder()

    async def script(runner, hooks):
        await trio.sleep(2)

    run_with(duty, script, at_start=True)
    assert duty.times == [0.0]


def test_wakes_during_a_step_give_one_more_step_never_two_at_once():
    duty = Recorder(slow=1.0)

    async def script(runner, hooks):
        hooks.block()
        await trio.sleep(0.5)
        assert runner.state is DutyState.STEPPING
        for _ in range(5):  # five blocks and wakes while the step runs
            hooks.block()
            runner.wake()
        await trio.sleep(10)

    run_with(duty, script)
    assert duty.times == [0.0, 1.0] and not duty.overlap


def test_tasks_outlive_the_step_and_stop_with_the_runner():
    seen: list[str] = []

    class Spawner:
        name = "spawner"

        async def step(self, nursery: trio.Nursery) -> None:
            async def task() -> None:
                try:
                    await trio.sleep(3)
                    seen.append("done")
                    await trio.sleep_forever()
                except trio.Cancelled:
                    seen.append("cancelled")
                    raise
            nursery.start_soon(task)

    async def script(runner, hooks):
        hooks.block()
        await trio.sleep(5)

    run_with(Spawner(), script)
    assert seen == ["done", "cancelled"]


def test_failing_steps_back_off_doubling_then_reset_on_success(caplog):
    duty = Recorder(fail=4)

    async def script(runner, hooks):
        for _ in range(60):  # a block every 0.25 s for 15 s
            hooks.block()
            await trio.sleep(0.25)
        assert runner.failures == 0 and runner.state is DutyState.WAITING

    with caplog.at_level(logging.INFO, logger="tally.duty"):
        runner = run_with(duty, script)
    # failures at steps 1-4: retried at the next block, then after 0.5, 1 and 2 s (and a block, here already come)
    gaps = [b - a for a, b in zip(duty.times, duty.times[1:], strict=False)]
    assert gaps[:4] == [0.25, 0.5, 1.0, 2.0], gaps
    assert all(g == 0.25 for g in gaps[4:]), gaps  # succeeded: every block again
    assert runner.steps == len(duty.times) and runner.steps < 60
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and sum("failed again" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.parametrize("n, want", [(0, 0.0), (1, 0.0), (2, 0.5), (3, 1.0), (4, 2.0), (8, BACKOFF_CAP),
                                     (10**6, BACKOFF_CAP)])
def test_backoff_doubles_and_is_capped_without_overflow(n, want):
    assert backoff(n) == want
