"""Imports belong at the top of a module (issue 26). A function-local import is allowed only with a
``# local: <reason>`` comment, on the import's own line or on the comment line just above its group of imports:
in practice a heavy library (torch, transformers, peft, py-libp2p: importing one costs seconds, so a command or a
module that does not need it must not pay for it).

An AST scan of ``node/``, like ``tests/test_import_cycles.py``: it fails on a new unexplained local import.
"""

from __future__ import annotations

import ast
from pathlib import Path

NODE = Path(__file__).resolve().parents[1] / "node"

MARK = "# local:"


def _explained(node: ast.Import | ast.ImportFrom, lines: list[str], imports: set[int]) -> bool:
    """A ``# local:`` comment on one of the import's lines, or on the first line above its group of imports."""
    end = node.end_lineno or node.lineno
    if any(MARK in lines[i - 1] for i in range(node.lineno, end + 1)):
        return True
    i = node.lineno - 1
    while i >= 1 and (i in imports or lines[i - 1].strip().startswith(("from ", "import ", ")"))
                      or lines[i - 1].strip().endswith(",")):
        i -= 1  # up through the imports of the same group (and the lines of multi-line ones)
    return i >= 1 and lines[i - 1].strip().startswith(MARK)


def unexplained_local_imports(root: Path = NODE) -> list[str]:
    """``path:line: import`` for each function-local import without a ``# local:`` reason."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        src = path.read_text()
        lines = src.splitlines()
        tree = ast.parse(src)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
            starts = {n.lineno for n in local}
            for n in local:
                if not _explained(n, lines, starts):
                    found.append(f"node/{rel}:{n.lineno}: {lines[n.lineno - 1].strip()}")
    return sorted(set(found))


def test_no_unexplained_local_imports():
    found = unexplained_local_imports()
    assert not found, "function-local imports without a '# local: <reason>' comment (move them to the top):\n" + \
        "\n".join(found)


def test_the_scan_finds_one(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f():\n"
        "    import json\n"
        "    import torch\n"
        "    return json, torch\n"
        "\n"
        "def g():\n"
        "    # local: a reason\n"
        "    import json\n"
        "    from os import (\n"
        "        path,\n"
        "    )\n"
        "    import torch\n"
        "    return json, path, torch\n"
        "\n"
        "def h():\n"
        "    import csv  # local: a reason\n"
        "    x = 1\n"
        "    import json\n"
        "    return csv, x, json\n")
    assert unexplained_local_imports(tmp_path) == [
        "node/m.py:18: import json", "node/m.py:2: import json", "node/m.py:3: import torch"]
