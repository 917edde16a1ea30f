"""The static import contract: does every name verl imports from the engine (or torch) exist in
what is installed? Read from the files' syntax trees, nothing imported, so it needs no GPU and
sees API drift that an import hides behind `libcuda.so.1: cannot open`.

A name is present in module M when M binds it at top level (any branch of an if/try), when
`M.name` is a submodule on disk, when M star-imports it (following `__all__`), or, conservatively,
when M is a native extension (.so), defines a module `__getattr__` (lazy re-exports), or rewrites
its own globals. Only a name that is certainly absent is reported.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from dataclasses import dataclass, field

from .gates import DEAD, GATED, LIVE, NOT_A_GUARD, Guards, installed_versions, reachability, terminates

EXT_SUFFIX = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:\.[\w\-]+)?\.(?:so|pyd)$")


@dataclass
class Located:
    dotted: str
    kind: str  # "package" | "module" | "extension" | "namespace"
    path: str  # file (__init__.py for a package), or folder for a namespace package
    dirs: list[str] = field(default_factory=list)  # a package's folders (submodules live there)


@dataclass
class ImportRef:
    line: int
    module: str  # absolute dotted target
    name: str | None  # `from module import name`; None for `import module`
    function: bool  # inside a function body: runs when verl calls it, not at import
    conditional: bool  # under if/else or try/except ImportError: an alternative may be taken
    state: int = LIVE  # gates: LIVE, GATED (behind a version guard not evaluated) or DEAD
    owner: str | None = None  # the top-level function it sits in (its reachability counts too)


@dataclass
class Summary:
    names: set[str] = field(default_factory=set)
    stars: list[str] = field(default_factory=list)  # absolute modules star-imported
    all_: list[str] | None = None
    lazy: bool = False  # module __getattr__, globals() rewriting: any name may exist
    imports: list[ImportRef] = field(default_factory=list)
    functions: set[str] = field(default_factory=set)  # top-level functions
    uses: list[tuple[str, int, str | None]] = field(default_factory=list)  # (function, state, owner)
    # local name -> (module, attribute or None), from every import in the module (None: bound to
    # two different things, so a call through it is not resolved)
    bindings: dict[str, tuple[str, str | None] | None] = field(default_factory=dict)
    calls: list["CallRef"] = field(default_factory=list)


@dataclass
class CallRef:
    """A call of a dotted name (`SamplingParams(n=2)`, `vllm_ops.foo(x)`), as written."""
    line: int
    callee: str
    npos: int  # positional arguments
    star: bool  # *args in the call: arity unknown
    keywords: list[str]
    kwsplat: bool  # **kwargs in the call
    state: int
    owner: str | None


@dataclass
class Finding:
    file: str  # importing file
    line: int
    module: str
    name: str | None
    function: bool
    where: str  # the target side: what is (not) there, file and line where known
    gated: bool = False  # in code that runs only for versions no guard here decides: a caveat


class ModuleIndex:
    """Finds modules on a list of folders (sys.path-like) without importing anything."""

    def __init__(self, paths: list[str] | None = None, known: set[str] = frozenset()):
        """`known`: the packages whose version guards in the code read are evaluated."""
        self.paths = [p for p in (paths if paths is not None else sys.path) if p and os.path.isdir(p)]
        self.known = set(known)
        self.version = installed_versions(self.paths if paths is not None else None)
        _ROOTS[:] = self.paths
        self._found: dict[str, Located | None] = {}
        self._summary: dict[str, Summary | None] = {}
        self.unreachable: list[str] = []  # file:line of imports in code the installed versions never run

    # -- finding files
    def find(self, dotted: str) -> Located | None:
        if dotted in self._found:
            return self._found[dotted]
        parts = dotted.split(".")
        if len(parts) == 1:
            dirs = self.paths
        else:
            parent = self.find(".".join(parts[:-1]))
            dirs = parent.dirs if parent and parent.kind in ("package", "namespace") else []
        loc = self._find_in(dotted, parts[-1], dirs)
        self._found[dotted] = loc
        return loc

    @staticmethod
    def _find_in(dotted: str, leaf: str, dirs: list[str]) -> Located | None:
        namespace: list[str] = []
        for d in dirs:
            pkg = os.path.join(d, leaf)
            if os.path.isdir(pkg):
                init = os.path.join(pkg, "__init__.py")
                if os.path.isfile(init):
                    return Located(dotted, "package", init, [pkg])
                namespace.append(pkg)
                continue
            if os.path.isfile(pkg + ".py"):
                return Located(dotted, "module", pkg + ".py")
            try:
                entries = os.listdir(d)
            except OSError:
                continue
            for e in entries:
                m = EXT_SUFFIX.match(e)
                if m and m["name"] == leaf:
                    return Located(dotted, "extension", os.path.join(d, e))
        if namespace:
            return Located(dotted, "namespace", namespace[0], namespace)
        return None

    # -- reading modules
    def summary(self, dotted: str) -> Summary | None:
        if dotted in self._summary:
            return self._summary[dotted]
        loc = self.find(dotted)
        s = None
        if loc is not None and loc.kind in ("package", "module"):
            s = summarize(loc.path, dotted, loc.kind == "package",
                          (lambda tree: Guards(tree, self.version, self.known)) if self.known else None)
        self._summary[dotted] = s
        return s

    def has(self, module: str, name: str, _seen: frozenset = frozenset()) -> bool | None:
        """True: present (or cannot be ruled out); False: certainly absent; None: no such module."""
        loc = self.find(module)
        if loc is None:
            return None
        if loc.kind in ("package", "namespace") and self.find(f"{module}.{name}") is not None:
            return True
        if loc.kind == "extension":
            return True
        if loc.kind == "namespace":
            return False
        s = self.summary(module)
        if s is None or s.lazy or name in s.names:
            return True
        if module in _seen:
            return False
        for star in s.stars:
            t = self.summary(star)
            if t is None:
                if self.find(star) is None or self.find(star).kind == "extension":
                    return True  # cannot read what it re-exports: not certainly absent
                continue
            if t.all_ is not None:
                if name in t.all_:
                    return True
            elif not name.startswith("_") and self.has(star, name, _seen | {module}):
                return True
        return False


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "AttributeError"}


def _catches_import_error(t: ast.Try) -> bool:
    for h in t.handlers:
        if h.type is None:
            return True
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        for x in types:
            n = x.id if isinstance(x, ast.Name) else x.attr if isinstance(x, ast.Attribute) else ""
            if n in _IMPORT_ERRORS:
                return True
    return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: str | None, level: int, here: str, is_pkg: bool) -> str | None:
    if level == 0:
        return module
    base = here.split(".") if is_pkg else here.split(".")[:-1]
    if level - 1 > len(base):
        return None
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else [])) or None


def _targets(node) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for e in node.elts for n in _targets(e)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def summarize(path: str, dotted: str, is_pkg: bool, guards=None) -> Summary | None:
    """What a module binds and imports. `guards(tree)` makes a gates.Guards for it: with one,
    version-guarded branches are evaluated (a decided branch is live or dead, not conditional) and
    each import and each use of a top-level function carries the state of the code it sits in."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    s = Summary()
    g = guards(tree) if guards else None
    s.functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def visit(body, function: bool, conditional: bool, top: bool, state: int = LIVE, owner: str | None = None):
        for node in body:
            _uses(node, state, owner)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                _imports(node, function, conditional, top, state, owner)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if top:
                    s.names.add(node.name)
                    if node.name == "__getattr__":
                        s.lazy = True
                visit(node.body, True, conditional, False, state, owner or (node.name if top else None))
            elif isinstance(node, ast.ClassDef):
                if top:
                    s.names.add(node.name)
                visit(node.body, function, conditional, False, state, owner)
            elif isinstance(node, ast.If):
                decided = g.test(node.test) if g else NOT_A_GUARD
                if isinstance(decided, bool):
                    # A version guard decided for the installed versions: one branch runs as the
                    # code around it does, the other never.
                    visit(node.body, function, conditional, top, state if decided else DEAD, owner)
                    visit(node.orelse, function, conditional, top, DEAD if decided else state, owner)
                    if terminates(node.body if decided else node.orelse):
                        state = DEAD  # `if new: return …` — what follows is for the other versions
                    continue
                # Both branches (TYPE_CHECKING ones too): a name bound in any of them is not
                # certainly absent, and an import under a condition may have an alternative.
                inner = max(state, GATED) if decided is None else state
                visit(node.body, function, True, top, inner, owner)
                visit(node.orelse, function, True, top, inner, owner)
                if decided is None and (terminates(node.body) or terminates(node.orelse)):
                    state = max(state, GATED)
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                guarded = _catches_import_error(node)
                visit(node.body, function, conditional or guarded, top, state, owner)
                for h in node.handlers:
                    if top and h.name:
                        s.names.add(h.name)
                    visit(h.body, function, True, top, state, owner)
                visit(node.orelse, function, conditional or guarded, top, state, owner)
                visit(node.finalbody, function, conditional, top, state, owner)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                if top:
                    for t in ([node.target] if isinstance(node, (ast.For, ast.AsyncFor)) else
                              [i.optional_vars for i in getattr(node, "items", []) if i.optional_vars]):
                        s.names.update(_targets(t))
                visit(node.body, function, conditional, top, state, owner)
                visit(getattr(node, "orelse", []), function, conditional, top, state, owner)
            elif top and isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                tgts = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in tgts:
                    s.names.update(_targets(t))
                    if isinstance(t, ast.Name) and t.id == "__all__":
                        s.all_ = _literal_strings(node.value)
            if top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                _dynamic(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for gl in ast.walk(node):
                    if isinstance(gl, ast.Global):
                        s.names.update(gl.names)

    def _uses(node, state: int, owner: str | None):
        # Loads of the module's own functions, and calls of dotted names, in this statement's own
        # expressions (nested blocks are visited with their own state).
        for e in _own_exprs(node):
            for n in ast.walk(e):
                if isinstance(n, ast.Name) and n.id in s.functions and isinstance(n.ctx, ast.Load):
                    s.uses.append((n.id, state, owner))
                elif isinstance(n, ast.Call):
                    callee = _dotted(n.func)
                    if callee:
                        s.calls.append(CallRef(
                            n.lineno, callee, sum(1 for a in n.args if not isinstance(a, ast.Starred)),
                            any(isinstance(a, ast.Starred) for a in n.args),
                            [k.arg for k in n.keywords if k.arg], any(k.arg is None for k in n.keywords),
                            state, owner))

    def _dynamic(node):
        # globals().update(...) / exec(...) at module level bind names the tree does not show
        for n in ast.walk(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("globals", "exec"):
                s.lazy = True

    def _bind(name: str, target: tuple[str, str | None]):
        if name in s.bindings and s.bindings[name] != target:
            s.bindings[name] = None
        else:
            s.bindings[name] = target

    def _imports(node, function: bool, conditional: bool, top: bool, state: int, owner: str | None):
        if isinstance(node, ast.Import):
            for a in node.names:
                _bind(a.asname or a.name.split(".")[0], (a.name if a.asname else a.name.split(".")[0], None))
                s.imports.append(ImportRef(node.lineno, a.name, None, function, conditional, state, owner))
                if top:
                    s.names.add(a.asname or a.name.split(".")[0])
            return
        mod = _absolute(node.module, node.level, dotted, is_pkg)
        if mod is None:
            return
        for a in node.names:
            if a.name == "*":
                if top:
                    s.stars.append(mod)
                continue
            _bind(a.asname or a.name, (mod, a.name))
            s.imports.append(ImportRef(node.lineno, mod, a.name, function, conditional, state, owner))
            if top:
                s.names.add(a.asname or a.name)

    visit(tree.body, False, False, True)
    return s


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _dotted(e) -> str | None:
    """`a.b.c` for a chain of attributes on a name; None for anything else."""
    parts = []
    while isinstance(e, ast.Attribute):
        parts.append(e.attr)
        e = e.value
    if not isinstance(e, ast.Name):
        return None
    return ".".join([e.id, *reversed(parts)])


def _own_exprs(node) -> list:
    """A statement's expressions outside its nested blocks (tests, iterables, decorators, ...)."""
    return [v for f, v in ast.iter_fields(node) if f not in _BLOCKS and isinstance(v, ast.AST)] + \
        [x for f, v in ast.iter_fields(node) if f not in _BLOCKS and isinstance(v, list)
         for x in v if isinstance(x, ast.AST)]


def _literal_strings(node) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                       for e in node.elts):
        return [e.value for e in node.elts]
    return None


_ROOTS: list[str] = []  # folders searched by the last index: file names are shown relative to them


def _rel(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for root in sorted(_ROOTS, key=len, reverse=True):
        if path.startswith(root.rstrip("/") + "/"):
            return path[len(root.rstrip("/")) + 1:]
    return path


def check_module(index: ModuleIndex, dotted: str, tops: set[str]) -> tuple[list[Finding], int] | None:
    """Unconditional imports of `dotted` that target the top-level packages `tops` and are absent,
    in code the installed versions can run. Returns (findings, number of names checked), or None
    when the module is not on disk. Code that runs only for other versions is not read (counted in
    `index.unreachable`); a miss in code behind a version guard not evaluated is a gated finding."""
    loc = index.find(dotted)
    s = index.summary(dotted)
    if loc is None or s is None:
        return None
    reach = _reach(index, s, loc)
    out, checked = [], 0
    for ref in s.imports:
        top = ref.module.split(".")[0]
        if top not in tops or ref.conditional or index.find(top) is None:
            continue  # (a target not installed at all is the env level's finding, not drift)
        state = max(ref.state, reach.get(ref.owner, LIVE) if ref.owner else LIVE)
        if state == DEAD:
            key = f"{_rel(loc.path)}:{ref.line}"
            if key not in index.unreachable[-3:]:  # one per statement, not per imported name
                index.unreachable.append(key)
            continue
        checked += 1
        where = _missing(index, ref)
        if where:
            out.append(Finding(_rel(loc.path), ref.line, ref.module, ref.name, ref.function, where,
                               gated=state == GATED))
    return out, checked


def _reach(index: ModuleIndex, s: Summary, loc: Located) -> dict[str, int]:
    if not any(st != LIVE for _, st, _ in s.uses):
        return {}
    top = loc.dotted.split(".")[0]
    root = index.find(top)
    others = [text for p, text in _sources(root.dirs[0]) if p != loc.path] if root and root.dirs else []
    names = set(s.all_ or [])

    def exported(fn: str) -> bool:
        pat = re.compile(rf"\b{re.escape(fn)}\b")
        return fn in names or any(fn in t and pat.search(t) for t in others)
    return reachability(s.functions, s.uses, exported)


def _missing(index: ModuleIndex, ref: ImportRef) -> str | None:
    """What is missing on the target side, or None if the import resolves."""
    if ref.name is None:
        if index.find(ref.module) is not None:
            return None
        return _missing_module(index, ref.module)
    got = index.has(ref.module, ref.name)
    if got is None:
        return _missing_module(index, ref.module)
    if got:
        return None
    loc = index.find(ref.module)
    hint = _defined_elsewhere(index, ref.module.split(".")[0], ref.name)
    return f"{_rel(loc.path)} has no {ref.name}" + (f" (defined in {hint})" if hint else "")


def _missing_module(index: ModuleIndex, dotted: str) -> str:
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        parent = index.find(".".join(parts[:i]))
        if parent is not None:
            return f"no module {dotted} ({_rel(parent.dirs[0] if parent.dirs else parent.path)} has no {parts[i]})"
    return f"no module {dotted} ({parts[0]} is not installed)"


def _defined_elsewhere(index: ModuleIndex, top: str, name: str, limit: int = 3) -> str:
    """Where the package defines `name` now (a moved name): 'pkg/a.py:12'. Text search, failures only."""
    loc = index.find(top)
    if loc is None or not loc.dirs:
        return ""
    pat = re.compile(rf"^(?:class|def|async def)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]", re.M)
    hits = []
    for p, text in _sources(loc.dirs[0]):
        m = pat.search(text)
        if m:
            hits.append(f"{_rel(p)}:{text.count(chr(10), 0, m.start()) + 1}")
            if len(hits) >= limit:
                break
    return ", ".join(hits)


_SOURCES: dict[str, list[tuple[str, str]]] = {}


def _sources(root: str) -> list[tuple[str, str]]:
    """Every .py file under a package folder, read once per process (failures only need it)."""
    if root not in _SOURCES:
        out = []
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    p = os.path.join(dirpath, f)
                    try:
                        with open(p, encoding="utf-8", errors="replace") as fh:
                            out.append((p, fh.read()))
                    except OSError:
                        continue
        _SOURCES[root] = out
    return _SOURCES[root]


def module_imports(index: ModuleIndex, dotted: str) -> list[ImportRef]:
    s = index.summary(dotted)
    return s.imports if s else []
