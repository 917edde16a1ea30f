"""The package's shape: no import cycle between envbuild's modules (imports inside functions count:
they hide a cycle, they do not remove it), and the probe package imports nothing of the host side
(it runs inside images where envbuild is not installed)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "builder"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["envbuild", *parts])


def import_graph() -> tuple[dict[str, set[str]], dict[str, int]]:
    """module -> envbuild modules it imports; and per module the count of imports inside functions."""
    graph: dict[str, set[str]] = {}
    inner: dict[str, int] = {}
    mods = {_module(p): p for p in PKG.rglob("*.py")}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps: set[str] = set()
        in_func = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f)}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in mods else stem for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("envbuild"):
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("envbuild")]
            targets = [t for t in targets if t in mods and t != mod]
            if targets and id(node) in in_func:
                inner[mod] = inner.get(mod, 0) + len(targets)
            deps.update(targets)
        graph[mod] = deps
    return graph, inner


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            # a package's __init__ importing its own submodules is not a cycle of concern
            if state.get(d) == 1 and not (m.startswith(d + ".") or d.startswith(m + ".")):
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_no_import_cycles():
    graph, _ = import_graph()
    assert cycles(graph) == []


def test_the_probe_imports_nothing_of_the_host_side():
    graph, _ = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("envbuild.probe."):
            assert all(d.startswith("envbuild.probe") for d in deps), (mod, deps)
