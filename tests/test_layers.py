"""The layer order, read from the import graph: no import (function-level included) runs back up.

obligations.core (machine integers, plans, outcomes, evidence, devices) < spec < native < falsification
< the rest of obligations (contract model, engines, CLI, reporting).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("obligations.core", "spec", "native", "falsification", "obligations")


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the package ``module`` belongs to (most specific first), or None if not ours."""
    for i, name in enumerate(LAYERS):
        if module == name or module.startswith(name + "."):
            return i
    return None


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (function-level imports included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def modules() -> list[tuple[str, Path]]:
    found = []
    for top in ("obligations", "spec", "native", "falsification"):
        for p in sorted((ROOT / top).rglob("*.py")):
            found.append((".".join(p.relative_to(ROOT).with_suffix("").parts), p))
    return found


@pytest.mark.parametrize("module, path", modules(), ids=[m for m, _ in modules()])
def test_no_import_runs_up_the_layers(module, path):
    own = layer_of(module)
    upward = [
        f"{path.relative_to(ROOT)}:{line}: imports {target}"
        for line, target in imports(path)
        if (lt := layer_of(target)) is not None and lt > own and not target.startswith(module)
    ]
    assert not upward, "\n".join(upward)


def test_the_checker_sees_a_planted_upward_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from obligations.engines import get_engine\n    return get_engine\n")
    found = [t for _, t in imports(planted) if layer_of(t) is not None and layer_of(t) > layer_of("spec.x")]
    assert found == ["obligations.engines", "obligations.engines.get_engine"]


def import_graph(top: str = "obligations") -> dict[str, set[str]]:
    """Module -> the modules of ``top`` it imports (any depth, TYPE_CHECKING blocks included).

    ``from package import submodule`` is an edge to the submodule (a package's ``__init__`` re-exporting its
    own submodules is not a circle); ``importlib`` imports are not edges (registration, see obligations.registry).
    """
    paths = {}
    for p in sorted((ROOT / top).rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & paths.keys()
                edges |= subs or {node.module}
        graph[module] = {e for e in edges if e in paths and e != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_obligations_has_no_import_cycle():
    graph = import_graph()
    circles = [
        " <-> ".join(c) + ": " + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        for c in cycles(graph)
    ]
    assert not circles, "\n".join(circles)


def test_the_cycle_finder_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
