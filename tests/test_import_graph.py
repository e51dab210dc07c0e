"""The import graph of polltuned/: no cycle between modules (top-level, in-function and typing-only
imports all count), none between packages, and few in-function imports
of the project's own modules, each with a one-line ``# lazy: reason``.

The graph is read from the source (ast), not from an import: what it checks holds for every code path."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "polltuned"
MAX_LAZY = 40


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    in_function: bool
    text: str


def _modules(root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in sorted((root / "polltuned").rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _resolve(name: str, mods: Mapping[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _edges(root: Path) -> Iterator[Edge]:
    mods = _modules(root)
    for mod, path in mods.items():
        src = path.read_text(encoding="utf-8")
        lines = src.splitlines()
        tree = ast.parse(src)
        in_func = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("polltuned"):
                # ``from polltuned.a import b`` imports the module polltuned.a.b when there is one
                targets = {_resolve(f"{n.module}.{a.name}", mods) for a in n.names}
            elif isinstance(n, ast.Import):
                targets = {_resolve(a.name, mods) for a in n.names if a.name.startswith("polltuned")}
            else:
                continue
            for t in sorted(t for t in targets if t is not None and t != mod):
                yield Edge(mod, t, n.lineno, id(n) in in_func, lines[n.lineno - 1])


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    nodes = sorted(set(graph) | {d for ds in graph.values() for d in ds})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
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
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _package(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def package_cycles(edges: list[Edge]) -> list[list[str]]:
    """Cycles between the packages of polltuned/ (a top-level module is its own package)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        a, b = _package(e.src), _package(e.dst)
        if a != b and b != "polltuned":
            graph.setdefault(a, set()).add(b)
    return _cycles(graph)


def module_cycles(edges: list[Edge]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.src, set()).add(e.dst)
    return _cycles(graph)


def test_no_import_cycle_between_modules_or_packages() -> None:
    edges = list(_edges(REPO))
    assert len({e.src for e in edges}) > 100          # the whole package was read
    assert module_cycles(edges) == []
    assert package_cycles(edges) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    def e(a: str, b: str) -> Edge:
        return Edge(a, b, 1, False, "")
    assert module_cycles([e("polltuned.a", "polltuned.b"), e("polltuned.b", "polltuned.c"),
                          e("polltuned.c", "polltuned.a"), e("polltuned.c", "polltuned.d")]) \
        == [["polltuned.a", "polltuned.b", "polltuned.c"]]
    # two packages whose modules import each other's, without a module cycle, are a package cycle
    tied = [e("polltuned.p.x", "polltuned.q.y"), e("polltuned.q.y", "polltuned.p.z")]
    assert module_cycles(tied) == [] and package_cycles(tied) == [["polltuned.p", "polltuned.q"]]


def test_few_lazy_imports_of_our_own_modules_each_with_its_reason() -> None:
    lazy = [e for e in _edges(REPO) if e.in_function]
    statements = {(e.src, e.line): e for e in lazy}
    assert len(statements) < MAX_LAZY, len(statements)
    unexplained = [f"{e.src}:{e.line}: {e.text.strip()}" for e in statements.values() if "# lazy: " not in e.text]
    assert unexplained == []


def test_the_optimiser_names_are_the_registry_and_the_leaves_import_first() -> None:
    from polltuned.optimiser import OPTIMISERS
    from polltuned.policy.names import OPTIMISER_NAMES

    assert tuple(OPTIMISERS) == OPTIMISER_NAMES
    # importing a module runs its package's __init__ first: each of these must import on its own
    for mod in ("polltuned.policy.schema", "polltuned.policy.names", "polltuned.worlds.family",
                "polltuned.study.base"):
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True, cwd=REPO,
                           timeout=120)
        assert r.returncode == 0, (mod, r.stderr[-400:])
