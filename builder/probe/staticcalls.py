"""The static call-signature contract: does every call verl makes into the engine pass arguments
the installed engine's function, constructor or request dataclass accepts? Read from syntax trees
(nothing imported), beside the static import contract (staticimports.py).

A call is resolved through the module's imports (`from vllm import SamplingParams` then
`SamplingParams(n=2)`; `import vllm.x as vx` then `vx.f(...)`), the target followed through
re-exports to its `def` or `class`. A class is read through its `__init__` (its own or a base's it
can find), or as a dataclass, pydantic model or msgspec struct from its annotated fields. Drift is
a keyword the target has no parameter for (and no `**kwargs`), more positional arguments than it
takes, or a required parameter the call does not give. What cannot be read for certain (a
decorator that may rewrite the signature, a base class it cannot find, overloads) is unknown, never
drift. Scope: the same reachability as the import contract (code for other versions is not read;
behind a guard it cannot evaluate, a miss is a caveat).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .gates import DEAD, GATED, LIVE
from .staticimports import ModuleIndex, _reach, _rel
from .summary import CallRef, absolute_module

# Decorators that keep a function's signature (functools.wraps-style, or markers).
KEEPS_SIGNATURE = {"staticmethod", "classmethod", "property", "cached_property", "lru_cache", "cache", "wraps",
                   "abstractmethod", "no_grad", "inference_mode", "override", "deprecated", "contextmanager",
                   "asynccontextmanager", "final", "torch.no_grad", "torch.inference_mode"}
MAX_HOPS = 8


@dataclass
class Signature:
    where: str  # file:line of the def/class
    positional: list[str] = field(default_factory=list)  # positional-or-keyword (and positional-only) names
    posonly: int = 0  # how many of `positional` are positional-only
    kwonly: list[str] = field(default_factory=list)
    required: set[str] = field(default_factory=set)
    var_pos: bool = False
    var_kw: bool = False


@dataclass
class CallFinding:
    file: str
    line: int
    callee: str  # as resolved: vllm.sampling_params.SamplingParams
    problem: str  # "no parameter 'foo'" | "takes 2 positional arguments, given 3" | "missing 'x'"
    where: str  # the definition: file:line
    gated: bool = False


class Trees:
    def __init__(self):
        self.cache: dict[str, ast.Module | None] = {}
        self.sigs: dict[str, Signature | None] = {}  # target -> signature, once per process

    def get(self, path: str) -> ast.Module | None:
        if path not in self.cache:
            try:
                with open(path, "rb") as f:
                    self.cache[path] = ast.parse(f.read(), filename=path)
            except (OSError, SyntaxError, ValueError):
                self.cache[path] = None
        return self.cache[path]


def check_calls(index: ModuleIndex, dotted: str, tops: set[str], trees: Trees | None = None) -> list[CallFinding]:
    """Calls from module `dotted` into the top-level packages `tops` whose arguments the installed
    definition does not accept, in code the installed versions can run."""
    loc, s = index.find(dotted), index.summary(dotted)
    if loc is None or s is None or not s.calls:
        return []
    trees = trees or Trees()
    reach = _reach(index, s, loc)
    out = []
    for call in s.calls:
        state = max(call.state, reach.get(call.owner, LIVE) if call.owner else LIVE)
        if state == DEAD:
            continue
        target = _target(s.bindings, call.callee)
        if target is None or target.split(".")[0] not in tops:
            continue
        if target not in trees.sigs:
            trees.sigs[target] = _signature(index, trees, target)
        sig = trees.sigs[target]
        if sig is None:
            continue
        for problem in _compare(call, sig):
            out.append(CallFinding(_rel(loc.path), call.line, target, problem, sig.where, state == GATED))
    return out


def _target(bindings: dict, callee: str) -> str | None:
    parts = callee.split(".")
    b = bindings.get(parts[0])
    if not b:
        return None
    module, attr = b
    return ".".join([module] + ([attr] if attr else []) + parts[1:])


def _signature(index: ModuleIndex, trees: Trees, target: str) -> Signature | None:
    """The signature a call of `target` (module.name or module.Class.method) is checked against."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:i])
        loc = index.find(mod)
        if loc is None:
            continue
        if loc.kind not in ("package", "module"):
            return None  # a native extension: nothing to read
        rest = parts[i:]
        found = _find_def(index, trees, mod, rest[0], 0)
        if found is None:
            return None
        node, path, where_mod = found
        if len(rest) == 1:
            return _sig_of(index, trees, node, path, where_mod)
        if len(rest) == 2 and isinstance(node, ast.ClassDef):  # Class.classmethod / staticmethod
            m = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.name == rest[1]), None)
            if m is None:
                return None
            kinds = {_deco_name(d) for d in m.decorator_list}
            if "classmethod" in kinds:
                return _function_sig(m, path, drop=1)
            if "staticmethod" in kinds:
                return _function_sig(m, path, drop=0)
        return None
    return None


def _find_def(index: ModuleIndex, trees: Trees, module: str, name: str, hops: int):
    """(def or class node, file, module) binding `name` in `module`, through re-exports."""
    if hops > MAX_HOPS:
        return None
    loc = index.find(module)
    if loc is None or loc.kind not in ("package", "module"):
        return None
    tree = trees.get(loc.path)
    if tree is None:
        return None
    defs, imports, stars = [], [], []
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            defs.append(node)
        elif isinstance(node, ast.ImportFrom):
            src = absolute_module(node.module, node.level, module, loc.kind == "package")
            for a in node.names:
                if a.name == "*" and src:
                    stars.append(src)
                elif (a.asname or a.name) == name and src:
                    imports.append((src, a.name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            tgts = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in tgts):
                return None  # bound by an assignment: not a def we can read
    if len(defs) == 1 and not imports:
        return defs[0], loc.path, module
    if defs or len(imports) > 1:
        return None  # several definitions (overloads, per-platform branches): unknown
    if imports:
        src, attr = imports[0]
        if index.find(f"{src}.{attr}") is not None and index.find(src) is not None \
                and index.find(f"{src}.{attr}").kind in ("package", "module"):
            return None  # a submodule, not a callable
        return _find_def(index, trees, src, attr, hops + 1)
    for star in stars:
        got = _find_def(index, trees, star, name, hops + 1)
        if got is not None:
            return got
    return None


def _top_level(body):
    """Top-level statements, into if/try branches (both sides: definitions there are alternatives)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for h in node.handlers:
                yield from _top_level(h.body)
            yield from _top_level(node.orelse)
        else:
            yield node


def _deco_name(d) -> str:
    d = d.func if isinstance(d, ast.Call) else d
    if isinstance(d, ast.Attribute):
        base = d.value.id if isinstance(d.value, ast.Name) else ""
        return f"{base}.{d.attr}" if base == "torch" else d.attr
    return d.id if isinstance(d, ast.Name) else "?"


def _where(path: str, node) -> str:
    return f"{_rel(path)}:{node.lineno}"


def _function_sig(fn, path: str, drop: int) -> Signature | None:
    if any(_deco_name(d) not in KEEPS_SIGNATURE for d in fn.decorator_list):
        return None  # a decorator may rewrite the signature: unknown
    a = fn.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    n_defaults = len(a.defaults)
    required = set(pos[:len(pos) - n_defaults]) if n_defaults else set(pos)
    required |= {k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None}
    dropped = pos[:drop]
    return Signature(_where(path, fn), pos[drop:], max(0, len(a.posonlyargs) - drop), [k.arg for k in a.kwonlyargs],
                     required - set(dropped), a.vararg is not None, a.kwarg is not None)


def _sig_of(index, trees, node, path: str, module: str, hops: int = 0) -> Signature | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return _function_sig(node, path, drop=0)
    if not isinstance(node, ast.ClassDef) or hops > MAX_HOPS:
        return None
    decos = {_deco_name(d) for d in node.decorator_list}
    init = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == "__init__"), None)
    if init is not None:
        if any(n.name == "__new__" for n in node.body if isinstance(n, ast.FunctionDef)):
            return None
        return _function_sig(init, path, drop=1)
    if decos - {"dataclass", "final", "total_ordering"}:
        return None  # attrs, custom class decorators: unknown
    fields_kind = "dataclass" if "dataclass" in decos else None
    base_names = [b for b in (_dotted_expr(b) for b in node.bases) if b]
    if len(base_names) != len(node.bases) or any(k.arg == "metaclass" for k in node.keywords):
        return None
    if any(b.split(".")[-1] in ("BaseModel", "Struct") for b in base_names):
        fields_kind = fields_kind or "model"
    inherited = Signature(_where(path, node))
    for b in base_names:
        if b.split(".")[-1] in ("BaseModel", "Struct", "object", "Generic", "ABC", "Enum", "NamedTuple", "TypedDict"):
            if b.split(".")[-1] in ("Enum", "NamedTuple", "TypedDict"):
                return None
            continue
        got = _resolve_base(index, trees, module, b, hops)
        if got is None:
            return None
        bnode, bpath, bmod = got
        bsig = _sig_of(index, trees, bnode, bpath, bmod, hops + 1)
        if bsig is None:
            return None
        if fields_kind is None:
            return Signature(_where(path, node), bsig.positional, bsig.posonly, bsig.kwonly, bsig.required,
                             bsig.var_pos, bsig.var_kw)  # the base's __init__
        inherited = bsig
    if fields_kind is None:
        return None if base_names else Signature(_where(path, node))  # object(): no arguments
    return _fields_sig(node, path, inherited, fields_kind == "model", node.decorator_list)


def _dotted_expr(e) -> str | None:
    if isinstance(e, ast.Subscript):  # Generic[T], BaseModel[...]
        e = e.value
    parts = []
    while isinstance(e, ast.Attribute):
        parts.append(e.attr)
        e = e.value
    return ".".join([e.id, *reversed(parts)]) if isinstance(e, ast.Name) else None


def _resolve_base(index, trees, module: str, base: str, hops: int):
    """A base class named in `module` (defined there or imported into it)."""
    loc = index.find(module)
    s = index.summary(module)
    head, _, rest = base.partition(".")
    if s is not None and head in (s.bindings or {}) and s.bindings[head]:
        mod, attr = s.bindings[head]
        target = ".".join([mod] + ([attr] if attr else []) + ([rest] if rest else []))
        tmod, _, tname = target.rpartition(".")
        return _find_def(index, trees, tmod, tname, hops + 1) if tmod else None
    if not rest and loc is not None:
        return _find_def(index, trees, module, head, hops + 1)
    return None


def _fields_sig(node: ast.ClassDef, path: str, inherited: Signature, model: bool, decos) -> Signature | None:
    """A dataclass's (positional or keyword, in order) or a pydantic/msgspec model's (keyword)
    constructor from its annotated fields."""
    kw_only = model or any(isinstance(d, ast.Call) and any(k.arg == "kw_only" and isinstance(k.value, ast.Constant)
                                                             and k.value.value is True for k in d.keywords)
                           for d in decos)
    sig = Signature(_where(path, node), list(inherited.positional), 0, list(inherited.kwonly),
                    set(inherited.required), inherited.var_pos, inherited.var_kw)
    after_kw_only = False
    for st in node.body:
        if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("model_config", "Config")
                                              for t in st.targets):
            return None  # pydantic settings (extra=allow, aliases): unknown
        if isinstance(st, ast.ClassDef) and st.name == "Config":
            return None
        if not isinstance(st, ast.AnnAssign) or not isinstance(st.target, ast.Name):
            continue
        ann = ast.unparse(st.annotation)
        if "ClassVar" in ann:
            continue
        if ann.endswith("KW_ONLY"):
            after_kw_only = True
            continue
        name = st.target.id
        default = st.value is not None
        if isinstance(st.value, ast.Call) and _deco_name(st.value) in ("field", "Field"):
            kws = {k.arg: k.value for k in st.value.keywords}
            if "alias" in kws or "validation_alias" in kws:
                return None  # accepted under another name: unknown
            if isinstance(kws.get("init"), ast.Constant) and kws["init"].value is False:
                continue
            default = bool(st.value.args) or "default" in kws or "default_factory" in kws
        if name in sig.positional or name in sig.kwonly:
            continue
        (sig.kwonly if kw_only or after_kw_only else sig.positional).append(name)
        if not default:
            sig.required.add(name)
    return sig


def _compare(call: CallRef, sig: Signature) -> list[str]:
    names = set(sig.positional[sig.posonly:]) | set(sig.kwonly)
    out = []
    if not sig.var_kw:
        for k in call.keywords:
            if k not in names:
                out.append(f"no parameter {k!r}")
    if not call.star and not sig.var_pos and call.npos > len(sig.positional):
        out.append(f"takes {len(sig.positional)} positional argument(s), given {call.npos}")
    if not call.star and not call.kwsplat:
        given = set(sig.positional[:call.npos]) | set(call.keywords)
        missing = sorted(sig.required - given)
        if missing:
            out.append("missing " + ", ".join(repr(m) for m in missing))
    return out
