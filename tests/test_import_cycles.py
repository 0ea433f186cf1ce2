"""No import cycles in ``node`` beyond the known ones (issue 26, "CI fails on an import cycle").

import-linter's contracts (pyproject's ``[tool.importlinter]``, run by CI) order the top-level packages, which
rules out cycles between them; this test covers the modules inside a package too. The graph is grimp's (the
library under import-linter), with every import: module level, function-local and ``if TYPE_CHECKING``, because
a cycle moved into a function or behind ``TYPE_CHECKING`` is still a cycle between the modules' meanings.

``KNOWN`` lists the cycles that remain, each with its owner and plan. A cycle found must lie inside one of them
(a known cycle may shrink or go; then shrink its entry): any other cycle fails with its modules named.
"""

from __future__ import annotations

import grimp

KNOWN: dict[frozenset[str], str] = {}


def _cycles(nodes: list[str], edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan 1972, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def _unknown(found: list[frozenset[str]]) -> list[list[str]]:
    return [sorted(c) for c in found if not any(c <= k for k in KNOWN)]


def test_the_ledger_core_has_no_cycle():
    """Issue 26's 17-module cycle through ``ledger.core.state`` is gone: capability modules type against the
    narrow state view (``core/view.py``) and register through the module tuple (``core/modules.py``), so no
    module of the core is on any cycle; this fails if one comes back, even one a KNOWN entry would cover."""
    graph = grimp.build_graph("node", include_external_packages=False)
    core = sorted(m for m in graph.modules if m.startswith("node.ledger.core"))
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m) if t.startswith("node.ledger.core")}
             for m in core}
    assert [sorted(c) for c in _cycles(core, edges)] == []


def test_tarjan_finds_cycles_and_only_cycles():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(sorted("abcde"), edges) == [frozenset("abc")]
    assert _unknown([frozenset({"node.x", "node.y"})]) == [["node.x", "node.y"]]


def test_no_import_cycle_beyond_the_known_ones():
    graph = grimp.build_graph("node", include_external_packages=False)
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    assert _unknown(_cycles(modules, edges)) == [], "new import cycle among these modules (see docs/architecture.md)"
    top = {m: ".".join(m.split(".")[:2]) for m in modules}
    pkg_edges: dict[str, set[str]] = {}
    for m, targets in edges.items():
        for t in targets:
            if top[m] != top[t] and "node" not in (top[m], top[t]):
                pkg_edges.setdefault(top[m], set()).add(top[t])
    assert _unknown(_cycles(sorted(set(top.values())), pkg_edges)) == [], "new import cycle between packages"
