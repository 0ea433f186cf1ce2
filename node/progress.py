"""Progress output of the long CLI waits (``node ledger verify``, ``node model add``, ``--follow`` of jobs, runs
and batches, the devnet's job demo): a tqdm bar when the stream is a terminal, else plain lines, never redraws.

A leaf: imports nothing of ``node``, so any layer may use it. tqdm (~70 ms to import) is imported only when a bar is
drawn, since every CLI command imports the modules that use this one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

REDRAW_S = 0.1  # a bar is redrawn at most this often (seconds), except when it reaches its total


class Progress:
    """Progress of ``total`` units of work on ``out`` (default: ``sys.stdout`` when constructed).

    On a terminal (``out.isatty()``): a tqdm bar ``desc`` over ``total`` ``unit``\\ s, its postfix the latest text.
    Elsewhere (a file, a pipe): one plain line per change, ``desc: n/total unit · text`` (or the caller's own
    ``line``), printed with flush, never ``\\r``; a line equal to the previous one is not printed again. With
    ``every`` > 1, plain lines are printed only at multiples of ``every`` and at ``total`` (e.g. every 10 %).

    Use as a context manager (the bar is closed on exit) or call :meth:`close`.
    """

    def __init__(self, total: int, unit: str, desc: str, out: TextIO | None = None, *, every: int = 1) -> None:
        self.total = total
        self.unit = unit
        self.desc = desc
        self.out: TextIO = sys.stdout if out is None else out
        self.every = max(1, every)
        self._last: str | None = None  # the last plain line printed
        self._text = ""  # the bar's postfix
        self._drawn = 0.0  # time.monotonic() of the bar's last redraw
        self._bar: Any = None  # a tqdm.tqdm (untyped: ignore_missing_imports in pyproject)
        if self.out.isatty():
            # local: tqdm (~70 ms) only while a progress bar is drawn; every CLI command imports its users
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=unit, desc=desc, file=self.out)

    @property
    def is_bar(self) -> bool:
        """True when a tqdm bar is drawn (the stream is a terminal), False for plain lines."""
        return self._bar is not None

    def show(self, n: int, text: str = "", *, line: str | None = None) -> None:
        """Report ``n`` units done (absolute, not a delta) with a short status ``text``.

        Bar: sets its count to ``n`` and its postfix to ``text``, redrawn at most every :data:`REDRAW_S` seconds
        (always on a new text or at ``total``). Plain: prints ``line`` (default ``desc: n/total unit · text``,
        without `` · text`` when the text is empty) unless it equals the last line printed, or ``every`` > 1 and
        ``n`` is neither a multiple of it nor ``total``.
        """
        bar = self._bar
        if bar is not None:
            bar.n = n
            now = time.monotonic()
            if text != self._text:
                self._text = text
                bar.set_postfix_str(text, refresh=False)
            elif now - self._drawn < REDRAW_S and n != self.total:
                return
            bar.refresh()
            self._drawn = now
            return
        if self.every > 1 and n % self.every and n != self.total:
            return
        if line is None:
            line = f"{self.desc}: {n}/{self.total} {self.unit}" + (f" · {text}" if text else "")
        if line != self._last:
            print(line, file=self.out, flush=True)
            self._last = line

    def close(self) -> None:
        """Close the bar (its final state stays on the terminal); plain lines need nothing. Idempotent."""
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def progress_iter(items: Iterable[T], total: int, desc: str, unit: str, out: TextIO | None = None) -> Iterator[T]:
    """``items``, reported through a :class:`Progress` on ``out`` (default: ``sys.stdout`` at the first item):
    a bar on a terminal, else a plain ``desc i/total`` line after each item ``i`` (counted from 1)."""
    with Progress(total, unit, desc, out) as p:
        for i, x in enumerate(items, start=1):
            yield x
            p.show(i, line=f"{desc} {i}/{total}")
