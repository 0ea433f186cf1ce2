"""The ``netns`` fixture: a :class:`tests.net.netns.Netns` for one test, removed afterwards.

Tests elsewhere can use it with ``from tests.net.conftest import netns  # noqa: F401``.
"""

import os
import sys
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.net.netns import Netns, NetnsUnavailable  # noqa: E402


@pytest.fixture
def netns(request):
    """A fresh topology (switch namespace + bridge, no hosts yet); skips the test with the reason where this
    machine does not allow network namespaces (not root, no ``ip netns``, no nft/iptables). Every namespace and
    every process started with ``netns.popen`` is removed at teardown, whatever the test did."""
    try:
        net = Netns(prefix_note=request.node.name[:8])
    except NetnsUnavailable as e:
        if os.environ.get("TALLY_REQUIRE_NETNS"):  # CI: these tests must run, not vanish as skips
            pytest.fail(f"network namespaces unavailable but TALLY_REQUIRE_NETNS is set: {e}")
        pytest.skip(f"network namespaces unavailable here: {e}")
    request.addfinalizer(net.close)
    return net
