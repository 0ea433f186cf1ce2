"""A new generation whose route lapsed for a moment (every announcement older than its ttl, as on a loaded machine
where refreshes arrive late) waits for the next refresh instead of failing with NoRouteError; a route that does
not come back still fails, after the wait."""

from __future__ import annotations

import time

import pytest
import trio

from node.compute.model import make_tiny
from node.compute.reference import local_generate
from node.compute.shards import NoRouteError

from ..e2e.swarm import swarm


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def test_a_lapsed_route_is_waited_for_then_used(tmp_path, tiny):
    prompt = [5, 6, 7]

    async def main():
        async with swarm(tmp_path, tiny, [(0, 3), (3, 6)]) as nodes:
            client = nodes[0]
            table = client.swarm
            model = client.manifest.model_id
            # every announcement heard so far is now past its ttl (the servers refresh every 0.5 s)
            table.clock = lambda: time.monotonic() + 60
            assert table.live(model) == []
            with pytest.raises(NoRouteError):
                client.client._plan(len(prompt) + 4)  # planned at once, it fails
            t0 = trio.current_time()
            gen = await client.generate(prompt, 4)  # waits for the next refreshes instead
            waited = trio.current_time() - t0
            # a model nobody serves: still refused, after the (shortened) wait
            await_fail = None
            client.client.manifest = type(client.manifest)(**{**client.manifest.__dict__, "num_blocks": 7})
            t1 = trio.current_time()
            try:
                await client.client._first_plan(1, wait=0.5)
            except NoRouteError as e:
                await_fail = (str(e), trio.current_time() - t1)
            return gen, waited, await_fail

    gen, waited, fail = trio.run(main)
    assert gen.tokens == local_generate(tiny, prompt, 4)
    assert waited < 5.0
    assert fail is not None and "block 6" in fail[0] and fail[1] >= 0.5
