"""Progress output of the model commands (``node model add``, ``--quantize``): a bar on a terminal, lines elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress_iter(items: Iterable[T], total: int, desc: str, enabled: bool) -> Iterator[T]:
    """``items`` with a tqdm bar on stdout when it is a terminal, else a plain ``desc i/total`` line per item."""
    if not enabled:
        yield from items
        return
    if sys.stdout.isatty():
        # local: tqdm (~70 ms) only on a terminal; the plain-line output does without it
        from tqdm import tqdm

        yield from tqdm(items, total=total, desc=desc, unit="block", file=sys.stdout)
        return
    for i, x in enumerate(items, start=1):
        yield x
        print(f"{desc} {i}/{total}", flush=True)
