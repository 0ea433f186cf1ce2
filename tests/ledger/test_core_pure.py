"""The ledger's core (node/ledger/core, and node/keys.py, node/encoding.py and node/msgscan.py that it imports) is
pure: it imports nothing that does I/O, keeps time or draws randomness, so that every node computes the same state
transition from the same blocks (issue 13, "A pure core you can check"). Checked on the source (every import
statement, nested ones included) and by importing the core in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = sorted((ROOT / "node/ledger/core").glob("*.py")) + [ROOT / "node/keys.py", ROOT / "node/encoding.py",
                                                                ROOT / "node/msgscan.py"]

# What the core may import: pure standard modules, the serialisation and crypto libraries, and itself.
ALLOWED = {
    "__future__", "abc", "bisect", "collections", "dataclasses", "enum", "functools", "hashlib", "heapq",
    "itertools", "json", "math", "operator", "re", "struct", "types", "typing",
    "concurrent",  # a thread pool for checking many signatures at once (node.keys.verify_many)
    "os",          # os.cpu_count() only, for that pool's size (see the test below)
    "contextlib",  # contextmanager (pure)
    "gc",          # pausing the cyclic collector for one block's work (chain.paused_gc): no effect on results
    "msgpack", "numpy", "nacl", "base58",
    "multiaddr",   # parsing bootstrap addresses in genesis documents (no sockets)
    "node",
}
ALLOWED_NODE = ("node.ledger.core", "node.keys", "node.encoding", "node.msgscan")
# node.encoding's tensor helpers import torch inside the functions that take tensors; the ledger never calls them
LAZY_OK = {("encoding.py", "torch")}


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    pkg = "node.ledger.core" if path.parent.name == "core" else "node"
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(a.name, n.lineno) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                out.append((".".join(base + ([n.module] if n.module else [])), n.lineno))
            else:
                out.append((n.module or "", n.lineno))
    return out


def test_the_core_imports_only_pure_modules():
    bad = []
    for path in CORE:
        for name, line in _imports(path):
            top = name.split(".")[0]
            if (path.name, top) in LAZY_OK:
                continue
            if top not in ALLOWED or (top == "node" and not name.startswith(ALLOWED_NODE)):
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    assert not bad, "the ledger core must not import modules with I/O:\n" + "\n".join(bad)


def test_os_is_used_only_for_the_cpu_count():
    for path in CORE:
        tree = ast.parse(path.read_text())
        uses = {n.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "os"}
        assert uses <= {"cpu_count"}, f"{path.name} uses os.{sorted(uses)}"


def test_importing_the_core_loads_no_io_library():
    code = ("import sys, node.ledger.core.state, node.ledger.core.chain, node.ledger.core.consensus, "
            "node.ledger.core.liveness, node.ledger.core.blockcodec\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'plyvel', 'trio', 'libp2p', 'socket', 'fastapi', 'torch', 'node'} and not "
            "m.startswith(('node.ledger.core', 'node.keys', 'node.encoding', 'node.msgscan')) and m != 'node' "
            "and m != 'node.ledger')\n"
            "print(' '.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"importing the core loaded: {out.stdout.strip()}"
