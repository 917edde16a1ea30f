"""The package's shape, read from its imports (those inside functions count: they hide a cycle
or a layering break, they do not remove it; so do the modules a package's __init__ imports and
the ones the CLI's and `envbuild ci`'s tables load with importlib):

- no import cycle;
- the probe imports nothing of the host side (it runs inside images where envbuild is not
  installed);
- the floors: the vocabulary and the values import nothing heavy; readers (pick, verify, diff,
  the views, notify, doctor, the attestation check, the query) never reach the modules that
  build (docker, render, layers, base, build, pipeline, lock, index, attach, table);
- the house is at most MAX_FLOORS floors high (a chain of imports is at most that long): a
  ratchet, counted strictly (see MAX_FLOORS).

`python tests/test_shape.py` prints the floors, the longest chain and the modules over 450 lines (the aim).
"""

import ast
import sys
from functools import lru_cache
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "builder"
# Counted strictly: every import, inside functions too, the CLI's and `envbuild ci`'s importlib
# tables, and `python -m envbuild`'s __main__ on top. A ratchet: lower it when a cut lowers the house.
MAX_FLOORS = 10
MAX_LINES = 450

WRITERS = {"envbuild.docker", "envbuild.runlog", "envbuild.render", "envbuild.layers", "envbuild.base", "envbuild.build",
           "envbuild.pipeline", "envbuild.lock", "envbuild.index", "envbuild.attach", "envbuild.table",
           "envbuild.fold", "envbuild.bake", "envbuild.push", "envbuild.matrix", "envbuild.expand", "envbuild.probe_run"}
READERS = {"envbuild.pick", "envbuild.verify", "envbuild.diff", "envbuild.views", "envbuild.notify",
           "envbuild.attest", "envbuild.query", "envbuild.doctor"}
# The ground floors and everything each may reach (besides the probe package, the vocabulary's home).
GROUND = {"envbuild.values": set(), "envbuild.errors": set(), "envbuild.outcome": set(),
          "envbuild.row": {"envbuild.values", "envbuild.errors", "envbuild.fsutil"},
          "envbuild.selector": {"envbuild.errors"}}


def _module(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["envbuild", *parts])


def _dynamic(tree: ast.Module, mods: set[str]) -> set[str]:
    """Modules named in a command table (`"name": ("envbuild.x", "help")`) that importlib loads."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in mods:
            out.add(node.value)
    return out


@lru_cache(maxsize=1)
def import_graph() -> tuple[dict[str, frozenset[str]], dict[str, int]]:
    """module -> envbuild modules it imports; and per module its lines."""
    graph: dict[str, frozenset[str]] = {}
    lines: dict[str, int] = {}
    paths = {_module(p): p for p in PKG.rglob("*.py")}
    mods = set(paths)
    for mod, path in paths.items():
        text = path.read_text()
        lines[mod] = text.count("\n")
        tree = ast.parse(text, str(path))
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in mods else stem for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("envbuild"):
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("envbuild")]
            deps.update(t for t in targets if t in mods and t != mod)
        if mod in ("envbuild.cli", "envbuild.ci"):
            deps |= _dynamic(tree, mods) - {mod}
        # A submodule is loaded with its package: importing envbuild.doctor.env runs envbuild.doctor
        # (an __init__ that holds nothing adds nothing).
        parent = mod.rsplit(".", 1)[0]
        if parent in mods and parent != "envbuild" and parent != mod and (PKG / parent.split(".", 1)[1].replace(
                ".", "/") / "__init__.py").stat().st_size > 0:
            deps.add(parent)
        graph[mod] = frozenset(deps - {mod})
    return graph, lines


def _reach(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for d in graph.get(m, ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def cycles(graph) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            # a package and its own submodules load each other by design (the __init__ is the face)
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


def floors(graph) -> tuple[dict[str, int], list[str]]:
    """(floor of each module: 1 + the highest floor it imports; the longest chain of imports).
    A package's face and its submodules are one room (their mutual edges do not stack)."""
    def room(m):
        return "envbuild.doctor" if m.startswith("envbuild.doctor") else m

    rooms: dict[str, set[str]] = {}
    for m, deps in graph.items():
        rooms.setdefault(room(m), set()).update(room(d) for d in deps if room(d) != room(m))
    memo: dict[str, tuple[int, list[str]]] = {}

    def depth(r, path=()):
        if r in memo:
            return memo[r]
        best = (1, [r])
        for d in rooms.get(r, ()):
            if d in path:
                continue
            n, chain = depth(d, path + (r,))
            if n + 1 > best[0]:
                best = (n + 1, [r] + chain)
        memo[r] = best
        return best

    out = {r: depth(r)[0] for r in rooms}
    longest = max((depth(r)[1] for r in rooms), key=len)
    return out, longest


# ---------------------------------------------------------------- the rules


def test_no_import_cycles():
    graph, _ = import_graph()
    assert cycles(graph) == []


def test_the_probe_imports_nothing_of_the_host_side():
    graph, _ = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("envbuild.probe."):
            assert all(d.startswith("envbuild.probe") for d in deps), (mod, deps)


def test_the_ground_floors_import_only_the_vocabulary():
    graph, _ = import_graph()
    probe = {m for m in graph if m.startswith("envbuild.probe.") or m == "envbuild.probe"}
    for mod, allowed in GROUND.items():
        assert _reach(graph, mod) - probe <= allowed, (mod, _reach(graph, mod) - probe - allowed)


def test_readers_never_reach_the_modules_that_build():
    graph, _ = import_graph()
    for mod in sorted(m for m in graph if m in READERS or any(m.startswith(r + ".") for r in READERS)):
        bad = _reach(graph, mod) & WRITERS
        assert not bad, f"{mod} reaches {sorted(bad)}"


def test_the_dynamic_tables_are_edges():
    """The CLI's and `envbuild ci`'s importlib tables are read as imports (else a reader could
    reach a writer through them unseen)."""
    graph, _ = import_graph()
    assert {"envbuild.pick", "envbuild.build", "envbuild.doctor"} <= graph["envbuild.cli"]
    assert {"envbuild.ci_github", "envbuild.notify", "envbuild.bake"} <= graph["envbuild.ci"]


def test_the_house_is_at_most_max_floors_high():
    graph, _ = import_graph()
    fl, longest = floors(graph)
    assert max(fl.values()) <= MAX_FLOORS, " -> ".join(longest)


def test_no_module_is_over_max_lines():
    """A room with one job stays small: over MAX_LINES a module usually holds two (issue 51)."""
    _, lines = import_graph()
    big = {m: n for m, n in lines.items() if n > MAX_LINES}
    assert not big, big


if __name__ == "__main__":  # the figures a closing note reports
    g, ln = import_graph()
    fl, chain = floors(g)
    print(f"{len(g)} modules, {sum(len(d) for d in g.values())} import edges, {max(fl.values())} floors")
    print("longest chain (" + str(len(chain)) + "): " + " -> ".join(c.removeprefix("envbuild.") for c in chain))
    big = sorted(((n, m) for m, n in ln.items() if n > MAX_LINES), reverse=True)
    print(f"over {MAX_LINES} lines: " + (", ".join(f"{m.removeprefix('envbuild.')} {n}" for n, m in big) or "none"))
    by_floor: dict[int, list[str]] = {}
    for m, f in fl.items():
        by_floor.setdefault(f, []).append(m.removeprefix("envbuild."))
    for f in sorted(by_floor, reverse=True):
        print(f"floor {f:2}: {', '.join(sorted(by_floor[f]))}")
    sys.exit(0)


def _literal_codes(e: ast.AST) -> list[int]:
    """The non-zero integer literals an exit expression can return (`2`, `1 if x else 0`)."""
    if isinstance(e, ast.IfExp):
        return _literal_codes(e.body) + _literal_codes(e.orelse)
    if isinstance(e, ast.Constant) and type(e.value) is int and e.value != 0:
        return [e.value]
    return []


def test_exit_codes_come_from_the_one_table():
    """An outcome has one exit code, named in one home (vocab.EXIT_*, errors.OK/VERDICT/BAD_INPUT/
    INFRA): no command returns or exits with a literal other than 0 (issue 51)."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or not (fn.name in ("main", "_main", "run") or fn.name.startswith("run_")):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Return) and n.value is not None and _literal_codes(n.value):
                    bad.append(f"{path.relative_to(PKG)}:{n.lineno} return {ast.unparse(n.value)}")
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and ast.unparse(n.func) in ("sys.exit", "exit", "os._exit") and n.args \
                    and _literal_codes(n.args[0]):
                bad.append(f"{path.relative_to(PKG)}:{n.lineno} {ast.unparse(n)}")
    assert not bad, bad
