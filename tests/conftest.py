"""Suite-wide hooks: the modules are handed to the xdist workers longest first (tests/order.py)."""

from __future__ import annotations

import pytest

from tests.order import longest_first, read_costs


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: a module's cost is that of its selected tests
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder the collected tests module by module, longest recorded module first (tests/durations.txt)."""
    items[:] = longest_first(items, read_costs())
