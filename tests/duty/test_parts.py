"""A node's capabilities are built from its parts (node.duty.parts.NodeParts), each taking its own settings and
cheat names, and start in the order node.capabilities.CAPABILITIES lists them. A real Node (LevelDB, libp2p host,
the tiny model), built but not started."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from node.batch.worker import BatchWorker
from node.compute.model import make_tiny
from node.duty.runner import DutyRunner
from node.market.worker import JobWorker
from node.runtime import Node
from node.training.worker import RunWorker
from node.verify.member import CommitteeMember

from ..e2e.swarm import node_config, tiny_genesis


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("models"), seed=0)


def built(tmp_path, tiny, **settings) -> Node:
    """A Node with ``settings`` on its config, its services built (not started); its store is closed after."""
    out: list[Node] = []

    async def main() -> None:
        cfg = node_config(tmp_path, 1, tiny_genesis(1), tiny)
        for k, v in settings.items():
            setattr(cfg, k, v)
        nd = Node(cfg)
        try:
            nd._build_services()
        finally:
            nd.store.close()
        out.append(nd)

    trio.run(main)
    return out[0]


def test_parts_bundle_the_node_services_and_is_frozen(tmp_path, tiny):
    nd = built(tmp_path, tiny)
    p = nd.parts
    assert (p.ident, p.config, p.ledger, p.host, p.blobs, p.executor) == (nd.ident, nd.cfg, nd.ledger, nd.host,
                                                                         nd.blobs, nd.executor)
    assert p.model_id == nd.manifest.model_id
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.ledger = None  # type: ignore[misc]


def test_capabilities_in_start_order_and_jobs_only_when_accepted(tmp_path, tiny):
    nd = built(tmp_path, tiny)
    assert nd.jobs is None  # accept_jobs off: not built, not started
    assert [type(d) for d in nd.duties] == [CommitteeMember, RunWorker, BatchWorker, type(nd.offers), DutyRunner]
    assert nd.duties[0] is nd.member and nd.duties[1] is nd.runs and nd.duties[2] is nd.batches
    assert nd.duties[4].duty is nd.disputes  # the disputes capability's duty (node.disputes), last
    for w in (nd.runs, nd.batches):
        assert w.ledger is nd.ledger and w.executor is nd.executor and w.ident is nd.ident
    assert nd.runs.fault is None and nd.batches.runner.fault is None

    nd2 = built(tmp_path / "b", tiny, accept_jobs=True, job_capacity=3, fault="skip-steps")
    assert isinstance(nd2.jobs, JobWorker) and nd2.duties[1] is nd2.jobs
    assert (nd2.jobs.capacity, nd2.jobs.fault, nd2.jobs.model_id) == (3, "skip-steps", nd2.manifest.model_id)
    assert nd2.runs.fault is None and nd2.batches.runner.fault is None  # a job cheat is the job worker's only


def test_each_capability_takes_only_its_own_cheats(tmp_path, tiny):
    nd = built(tmp_path, tiny, accept_jobs=True, fault="run-zero")
    assert nd.runs.fault == "run-zero" and nd.jobs.fault is None and nd.batches.runner.fault is None
    nd2 = built(tmp_path / "b", tiny, fault="corrupt")
    assert nd2.batches.runner.fault == "corrupt" and nd2.runs.fault is None
