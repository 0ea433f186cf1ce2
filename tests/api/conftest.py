"""Fixtures for the API tests: a live in-process swarm (real nodes, tiny model) on a background trio thread, so
tests can talk to it over HTTP from ordinary synchronous code (httpx, Schemathesis, Playwright)."""

from __future__ import annotations

import threading

import httpx
import pytest
import trio

from node.compute.model import make_tiny
from tests.e2e.swarm import swarm, wait_final

SPANS = [(0, 2), (2, 4), (4, 6)]


class LiveSwarm:
    """A swarm running in its own thread. ``nodes[0]`` is the validator and client; ``api`` its base URL."""

    def __init__(self, tmp, model_dir, spans=SPANS):
        self.tmp, self.model_dir, self.spans = tmp, model_dir, spans
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.nodes = []

    def start(self, timeout: float = 90) -> LiveSwarm:
        self.thread = threading.Thread(target=self._thread, daemon=True)
        self.thread.start()
        if not self.ready.wait(timeout) or self.error is not None:
            raise RuntimeError(f"swarm did not start: {self.error!r}")
        return self

    def _thread(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - surfaced by start()
            self.error = e
            self.ready.set()

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with swarm(self.tmp, self.model_dir, self.spans) as nodes:
            self.nodes = nodes
            self.ready.set()
            await self._stop.wait()

    @property
    def client(self):
        return self.nodes[0]

    @property
    def api(self) -> str:
        return self.client.api_url

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.client.api_token}"}

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the swarm's trio thread (safe access to node state)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def acall(self, afn, *args):
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    def generate(self, ids, n: int, timeout: float = 60):
        """Generate through the swarm and wait until every receipt is final; returns the generation."""
        async def go():
            gen = await self.client.generate(ids, n)
            await wait_final(self.client, [r.id for r in gen.receipts], timeout)
            return gen
        return self.acall(go)

    def wait_height(self, h: int, timeout: float = 30):
        return self.acall(self.client.ledger.wait_for_height, h, timeout)

    def stop(self) -> None:
        """Stop the swarm; a failure of its thread while the tests ran (stored by ``_thread``) is raised here."""
        if self.nodes and self.error is None:
            self.call(self._stop.set)
        self.thread.join(30)
        if self.error is not None:
            raise RuntimeError(f"the swarm's thread failed: {self.error!r}") from self.error


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="module")
def live(tmp_path_factory, tiny):
    s = LiveSwarm(tmp_path_factory.mktemp("swarm"), tiny).start()
    try:
        yield s
    finally:
        s.stop()


def get(url: str, **kw) -> httpx.Response:
    return httpx.get(url, timeout=30, **kw)


def post(url: str, **kw) -> httpx.Response:
    return httpx.post(url, timeout=30, **kw)


def snapshot(live):
    """Everything a state-changing request could touch (mempool, accounts, receipts, server sessions), read on
    the swarm's own thread."""
    def snap():
        c = live.client
        return (set(c.ledger.mempool), dict(c.ledger.state.accounts), len(c.ledger.state.receipts),
                [(nd.server.sessions_served, nd.server.active) for nd in live.nodes[1:]])
    return live.call(snap)
