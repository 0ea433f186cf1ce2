"""Geometry of the explorer's inline SVG charts (no script, no CDN: the templates draw these numbers).

Pure functions of plain data; all coordinates are in SVG user units of a ``width`` × ``height`` viewBox.
"""

from __future__ import annotations

import math
from typing import Any

PAD_L, PAD_R, PAD_T, PAD_B = 44, 8, 8, 22


def _nice_max(x: float) -> float:
    if x <= 0:
        return 1.0
    e: float = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if x <= m * e:
            return m * e
    return 10 * e


def _ticks(top: float, n: int = 4) -> list[float]:
    return [top * i / n for i in range(n + 1)]


def stacked_bars(series: list[dict[str, Any]], keys: list[str], width: int = 720,
                 height: int = 200) -> dict[str, Any]:
    """Stacked bars, one per bucket of ``series`` (dicts with ``from_height``, ``to_height`` and ``keys``; or with
    their own ``label`` and x-axis ``xlabel`` instead of the heights, e.g. one bar per round).

    Returns ``{"width", "height", "bars": [{"x", "w", "label", "parts": [{"key", "y", "h", "n"}]}],
    "yticks": [{"y", "label"}], "xlabels": [{"x", "label"}], "base": y of the axis}``.
    """
    inner_w, inner_h = width - PAD_L - PAD_R, height - PAD_T - PAD_B
    top = _nice_max(max((sum(b.get(k, 0) for k in keys) for b in series), default=0))
    n = max(1, len(series))
    slot = inner_w / n
    bars = []
    for i, b in enumerate(series):
        y = PAD_T + inner_h
        parts = []
        for k in keys:
            h = inner_h * b.get(k, 0) / top
            if h > 0:
                y -= h
                parts.append({"key": k, "y": round(y, 2), "h": round(h, 2), "n": b.get(k, 0)})
        bars.append({"x": round(PAD_L + i * slot + slot * 0.1, 2), "w": round(max(1.0, slot * 0.8), 2),
                     "label": b.get("label") or f"blocks {b['from_height']}–{b['to_height']}", "parts": parts})
    ticks = _ticks(top, int(top)) if top <= 8 and top == int(top) else _ticks(top)  # whole counts stay whole
    yticks = [{"y": round(PAD_T + inner_h - inner_h * t / top, 2), "label": _fmt(t)} for t in ticks]
    step = max(1, n // 6)
    xlabels = [{"x": round(PAD_L + i * slot + slot / 2, 2),
                "label": str(series[i]["xlabel"] if "xlabel" in series[i] else series[i]["from_height"])}
               for i in range(0, len(series), step)]
    return {"width": width, "height": height, "bars": bars, "yticks": yticks, "xlabels": xlabels,
            "base": PAD_T + inner_h, "left": PAD_L, "right": width - PAD_R}


def coverage(num_blocks: int, servers: list[dict[str, Any]], counts: list[int], width: int = 720,
             row: int = 18) -> dict[str, Any]:
    """Which server holds which decoder blocks: one row per server (a bar over its span) and a last row
    shading each block by how many live servers hold it (0 is drawn as a gap).

    Returns ``{"width", "height", "rows": [{"y", "x", "w", "label", "span"}], "cells": [{"x", "w", "n", "cls"}],
    "cells_y", "ticks": [{"x", "label"}]}``.
    """
    nb = max(1, num_blocks)
    inner = width - PAD_L - PAD_R
    unit = inner / nb
    rows = []
    for i, s in enumerate(servers):
        a, b = s["span"]
        rows.append({"y": PAD_T + i * (row + 4), "x": round(PAD_L + a * unit, 2), "w": round((b - a) * unit, 2),
                     "label": s["peer"][-6:], "peer": s["peer"], "span": f"[{a}, {b})"})
    cells_y = PAD_T + len(servers) * (row + 4) + 6
    most = max(counts, default=0) or 1
    cells = [{"x": round(PAD_L + i * unit, 2), "w": round(max(0.5, unit - 0.5), 2), "n": c, "block": i,
              "cls": "gap" if c == 0 else f"c{min(3, 1 + (2 * c) // (most + 1))}"} for i, c in enumerate(counts)]
    step = max(1, nb // 10)
    ticks = [{"x": round(PAD_L + i * unit, 2), "label": str(i)} for i in range(0, nb + 1, step)]
    return {"width": width, "height": cells_y + row + PAD_B, "rows": rows, "cells": cells, "cells_y": cells_y,
            "row": row, "ticks": ticks, "ticks_y": cells_y + row + 14, "left": PAD_L}


def line(values: list[float | None], width: int = 720, height: int = 200) -> dict[str, Any]:
    """A polyline through ``values`` (None, e.g. a NaN loss, breaks the line and is marked).

    Returns ``{"width", "height", "paths": ["x,y x,y ..."], "points": [{"x", "y", "v"}], "gaps": [x],
    "yticks": [{"y", "label"}], "base"}``.
    """
    inner_w, inner_h = width - PAD_L - PAD_R, height - PAD_T - PAD_B
    finite = [x for x in values if x is not None]
    hi = _nice_max(max(finite, default=1.0))
    n = len(values)
    paths: list[str] = []
    cur: list[str] = []
    points: list[dict[str, Any]] = []
    gaps: list[float] = []
    for i, x in enumerate(values):
        px = PAD_L + (inner_w * (i / (n - 1)) if n > 1 else inner_w / 2)
        if x is None:
            gaps.append(round(px, 2))
            if cur:
                paths.append(" ".join(cur))
                cur = []
            continue
        py = PAD_T + inner_h - inner_h * min(x, hi) / hi
        cur.append(f"{px:.2f},{py:.2f}")
        points.append({"x": round(px, 2), "y": round(py, 2), "v": f"{x:.4g}", "i": i + 1})
    if cur:
        paths.append(" ".join(cur))
    yticks = [{"y": round(PAD_T + inner_h - inner_h * t / hi, 2), "label": _fmt(t)} for t in _ticks(hi)]
    return {"width": width, "height": height, "paths": paths, "points": points, "gaps": gaps, "yticks": yticks,
            "base": PAD_T + inner_h, "left": PAD_L, "right": width - PAD_R, "top": PAD_T}


def _fmt(x: float) -> str:
    return f"{x:.0f}" if x >= 10 or x == int(x) else f"{x:.2g}"
