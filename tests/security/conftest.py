"""The ``devnet`` fixture of the hostile-peer suite: one :class:`tests.security.devnet.Devnet` per test module
(starting it takes ~30-60 s on 2 cores), restarted when an attack killed the target."""

from __future__ import annotations

import pytest

from tests.security.devnet import Devnet


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def _devnet_box(tmp_path_factory, models):
    box: list[Devnet] = []
    yield box
    for d in box:
        d.stop()


@pytest.fixture
def devnet(_devnet_box, tmp_path_factory, models):
    """A running devnet, with its target and honest client alive (a fresh one when the last test killed it)."""
    if _devnet_box and not (_devnet_box[-1].alive() and _devnet_box[-1].honest.proc.poll() is None):
        _devnet_box.pop().stop()
    if not _devnet_box:
        net = Devnet(tmp_path_factory.mktemp("devnet"), models)
        try:
            net.start()
        except BaseException:
            net.stop()
            raise
        _devnet_box.append(net)
    return _devnet_box[-1]
