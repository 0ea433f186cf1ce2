"""The order in which pytest-xdist hands out test modules: longest first (issue 35).

With ``--dist loadscope`` each module runs whole on one worker, and a worker takes the next module when it is
done. Handed out in collection order, a 10-minute module that comes last runs alone at the end while the other
workers idle; handed out longest first, the workers finish close together (the LPT rule: R. L. Graham, "Bounds on
multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2), 1969, within 4/3 of the best schedule).

A test's cost is its summed setup, call and teardown seconds in a ``pytest --durations=0`` report, kept in
``tests/durations.txt`` (one ``SECONDS NODEID`` line each); a module's cost is the sum over its *selected* tests, so
a module with a few default tests and long slow ones is short in the default suite and long in the slow one. A
test with no recorded cost counts as the mean of its module's recorded ones; a module with none goes first: new and
unmeasured, it may be long. Refresh the file after a change that moves a module's time a lot::

    .venv/bin/python -m tests.order tests/durations.txt docs/durations/slow-after.txt docs/durations/default-after.txt

pyproject's addopts turn off xdist's own reordering (``--no-loadscope-reorder``, by test count) so this one holds.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

COSTS = Path(__file__).with_name("durations.txt")
_LINE = re.compile(r"^\s*([0-9.]+)s\s+(?:setup|call|teardown)\s+(\S+?\.py::.+?)\s*$")


class _Item(Protocol):
    """The part of a pytest item this module reads."""

    nodeid: str


def parse_durations(text: str) -> dict[str, float]:
    """Seconds per test (its node id) summed over its setup, call and teardown lines of pytest's
    ``--durations`` report in ``text``; lines of any other form are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(2)] = out.get(m.group(2), 0.0) + float(m.group(1))
    return out


def read_costs(path: Path = COSTS) -> dict[str, float]:
    """The ``SECONDS NODEID`` lines of ``path`` (``#`` comment lines and blank lines skipped); {} if it is missing.

    Raises ValueError on a line of any other form."""
    if not path.exists():
        return {}
    costs: dict[str, float] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        try:
            costs[parts[1]] = float(parts[0])
        except (IndexError, ValueError):
            raise ValueError(f"{path}:{n}: expected 'SECONDS NODEID', got {raw!r}") from None
    return costs


def longest_first(items: Sequence[_Item], costs: dict[str, float]) -> list[_Item]:
    """``items`` regrouped by module, modules in decreasing cost of their tests in ``items`` (see the module's
    docstring for tests without a cost), the tests of one module in their collected order."""
    modules: dict[str, list[_Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def cost(tests: list[_Item]) -> float:
        known = [costs[t.nodeid] for t in tests if t.nodeid in costs]
        if not known:
            return float("inf")
        return sum(known) * len(tests) / len(known)

    total = {m: cost(tests) for m, tests in modules.items()}
    order = sorted(modules, key=lambda m: -total[m])  # sorted() is stable: equal costs keep collection order
    return [item for m in order for item in modules[m]]


def write_costs(out: Path, reports: Iterable[Path]) -> dict[str, float]:
    """Write ``out`` from pytest ``--durations=0`` reports (a test in several: its largest figure); the costs."""
    costs: dict[str, float] = {}
    for report in reports:
        for test, seconds in parse_durations(report.read_text()).items():
            costs[test] = max(costs.get(test, 0.0), seconds)
    lines = [f"{s:.2f} {t}" for t, s in sorted(costs.items(), key=lambda kv: -kv[1])]
    out.write_text("# seconds per test (setup + call + teardown), from pytest --durations=0 reports: "
                   "python -m tests.order (see tests/order.py)\n" + "\n".join(lines) + "\n")
    return costs


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python -m tests.order OUT REPORT [REPORT ...]")
    got = write_costs(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
    print(f"{len(got)} tests written to {sys.argv[1]}")
