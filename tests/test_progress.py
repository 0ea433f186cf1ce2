"""node.progress: plain lines (one per change, never a ``\\r`` redraw) when the stream is not a terminal, a tqdm bar
when it is; the iterator wrapper of the model commands; tqdm not imported for plain lines."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from node.progress import Progress, progress_iter

ROOT = Path(__file__).resolve().parents[1]


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal_one_per_change_none_repeated() -> None:
    out = io.StringIO()
    with Progress(4, "step", "job ab12", out) as p:
        assert not p.is_bar
        for n, text in [(0, "status=open"), (0, "status=open"), (1, "status=accepted"), (1, "status=accepted"),
                        (3, "status=accepted"), (4, "status=settled"), (4, "status=settled")]:
            p.show(n, text)
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == ["job ab12: 0/4 step · status=open", "job ab12: 1/4 step · status=accepted",
                                           "job ab12: 3/4 step · status=accepted",
                                           "job ab12: 4/4 step · status=settled"]


def test_plain_lines_use_the_callers_line_and_every_keeps_one_per_step() -> None:
    out = io.StringIO()
    with Progress(20, "block", "verify", out, every=5) as p:
        for h in range(21):
            p.show(h, line=f"verified {h}/20 blocks")
    assert out.getvalue().splitlines() == [f"verified {h}/20 blocks" for h in (0, 5, 10, 15, 20)]
    out = io.StringIO()
    with Progress(3, "block", "verify", out, every=2) as p:
        for h in (1, 2, 3):
            p.show(h, line=f"verified {h}/3 blocks")
    assert out.getvalue().splitlines() == ["verified 2/3 blocks", "verified 3/3 blocks"]  # the total always


def test_a_caller_line_is_deduplicated_on_the_line_and_an_empty_text_has_no_separator() -> None:
    out = io.StringIO()
    with Progress(2, "round", "run 1234", out) as p:
        p.show(0, "a", line="r waiting")
        p.show(0, "b", line="r waiting")  # same line, another bar postfix: not printed again
        p.show(1, "c", line="r training")
    with Progress(2, "round", "run 1234", out) as p:
        p.show(2)
    assert out.getvalue().splitlines() == ["r waiting", "r training", "run 1234: 2/2 round"]


def test_a_terminal_gets_a_tqdm_bar_with_the_count_and_the_text() -> None:
    out = Tty()
    with Progress(4, "step", "job ab12", out) as p:
        assert p.is_bar
        p.show(1, "status=accepted")
        p.show(4, "status=settled")
    text = out.getvalue()
    assert "\r" in text  # redrawn in place
    assert "job ab12" in text and "4/4" in text and "status=settled" in text
    assert "job ab12: 4/4 step" not in text  # not the plain line


def test_progress_iter_yields_every_item_with_a_line_each_or_a_bar() -> None:
    out = io.StringIO()
    assert list(progress_iter(iter("abc"), 3, "converting blocks", "block", out)) == ["a", "b", "c"]
    assert out.getvalue().splitlines() == [f"converting blocks {i}/3" for i in (1, 2, 3)]
    tty = Tty()
    assert list(progress_iter(range(5), 5, "converting blocks", "block", tty)) == list(range(5))
    assert "5/5" in tty.getvalue() and "\r" in tty.getvalue()


def test_models_progress_iter_is_silent_when_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    from node.models.progress import progress_iter as models_iter

    assert list(models_iter([1, 2], 2, "converting blocks", enabled=False)) == [1, 2]
    assert list(models_iter([1, 2], 2, "converting blocks", enabled=True)) == [1, 2]
    assert capsys.readouterr().out.splitlines() == ["converting blocks 1/2", "converting blocks 2/2"]


def test_plain_lines_do_not_import_tqdm() -> None:
    code = ("import io, sys\nfrom node.progress import Progress\n"
            "with Progress(2, 'x', 'd', io.StringIO()) as p:\n    p.show(1, 't')\n"
            "assert 'tqdm' not in sys.modules, 'tqdm imported'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
