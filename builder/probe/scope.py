"""Where a finding is reached: `core` (every run of this engine through verl's trainer with verl's
default config) or a scope a run opts into — a feature, a model type, a run-time guard.

Read from verl's code where it can be (the `if` around the finding, the model-type dispatch of
verl's monkey patch, the callers that pass an optional argument, the modules that import a module
at load time); from the feature descriptors in features.FEATURE_SPECS otherwise (module patterns).
A claim that a finding is opt-in must be supported: anything not determined counts as core and
says so. verl's rollout registry is read in probe.registry. Standard library only (runs inside
images and in the census).
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re

from .hardware import ACCELERATORS, KIND_OF_TORCH_ATTR
from .reach import import_sites, import_statements, named_in_strings, trainer_reach
from .staticcalls import Trees
from .staticimports import _sources
from .summary import words as _words
from .features import (CORE, FEATURE, FEATURE_SPECS, GUARD_SCOPE, MODEL_SCOPE, SCOPE_FROM_CODE, SCOPE_FROM_DATA,
                       SCOPE_UNDETERMINED, TRAINER_ENTRY, feature_default_on)

_CUDA_TESTS = ("is_available", "is_cuda_available", "get_device_name", "device_count")
# Capability checks only: `isinstance` or a `getattr(config, ...)` flag says nothing about whether
# the installed engine has what the line calls, and reading them as guards would hide core breaks.
_RUNTIME_TESTS = ("hasattr", "signature", "callable", "parameters")
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _scope(scope: str, source: str, why: str) -> dict:
    return {"scope": scope, "from": source, "why": why}


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def _model_type_values(words: list[str]) -> list[str]:
    """The model types an `if … model_type …` test names (its string constants, not its names)."""
    return sorted({w for w in words if w not in ("model_type", "config", "model", "hf_config")
                   and re.fullmatch(r"[a-z0-9_.\-]+", w)})


def _guard_hit(words: list[str], guard: str) -> bool:
    """`guard` (multi_stage_wake_up) names one of the identifiers, whole or as a run of its words."""
    g = _tokens(guard)
    for w in words:
        t = _tokens(w)
        if any(t[i:i + len(g)] == g for i in range(len(t) - len(g) + 1)):
            return True
    return False


class Scoper:
    """Scopes for the findings of one verl install (its package folder `root`)."""

    def __init__(self, root: str, verl_version: str | None = None, accelerator: str | None = None):
        self.root = root  # .../verl
        self.verl = verl_version
        # the kind of torch build judged (hardware.torch_build_kind); None: unknown, and code that
        # runs only on one kind's builds is then not ruled out
        self.accelerator = accelerator
        self._trees = Trees()  # syntax trees, parsed once
        self._models: dict[str, tuple[list[str], str]] | None = None
        self._importers: tuple | None = None  # _imports()
        self._by_path: dict[str, str] | None = None
        self._reach: set[str] | None = None

    # -- files
    def path_of(self, mod: str) -> str | None:
        rel = mod.split(".")[1:]
        base = os.path.join(self.root, *rel)
        for p in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(p):
                return p
        return None

    def rel(self, path: str) -> str:
        return os.path.relpath(path, os.path.dirname(self.root))

    def tree(self, path: str) -> ast.Module | None:
        return self._trees.get(path)

    def sources(self) -> list[tuple[str, str]]:
        return _sources(self.root)  # every .py file of verl, read once per process

    def module_of(self, path: str) -> str:
        rel = os.path.relpath(path, os.path.dirname(self.root))[:-3].split(os.sep)
        if rel[-1] == "__init__":
            rel = rel[:-1]
        return ".".join(rel)

    # -- the one question
    def scope(self, mod: str, line: int | None = None, function: bool = False, _depth: int = 0) -> dict:
        """{"scope", "from", "why"} of a finding at `line` of module `mod` (None: the module's import)."""
        found = None
        path = self.path_of(mod)
        if line is not None and path:
            found = self._guarded(path, line, _depth)
        if found is None:
            found = self._model_type(mod)
        if found is None:
            found = self._feature_module(mod, function)
        if found is None and _depth < 2:
            found = self._imported_lazily(mod, _depth)
        if found is None and self.reached() and mod not in self.reached():
            found = _scope(GUARD_SCOPE + "unreached", SCOPE_FROM_CODE, f"{mod} is outside what {TRAINER_ENTRY} "
                           "can load (probe.reach): no run of verl's trainer imports it")
        if found is None:
            return _scope(CORE, SCOPE_UNDETERMINED, "scope not determined: counts as core")
        name = found["scope"]
        if name in FEATURE and feature_default_on(name, self.verl):
            return _scope(CORE, found["from"], f"{found['why']}; on by default at verl {self.verl}")
        return found

    # -- 1. the code around the line
    def _guarded(self, path: str, line: int, depth: int) -> dict | None:
        tree = self.tree(path)
        if tree is None:
            return None
        chain = _enclosing(tree, line)
        func = next((n for n, _ in reversed(chain) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        for node, branch in reversed(chain):  # innermost first: the most specific guard
            where = f"{self.rel(path)}:{node.lineno}"
            if isinstance(node, ast.Try) and branch == "body":
                caught = {n for h in node.handlers for n in _handler_names(h)}
                if caught and caught <= _IMPORT_ERRORS:
                    return _scope(GUARD_SCOPE + "fallback", SCOPE_FROM_CODE, f"inside try/except ImportError at {where}")
                continue
            if not isinstance(node, ast.If):
                continue
            test, positive = node.test, branch == "body"
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, positive = test.operand, not positive
            words = _words(test)
            if "model_type" in words:
                types = _model_type_values(words)
                if types and positive:
                    return _scope(MODEL_SCOPE + ",".join(types), SCOPE_FROM_CODE,
                                  f"under `if … model_type …` at {where}")
            kind = _accelerator_test(test)
            if kind and self.accelerator and kind[0] != self.accelerator and kind[1] == positive:
                label = ACCELERATORS[kind[0]].label
                return _scope(GUARD_SCOPE + f"accelerator:{kind[0]}", SCOPE_FROM_CODE,
                              f"under `if {_short(test)}` at {where}: runs only on a {label} build of torch, "
                              f"and this one is {ACCELERATORS[self.accelerator].label}")
            for f in FEATURE_SPECS:
                if f.guards and any(_guard_hit(words, g) for g in f.guards) and positive:
                    return _scope(f.name, SCOPE_FROM_CODE, f"under `if {_short(test)}` at {where}")
            if positive and any(w in _CUDA_TESTS for w in words) and "cuda" in " ".join(words).lower():
                return _scope(GUARD_SCOPE + "gpu-only", SCOPE_FROM_CODE, f"under `if {_short(test)}` at {where}")
            if any(w in _RUNTIME_TESTS for w in words):
                return _scope(GUARD_SCOPE + "runtime-check", SCOPE_FROM_CODE, f"under `if {_short(test)}` at {where}")
            arg = _optional_arg(test, func, positive)
            if arg and depth < 2:
                return self._callers(func, arg, where, depth)
        return None

    def _callers(self, func, arg: str, where: str, depth: int) -> dict:
        """A branch taken only when `arg` (default None) is passed: the scope of verl's calls that pass it."""
        pat = re.compile(rf"\b{re.escape(func.name)}\s*\(")
        sites = []
        for p, text in self.sources():
            if func.name not in text or not pat.search(text):
                continue
            tree = self.tree(p)
            for n in ast.walk(tree) if tree else ():
                if isinstance(n, ast.Call) and _callee_name(n.func) == func.name and any(
                        k.arg == arg and not (isinstance(k.value, ast.Constant) and k.value.value is None)
                        for k in n.keywords):
                    sites.append((p, n.lineno))
        what = f"{func.name}(…, {arg}=…)"
        if not sites:
            return _scope(GUARD_SCOPE + f"argument:{arg}", SCOPE_FROM_CODE,
                          f"runs only when a caller passes {arg} ({where}); no call in verl passes it")
        scopes = [(p, ln, self.scope(self.module_of(p), ln, True, depth + 1)) for p, ln in sites]
        core = [(p, ln) for p, ln, s in scopes if s["scope"] == CORE]
        if core:
            p, ln = core[0]
            return _scope(CORE, SCOPE_FROM_CODE, f"{self.rel(p)}:{ln} calls {what} unguarded ({where})")
        names = sorted({s["scope"] for _, _, s in scopes})
        p, ln, s = scopes[0]
        return _scope(names[0] if len(names) == 1 else GUARD_SCOPE + f"argument:{arg}", SCOPE_FROM_CODE,
                      f"runs only when a caller passes {arg} ({where}); verl passes it only at "
                      + ", ".join(f"{self.rel(p)}:{ln} ({s['why']})" for p, ln, s in scopes[:3]))

    # -- 2. verl's model patches, dispatched on model_type (monkey_patch.py)
    def _model_type(self, mod: str) -> dict | None:
        if self._models is None:
            self._models = self._read_models()
        hit = self._models.get(mod)
        if hit:
            types, where = hit
            return _scope(MODEL_SCOPE + ",".join(types), SCOPE_FROM_CODE, f"imported only for model_type "
                          f"{', '.join(types)} ({where})")
        return None

    def _read_models(self) -> dict[str, tuple[list[str], str]]:
        path = self.path_of("verl.models.transformers.monkey_patch")
        tree = self.tree(path) if path else None
        out: dict[str, tuple[list[str], str]] = {}
        if tree is None:
            return out

        def visit(body, types: list[str]):
            for node in body:
                if isinstance(node, ast.If):
                    words = _words(node.test)
                    mine = types
                    if "model_type" in words:
                        mine = _model_type_values(words) or types
                    visit(node.body, mine)
                    visit(node.orelse, types)
                    continue
                if isinstance(node, ast.ImportFrom) and types:
                    target = node.module or ""
                    if node.level:
                        target = "verl.models.transformers" + (f".{target}" if target else "")
                    names = [target] if target != "verl.models.transformers" else \
                        [f"verl.models.transformers.{a.name}" for a in node.names]
                    for t in names:
                        if t.startswith("verl.models.transformers.") and t != "verl.models.transformers.monkey_patch":
                            prev = out.get(t, ([], ""))[0]
                            out[t] = (sorted(set(prev) | set(types)), f"{self.rel(path)}:{node.lineno}")
                for field in ("body", "orelse", "finalbody", "handlers"):
                    sub = getattr(node, field, None)
                    if isinstance(sub, list):
                        visit([x for x in sub if isinstance(x, ast.stmt)], types)
                for h in getattr(node, "handlers", None) or []:
                    visit(h.body, types)
        visit(tree.body, [])
        # A module that any code outside the model-type branches imports is not model-specific.
        for m in list(out):
            if self._imported_unguarded(m, exclude=path):
                del out[m]
        return out

    def _imported_unguarded(self, mod: str, exclude: str | None = None) -> bool:
        """Whether a module the trainer's entry can reach (`reached`) imports `mod` at load time."""
        leaf = mod.rsplit(".", 1)[-1]
        reach = self.reached()
        for p, text in self.sources():
            if p == exclude or leaf not in text or (reach and self.module_of(p) not in reach):
                continue
            if any(m == mod for m in self._top_imports(p)):
                return True
        return False

    # -- 3. data: the feature descriptors' module patterns
    def _feature_module(self, mod: str, function: bool) -> dict | None:
        """A finding inside a function of a feature's module runs when the feature calls it; one at
        module level runs whenever the module loads, so it is core if a module outside the feature
        imports it at load time."""
        for f in FEATURE_SPECS:
            if any(fnmatch.fnmatchcase(mod, pat) for pat in f.modules):
                importer = None if function else self._loaded_by(mod, f)
                if importer:
                    return _scope(CORE, SCOPE_FROM_CODE, f"a module of feature {f.name}, but {importer} imports it "
                                  "at load time")
                aside = None if function else self._loaded_by(mod, f, reached_only=False)
                return _scope(f.name, SCOPE_FROM_DATA, f"a module only feature {f.name} loads ({f.label})"
                              + (f"; {aside} imports it at load time, but {TRAINER_ENTRY} never loads that module"
                                 if aside else ""))
        return None

    def _loaded_by(self, mod: str, f, reached_only: bool = True) -> str | None:
        """A module outside the feature, in the trainer's reach (unless `reached_only` is off), that
        imports `mod` at module level (so it loads on runs without the feature): file:line, or None."""
        reach = self.reached() if reached_only else set()
        for entry in self._imports()[0].get(mod, []):
            src, where = entry.split("\0")
            if src != mod and not any(fnmatch.fnmatchcase(src, pat) for pat in f.modules) \
                    and not mod.startswith(src + ".") and self._model_type(src) is None \
                    and (not reach or src in reach):
                return where
        return None

    # -- 4. a module verl imports only inside functions or branches: the scope of those imports
    def _imported_lazily(self, mod: str, depth: int) -> dict | None:
        """Code in a module that nothing imports at load time runs only where an import statement
        of it runs: core if one of them is, else their one scope. None (not determined) when the
        module is imported at load time, or named in a string (importlib, a registry)."""
        top, every, named = self._imports()
        if mod in top or any((mod == n or (n.endswith(".*") and mod.startswith(n[:-1]))) and srcs - {mod}
                             for n, srcs in named.items()):
            return None
        sites = [(p, ln) for p, ln in every.get(mod, []) if self.module_of(p) != mod]
        if not sites:
            return None
        scopes = [(p, ln, self.scope(self.module_of(p), ln, True, depth + 1)) for p, ln in sites]
        names = {s["scope"] for _, _, s in scopes}
        p, ln, s = scopes[0]
        if len(names) != 1 or CORE in names:
            core = next(((q, n) for q, n, t in scopes if t["scope"] == CORE), (p, ln))
            return _scope(CORE, SCOPE_FROM_CODE, f"{self.rel(core[0])}:{core[1]} imports {mod}"
                          + (" where nothing rules it out" if CORE in names else " under different conditions"))
        return _scope(s["scope"], s["from"], f"{mod} is imported only at {self.rel(p)}:{ln}"
                      + (f" and {len(scopes) - 1} more" if len(scopes) > 1 else "") + f" ({s['why']})")

    def _imports(self) -> tuple[dict[str, list[str]], dict[str, list[tuple[str, int]]], dict[str, set[str]]]:
        """Read once per install: who imports each module at load time ("importer NUL file:line"), every
        import statement of each module (file, line), and the modules named in strings (by whom)."""
        if self._importers is None:
            top, every, named = {}, {}, {}  # the types: the return annotation
            for p, text in self.sources():
                src = self.module_of(p)
                for target, line in self._top_imports(p, lines=True):
                    top.setdefault(target, []).append(f"{src}\0{self.rel(p)}:{line}")
                here = src.split(".")
                for target, line in import_sites(text, here if p.endswith("__init__.py") else here[:-1]):
                    every.setdefault(target, []).append((p, line))
                for n in named_in_strings(text):
                    named.setdefault(n, set()).add(src)
            self._importers = (top, every, named)
        return self._importers

    def reached(self) -> set[str]:
        """What the trainer's entry can load (probe.reach); empty without one: nothing ruled out."""
        if self._reach is None:
            self._reach = trainer_reach(self.root)
        return self._reach

    def _top_imports(self, path: str, lines: bool = False):
        """Modules imported at module level (column 0: not in a function, not under try/if) by a file."""
        here = self.module_of(path).split(".")
        out = import_statements(self._text(path), here if path.endswith("__init__.py") else here[:-1], _TOP_IMPORT)
        return out if lines else [mod for mod, _ in out]

    def _text(self, path: str) -> str:
        if self._by_path is None:
            self._by_path = dict(self.sources())
        return self._by_path.get(path, "")


_TOP_IMPORT = re.compile(r"^(?:import[ \t]+(?P<plain>[\w., \t]+)$|from[ \t]+(?P<dots>\.*)(?P<mod>[\w.]*)[ \t]+import[ \t]+"
                         r"(?P<names>\([^)]*\)|[^\n]*))", re.M)


# ---------------------------------------------------------------- helpers

def _enclosing(tree: ast.Module, line: int) -> list[tuple[ast.AST, str]]:
    """(node, branch) from the outermost block to the innermost that holds `line`."""
    chain: list[tuple[ast.AST, str]] = []

    def holds(n) -> bool:
        end = getattr(n, "end_lineno", None) or getattr(n, "lineno", 0)
        return getattr(n, "lineno", 0) <= line <= end

    def visit(body):
        for n in body:
            if not holds(n):
                continue
            if isinstance(n, ast.If):
                if holds(n.test):
                    return
                for branch in ("body", "orelse"):
                    sub = getattr(n, branch)
                    if any(holds(s) for s in sub):
                        chain.append((n, branch))
                        visit(sub)
                        return
                return
            if isinstance(n, ast.Try) or type(n).__name__ == "TryStar":
                if any(holds(s) for s in n.body):
                    chain.append((n, "body"))
                    visit(n.body)
                    return
                for h in n.handlers:
                    if holds(h):
                        chain.append((n, "handler"))
                        visit(h.body)
                        return
                for branch in ("orelse", "finalbody"):
                    if any(holds(s) for s in getattr(n, branch)):
                        visit(getattr(n, branch))
                        return
                return
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                chain.append((n, "body"))
                visit(n.body)
                return
            for branch in ("body", "orelse"):
                sub = getattr(n, branch, None)
                if isinstance(sub, list) and any(holds(s) for s in sub if isinstance(s, ast.stmt)):
                    visit(sub)
                    return
            return
    visit(tree.body)
    return chain


def _accelerator_test(test: ast.expr) -> tuple[str, bool] | None:
    """(kind, True) for a test that holds only on that kind's torch builds (`torch.version.hip`,
    `torch.version.hip is not None`); (kind, False) for its negation (`… is None`); else None."""
    holds = True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value is None and isinstance(test.ops[0], (ast.Is, ast.IsNot)):
        holds, test = isinstance(test.ops[0], ast.IsNot), test.left
    if isinstance(test, ast.Attribute) and test.attr in KIND_OF_TORCH_ATTR and isinstance(test.value, ast.Attribute) \
            and test.value.attr == "version" and _short(test.value.value) == "torch":
        return KIND_OF_TORCH_ATTR[test.attr], holds
    return None


def _handler_names(h: ast.ExceptHandler) -> list[str]:
    if h.type is None:
        return ["BaseException"]
    types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
    return [x.id if isinstance(x, ast.Name) else x.attr if isinstance(x, ast.Attribute) else "?" for x in types]


def _callee_name(f: ast.AST) -> str | None:
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _optional_arg(test: ast.expr, func, positive: bool) -> str | None:
    """`x is not None` / `x` (positive branch) or `x is None` (else branch) for a parameter x of the
    enclosing function whose default is None: the branch runs only when a caller passes x."""
    if func is None:
        return None
    a = func.args
    params = a.args + a.kwonlyargs
    defaults = dict(zip([p.arg for p in a.args][len(a.args) - len(a.defaults):], a.defaults))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    none_default = {p.arg for p in params if isinstance(defaults.get(p.arg), ast.Constant)
                    and defaults[p.arg].value is None}
    if isinstance(test, ast.Name) and test.id in none_default and positive:
        return test.id
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
            and test.left.id in none_default and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value is None:
        if isinstance(test.ops[0], ast.IsNot) and positive:
            return test.left.id
        if isinstance(test.ops[0], ast.Is) and not positive:
            return test.left.id
    return None


def _short(e: ast.expr) -> str:
    try:
        s = ast.unparse(e)
    except Exception:  # noqa: BLE001 - a label only
        s = "…"
    return s if len(s) <= 60 else s[:59] + "…"
