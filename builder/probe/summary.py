"""One file's syntax tree, summarized for the static contracts (probe.staticimports, staticcalls):
what it binds at top level, what it imports and calls and from where, each with the guards
around it (try/except ImportError, TYPE_CHECKING, version checks the gates evaluate). Nothing
imported: the file is parsed, never run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .gates import DEAD, GATED, LIVE, NOT_A_GUARD, terminates


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


def words(e: ast.AST) -> list[str]:
    """The names, attribute names and string constants an expression holds, outermost first."""
    out = []
    for n in ast.walk(e):
        if isinstance(n, ast.Name):
            out.append(n.id)
        elif isinstance(n, ast.Attribute):
            out.append(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
    return out


def absolute_module(module: str | None, level: int, here: str, is_pkg: bool) -> str | None:
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
        mod = absolute_module(node.module, node.level, dotted, is_pkg)
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
