"""Progress output of the model commands (``node model add``, ``--quantize``): a bar on a terminal, lines elsewhere
(through :func:`node.progress.progress_iter`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from ..progress import progress_iter as _progress_iter

T = TypeVar("T")


def progress_iter(items: Iterable[T], total: int, desc: str, enabled: bool) -> Iterator[T]:
    """``items`` with a bar over ``total`` blocks on stdout when it is a terminal, else a plain ``desc i/total`` line
    after each item; ``items`` unchanged, with no output, when not ``enabled``."""
    return _progress_iter(items, total, desc, "block") if enabled else iter(items)
