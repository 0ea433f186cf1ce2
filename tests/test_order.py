"""tests/order.py: the xdist hand-out order, longest module first, from recorded durations."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.order import longest_first, parse_durations, read_costs, write_costs

REPORT = """============================== slowest durations ===============================
12.50s call     tests/a/test_x.py::test_one
1.00s setup    tests/a/test_x.py::test_one
0.50s teardown tests/a/test_x.py::test_one
3.00s call     tests/b/test_y.py::test_p[masquerade-random]
(40 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


@dataclass
class Item:
    nodeid: str


def test_a_report_sums_each_tests_phases_and_skips_other_lines():
    assert parse_durations(REPORT) == {"tests/a/test_x.py::test_one": 14.0,
                                       "tests/b/test_y.py::test_p[masquerade-random]": 3.0}


def test_costs_round_trip_through_the_file_and_a_bad_line_is_refused(tmp_path):
    (tmp_path / "r1.txt").write_text(REPORT)
    (tmp_path / "r2.txt").write_text("20.00s call     tests/b/test_y.py::test_p[masquerade-random]\n")
    written = write_costs(tmp_path / "d.txt", [tmp_path / "r1.txt", tmp_path / "r2.txt"])
    assert written["tests/b/test_y.py::test_p[masquerade-random]"] == 20.0  # the larger of two reports
    assert read_costs(tmp_path / "d.txt") == written
    assert read_costs(tmp_path / "missing.txt") == {}
    (tmp_path / "bad.txt").write_text("# ok\nfast tests/a/test_x.py::test_one\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2"):
        read_costs(tmp_path / "bad.txt")


def test_modules_go_longest_first_by_their_selected_tests_and_unmeasured_modules_lead():
    costs = {"a.py::t1": 1.0, "a.py::t2": 1.0, "b.py::t1": 5.0, "c.py::slow": 100.0, "c.py::fast": 0.5}
    items = [Item(n) for n in ("a.py::t1", "a.py::t2", "b.py::t1", "c.py::fast", "new.py::t", "a.py::t3")]
    got = [i.nodeid for i in longest_first(items, costs)]
    # new.py has no recorded test: first; b (5) before a (1 + 1 + the mean 1 for t3 = 3) before c (only its
    # selected fast test: 0.5); a module's tests keep their collected order
    assert got == ["new.py::t", "b.py::t1", "a.py::t1", "a.py::t2", "a.py::t3", "c.py::fast"]
