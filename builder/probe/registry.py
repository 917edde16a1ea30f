"""verl's rollout registry, read from its code: which rollout names (and modes) the trainer can
select at this release, and which rollout class each (name, mode) selects. The verdict's registry
check, doctor's accepted values and verl_refusals all read it here. Standard library only (runs
inside images and in the census).
"""

from __future__ import annotations

import ast
import os

from .staticcalls import Trees
from .summary import words

BASE = ("workers", "rollout", "base.py")  # _ROLLOUT_REGISTRY (0.6.1 on)
WORKERS = ("workers", "fsdp_workers.py")  # _build_rollout (0.4, 0.5)


def rollout_registry(root: str) -> dict | None:
    """The rollout names verl's trainer can select at this release, read from its code:
    `_ROLLOUT_REGISTRY` in workers/rollout/base.py (0.6.1 on), else the if/elif over the rollout
    name in fsdp_workers._build_rollout (0.4, 0.5). {"names", "where", "selects"}: selects maps a
    rollout class name to the [rollout.name, rollout.mode] pairs that select it (the registry's
    keys; before it, `A if ...mode == "sync" else B` in the engine's branch); from the registry's
    keys also "modes". None when neither is there."""
    trees = Trees()
    path = os.path.join(root, *BASE)
    tree = trees.get(path)
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and "REGISTRY" in t.id.upper() for t in targets):
                names, modes, selects = [], [], {}
                for k, v in zip(node.value.keys, node.value.values):
                    first = k.elts[0] if isinstance(k, ast.Tuple) and k.elts else k
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        names.append(first.value)
                    second = k.elts[1] if isinstance(k, ast.Tuple) and len(k.elts) > 1 else None
                    if isinstance(second, ast.Constant) and isinstance(second.value, str):
                        modes.append(second.value)  # ("vllm", "async"): the rollout.mode values
                        if isinstance(first, ast.Constant) and isinstance(v, ast.Constant) and isinstance(v.value, str):
                            selects.setdefault(v.value.rpartition(".")[2], []).append([first.value, second.value])
                if names:
                    return {"names": sorted(set(names)), "modes": sorted(set(modes)), "selects": selects,
                            "where": f"{_rel(root, path)}:{node.lineno}"}
    path = os.path.join(root, *WORKERS)
    tree = trees.get(path)
    for fn in ast.walk(tree) if tree else ():
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name == "_build_rollout":
            names, line, selects = set(), fn.lineno, {}
            for n in ast.walk(fn):
                if isinstance(n, ast.Compare) and any("name" in w for w in words(n.left)):
                    for c in n.comparators:
                        for x in (c.elts if isinstance(c, (ast.Tuple, ast.List)) else [c]):
                            if isinstance(x, ast.Constant) and isinstance(x.value, str):
                                names.add(x.value)
                engine = _engine_branch(n)
                for e in (x for s in n.body for x in ast.walk(s)) if engine else ():
                    if isinstance(e, ast.IfExp) and "mode" in words(e.test) and _compared_to(e.test) == "sync":
                        for cls, mode in ((e.body, "sync"), (e.orelse, "async")):
                            if isinstance(cls, ast.Name):
                                selects.setdefault(cls.id, []).append([engine, mode])
            if names:
                return {"names": sorted(names), "selects": selects, "where": f"{_rel(root, path)}:{line}"}
    return None


def _compared_to(test: ast.expr) -> str | None:
    """"sync" for `x == "sync"`."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        c = test.comparators[0]
        if isinstance(c, ast.Constant) and isinstance(c.value, str):
            return c.value
    return None


def _engine_branch(node: ast.AST) -> str | None:
    """"vllm" for the branch `if rollout_name == "vllm":` (or its elif)."""
    if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and any("name" in w for w in words(node.test.left)):
        return _compared_to(node.test)
    return None


def _rel(root: str, path: str) -> str:
    """verl/workers/... : the path from the folder that holds verl/."""
    return os.path.relpath(path, os.path.dirname(os.path.normpath(root)))
