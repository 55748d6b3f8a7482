"""The project's import graph: no loop among its modules, and no import against the layers.

Run by ``scripts/lint.sh`` (and so by CI)::

    .venv/bin/python scripts/import_graph.py            # exit 1 with one line per problem
    .venv/bin/python scripts/import_graph.py --edges    # the package-level edges, for reading

Every ``import`` and ``from … import`` in ``shared/`` and ``services/`` counts, wherever it
stands: at the top, inside a function (a lazy import still is a dependency), or under
``if TYPE_CHECKING:``. ``from pkg import name`` where ``pkg.name`` is a module counts as an
import of that module.

**Layers**, lowest first; a module may import its own layer and those below, never above:

0. ``shared.contracts`` — wire types and subject names;
1. ``shared.core``, ``shared.harness``, ``shared.tables`` — pure logic, hook mappers (and the
   stdlib-only hook process), table rendering;
2. ``shared.infra``, ``shared.sim``, ``shared.trace`` — I/O adapters, the simulator, log
   importers;
3. ``services`` — the services;
4. ``shared.cli``, ``shared.examples`` — the command line (it starts services and stacks).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "services")
LAYERS: dict[str, int] = {
    "shared.contracts": 0,
    "shared.core": 1,
    "shared.harness": 1,
    "shared.tables": 1,
    "shared.infra": 2,
    "shared.sim": 2,
    "shared.trace": 2,
    "services": 3,
    "shared.cli": 4,
    "shared.examples": 4,
}


def modules() -> dict[str, Path]:
    """Every module of the project: dotted name → file."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``mod`` imports."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != mod:
            found.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, is_pkg, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base)
    return found


def layer(mod: str) -> tuple[str, int] | None:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if mod == prefix or mod.startswith(prefix + "."):
            return prefix, LAYERS[prefix]
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: list[str] = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def problems(graph: dict[str, set[str]]) -> list[str]:
    out = [f"import loop: {' <-> '.join(c)}" for c in cycles(graph)]
    for mod in sorted(graph):
        here = layer(mod)
        for dep in sorted(graph[mod]):
            there = layer(dep)
            if here is None or there is None:
                continue
            if there[1] > here[1]:
                out.append(
                    f"import against the layers: {mod} ({here[0]}, layer {here[1]}) imports "
                    f"{dep} ({there[0]}, layer {there[1]})"
                )
    unplaced = sorted(m for m in graph if layer(m) is None and m not in PACKAGES)
    out += [f"module in no layer: {m} (add its package to LAYERS)" for m in unplaced]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--edges", action="store_true", help="print the package-level edges")
    args = p.parse_args()
    known = modules()
    graph = {m: imports(m, path, known) for m, path in known.items()}
    if args.edges:
        pkg_edges: dict[str, set[str]] = defaultdict(set)
        for m, deps in graph.items():
            a = layer(m)
            for d in deps:
                b = layer(d)
                if a and b and a[0] != b[0]:
                    pkg_edges[a[0]].add(b[0])
        for a in sorted(pkg_edges):
            print(f"{a} -> {', '.join(sorted(pkg_edges[a]))}")
    found = problems(graph)
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print(f"import graph: {len(graph)} modules, no loop, every import within the layers")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
