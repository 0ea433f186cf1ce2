"""argparse types shared by ``node``'s commands and the capabilities' ``node start`` flags (each raises
:class:`argparse.ArgumentTypeError` with the reason, which argparse prints as ``node: error: ...``)."""

from __future__ import annotations

import argparse

from ..encoding import parse_amount


def int_at_least(text: str, low: int) -> int:
    """An integer >= ``low`` from ``text``."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < low:
        raise argparse.ArgumentTypeError(f"{n} is not >= {low}")
    return n


def positive(text: str) -> int:
    """An integer >= 1."""
    return int_at_least(text, 1)


def count(text: str) -> int:
    """An integer >= 0."""
    return int_at_least(text, 0)


def credits(text: str) -> int:
    """A decimal credit amount (0 allowed) in base units (:func:`node.encoding.parse_amount`)."""
    try:
        return parse_amount(text, allow_zero=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


__all__ = ["count", "credits", "int_at_least", "positive"]
