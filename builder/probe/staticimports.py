"""The static import contract: does every name verl imports from the engine (or torch) exist in
what is installed? Read from the files' syntax trees, nothing imported, so it needs no GPU and
sees API drift that an import hides behind `libcuda.so.1: cannot open`.

A name is present in module M when M binds it at top level (any branch of an if/try), when
`M.name` is a submodule on disk, when M star-imports it (following `__all__`), or, conservatively,
when M is a native extension (.so), defines a module `__getattr__` (lazy re-exports), or rewrites
its own globals. Only a name that is certainly absent is reported.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

from .gates import DEAD, GATED, LIVE, Guards, installed_versions, reachability
from .summary import ImportRef, Summary, summarize

EXT_SUFFIX = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:\.[\w\-]+)?\.(?:so|pyd)$")


@dataclass
class Located:
    dotted: str
    kind: str  # "package" | "module" | "extension" | "namespace"
    path: str  # file (__init__.py for a package), or folder for a namespace package
    dirs: list[str] = field(default_factory=list)  # a package's folders (submodules live there)


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
