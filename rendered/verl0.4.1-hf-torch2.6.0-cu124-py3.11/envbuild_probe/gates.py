"""Version guards: which branches of verl's code run for the installed versions.

verl keeps code for several engine releases side by side and picks one by comparing a version
(`if vllm_version >= version.parse("0.20.0"): …`). The static contracts read that code without
running it; a branch written for another release is not drift of this one. A guard is evaluated
where one side is an installed package's version and the other a literal; anything else that
compares a package's version is "gated" (unknown), which makes a miss a caveat, not a failure.
Standard library only (it runs inside images).
"""

from __future__ import annotations

import ast
import re
from typing import Callable

LIVE, GATED, DEAD = 0, 1, 2  # a region's state: runs / runs only for versions not evaluated / never runs
STATE_NAMES = {LIVE: "live", GATED: "gated", DEAD: "dead"}
NOT_A_GUARD = "not-a-guard"

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(.*)$")
_PRE = re.compile(r"^[.\-_]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", re.I)
_PARSERS = {"parse", "Version", "parse_version", "LooseVersion", "StrictVersion"}
_OPS = {ast.Lt: lambda c: c < 0, ast.LtE: lambda c: c <= 0, ast.Gt: lambda c: c > 0,
        ast.GtE: lambda c: c >= 0, ast.Eq: lambda c: c == 0, ast.NotEq: lambda c: c != 0}


def release_key(text: str) -> tuple | None:
    """An ordering key for a version string: (release numbers without trailing zeros, 0 for a
    pre-release else 1). Local parts (+cu130) and post-releases sort with their release."""
    m = _RELEASE.match(str(text))
    if not m:
        return None
    nums = [int(x) for x in m.group(1).split(".")]
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    return tuple(nums), 0 if _PRE.match(m.group(2)) else 1


def compare(a: str, b: str) -> int | None:
    ka, kb = release_key(a), release_key(b)
    if ka is None or kb is None:
        return None
    return (ka > kb) - (ka < kb)


class Guards:
    """Evaluates `if` tests of one module. `version(pkg)` is the installed version of a top-level
    module (None when unknown); `known` the packages whose versions may be compared."""

    def __init__(self, tree: ast.Module, version: Callable[[str], str | None], known: set[str]):
        self.version, self.known = version, known
        self.values: dict[str, ast.expr] = {}
        self.returns: dict[str, ast.expr] = {}
        self.aliases: dict[str, str] = {}
        seen: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name in seen:
                    self.values.pop(name, None)  # a name assigned twice has no one value
                else:
                    self.values[name] = node.value
                seen.add(name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.args.args:
                body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                    self.returns[node.name] = body[0].value

    # -- what a side of a comparison is: ("pkg", top-level module) or ("lit", version text)
    def side(self, e: ast.expr, depth: int = 0) -> tuple[str, str] | None:
        if depth > 6:
            return None
        if isinstance(e, ast.Constant) and isinstance(e.value, str) and release_key(e.value):
            return "lit", e.value
        if isinstance(e, ast.Tuple) and e.elts and all(isinstance(x, ast.Constant) and isinstance(x.value, int)
                                                       for x in e.elts):
            return "lit", ".".join(str(x.value) for x in e.elts)
        if isinstance(e, ast.Attribute):
            if e.attr == "__version__" and isinstance(e.value, ast.Name):
                top = self.aliases.get(e.value.id, e.value.id)
                return ("pkg", top) if top in self.known else None
            if e.attr == "version_info" and isinstance(e.value, ast.Name) and e.value.id == "sys":
                return "pkg", "python"
            return None
        if isinstance(e, ast.Call):
            fn = e.func.attr if isinstance(e.func, ast.Attribute) else e.func.id if isinstance(e.func, ast.Name) else ""
            if fn in _PARSERS and len(e.args) == 1:
                return self.side(e.args[0], depth + 1)
            if fn.endswith("version") and len(e.args) == 1 and isinstance(e.args[0], ast.Constant) \
                    and e.args[0].value in self.known:  # importlib.metadata.version("vllm")
                return "pkg", e.args[0].value
            if fn in self.returns and not e.args:  # _get_vllm_version()
                return self.side(self.returns[fn], depth + 1)
            return None
        if isinstance(e, ast.Name):
            if e.id in self.values:
                return self.side(self.values[e.id], depth + 1)
            # A parameter or local named for the version it holds (`vllm_version`): its name says
            # which package; callers pass that package's version.
            words = set(re.split(r"[^a-z0-9]+", e.id.lower()))
            hits = [k for k in self.known if k in words]
            if "version" in words and len(hits) == 1:
                return "pkg", hits[0]
        return None

    def mentions_version(self, e: ast.expr) -> bool:
        """Does a test compare some known package's version (so an unevaluated one is a gate)?"""
        words: set[str] = set()
        for n in ast.walk(e):
            if isinstance(n, ast.Name):
                words |= set(re.split(r"[^a-z0-9]+", self.aliases.get(n.id, n.id).lower()))
            elif isinstance(n, ast.Attribute):
                words |= set(re.split(r"[^a-z0-9]+", n.attr.lower()))
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                words.add(n.value.lower())
        return bool(words & self.known) and any("version" in w for w in words)

    def test(self, e: ast.expr):
        """True / False when the guard is decided for the installed versions; None when it compares
        a version it cannot decide; NOT_A_GUARD otherwise."""
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            r = self.test(e.operand)
            return (not r) if isinstance(r, bool) else r
        if isinstance(e, ast.BoolOp):
            rs = [self.test(v) for v in e.values]
            if all(r == NOT_A_GUARD for r in rs):
                return NOT_A_GUARD
            stop = isinstance(e.op, ast.Or)  # or: any True decides; and: any False decides
            if stop in rs:
                return stop
            if all(isinstance(r, bool) for r in rs):
                return not stop
            return None if any(r is None for r in rs) else NOT_A_GUARD
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and type(e.ops[0]) in _OPS:
            a, b = self.side(e.left), self.side(e.comparators[0])
            if a and b and {a[0], b[0]} == {"pkg", "lit"}:
                pkg, lit = (a[1], b[1]) if a[0] == "pkg" else (b[1], a[1])
                have = self.version(pkg)
                c = compare(have, lit) if have else None
                if c is not None:
                    return _OPS[type(e.ops[0])](c if a[0] == "pkg" else -c)
                return None
        return None if self.mentions_version(e) else NOT_A_GUARD


def terminates(body: list[ast.stmt]) -> bool:
    """A block that never falls through (the statements after its `if` run only otherwise)."""
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def reachability(functions: set[str], uses: list[tuple[str, int, str | None]],
                 exported: Callable[[str], bool]) -> dict[str, int]:
    """The state of each top-level function: LIVE unless every use of it in its module lies in
    code that never runs (DEAD) or runs only for versions not evaluated (GATED) — uses inside
    another function count with that function's own state. A function used nowhere in its module
    or named by another module is LIVE (someone else may call it)."""
    reach = {f: LIVE for f in functions}
    for _ in range(len(functions) + 1):
        new = {}
        for f in functions:
            states = [max(st, reach.get(ow, LIVE) if ow else LIVE) for name, st, ow in uses
                      if name == f and ow != f]
            new[f] = min(states) if states else LIVE
            if new[f] != LIVE and exported(f):
                new[f] = LIVE
        if new == reach:
            break
        reach = new
    return reach


def installed_versions(paths: list[str] | None) -> Callable[[str], str | None]:
    """The version of a top-level module's distribution on these folders (sys.path when None),
    read from its metadata; Python's own for "python" when the folders are this interpreter's."""
    import importlib.metadata as md
    import platform

    table: dict[str, str] = {}

    def version(top: str) -> str | None:
        if top == "python":
            return platform.python_version() if paths is None else None
        if not table:
            for d in md.distributions(**({"path": paths} if paths is not None else {})):
                name = re.sub(r"[-_.]+", "-", (d.metadata["Name"] or "").lower())
                table.setdefault(name, d.version)
            table.setdefault("", "")
        return table.get(re.sub(r"[-_.]+", "-", top.lower())) or None
    return version
