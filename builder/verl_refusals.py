"""The start-up refusals of verl's rollout that a config alone decides, read from verl's own code
(never a rule of ours): today the one every verl release up to 0.6 makes when its synchronous vLLM
rollout starts after the job waited in the queue —

    if max_num_batched_tokens < max_model_len and self.config.enable_chunked_prefill:
        raise ValueError("Enable chunked prefill, max_num_batched_tokens is smaller than max_model_len, ...")

(`verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py`, vLLMRollout.__init__). Each refusal is
recorded with the rollout class that makes it, the (rollout.name, rollout.mode) pairs that select
that class (verl's rollout registry, or the `sync`/`async` choice in fsdp_workers._build_rollout
before 0.6.1), the flags its test also requires, file:line and verl's message. Later releases hand
the limit to the engine (vLLM chunks the prefill), so nothing is found there and nothing is judged.

Read from an installed verl's files by doctor; recorded per release by ci/record_verl_config.py.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

BATCHED_TOKENS = "batched_tokens"  # the rule's name in the record and in doctor
ROLLOUT_DIR = "verl/workers/rollout"
# Files a recorder extracts from a wheel besides the rollout folder (what selects a class).
SELECTORS = ("verl/workers/rollout/base.py", "verl/workers/fsdp_workers.py")


def refusals_of_tree(root: str | Path) -> list[dict]:
    """[{"rule", "class", "selected_by": [[name, mode], ...], "requires": {flag: bool}, "where",
    "message"}] from the verl source tree under `root` (the folder holding verl/)."""
    root = Path(root)
    selected = _class_selection(root)
    out, seen = [], set()
    for path in sorted((root / ROLLOUT_DIR).rglob("*.py")):
        tree = _parse(path)
        for cls, node in _classes_and_ifs(tree):
            found = _token_limit_test(node.test)
            if found is not None and (path, node.lineno) in seen:
                continue
            seen.add((path, node.lineno))
            if found is None or not any(isinstance(n, ast.Raise) for s in node.body for n in ast.walk(s)):
                continue
            raise_node = next(n for s in node.body for n in ast.walk(s) if isinstance(n, ast.Raise))
            out.append({"rule": BATCHED_TOKENS, "class": cls, "selected_by": selected.get(cls, []),
                        "requires": found, "where": f"{path.relative_to(root).as_posix()}:{node.lineno}",
                        "message": _message(raise_node)})
    return out


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _classes_and_ifs(tree: ast.Module | None):
    """(enclosing class name, If node) for every `if` inside a class."""
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] if tree else []
    for cls in reversed(classes):  # innermost first: a nested class names its own ifs
        for node in ast.walk(cls):
            if isinstance(node, ast.If):
                yield cls.name, node


def _names(e: ast.AST) -> list[str]:
    return [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(e) if isinstance(n, (ast.Name, ast.Attribute))]


def _token_limit_test(test: ast.expr) -> dict | None:
    """`max_num_batched_tokens < max_model_len [and flag] [and not flag]` -> {flag: required value};
    None when the test is not that comparison."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    hit, requires = False, {}
    for p in parts:
        if isinstance(p, ast.Compare) and len(p.ops) == 1:
            left, right = _names(p.left), _names(p.comparators[0])
            if isinstance(p.ops[0], ast.Gt):
                left, right = right, left
            if isinstance(p.ops[0], (ast.Lt, ast.Gt)) and "max_num_batched_tokens" in left and "max_model_len" in right:
                hit = True
                continue
            return None
        negated = isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not)
        inner = p.operand if negated else p
        if isinstance(inner, (ast.Attribute, ast.Name)):
            requires[_names(inner)[0]] = not negated
        else:
            return None
    return requires if hit else None


def _message(node: ast.Raise) -> str:
    exc = node.exc
    args = exc.args if isinstance(exc, ast.Call) else []
    text = ""
    if args:
        a = args[0]
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            text = a.value
        elif isinstance(a, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in a.values)
    kind = getattr(getattr(exc, "func", None), "id", None) or "error"
    return f"{kind}: {' '.join(text.split())}".strip()


def _class_selection(root: Path) -> dict[str, list[list[str]]]:
    """rollout class name -> the (rollout.name, rollout.mode) pairs that select it."""
    out: dict[str, list[list[str]]] = {}
    base = _parse(root / SELECTORS[0])
    for node in ast.walk(base) if base else ():  # 0.6.1 on: {("vllm", "sync"): "...vLLMRollout", ...}
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            for k, v in zip(node.value.keys, node.value.values):
                if (isinstance(k, ast.Tuple) and len(k.elts) == 2 and isinstance(v, ast.Constant)
                        and isinstance(v.value, str) and all(isinstance(e, ast.Constant) for e in k.elts)):
                    out.setdefault(v.value.rpartition(".")[2], []).append([k.elts[0].value, k.elts[1].value])
    if out:
        return out
    workers = _parse(root / SELECTORS[1])  # 0.4, 0.5: `A if self.config.rollout.mode == "sync" else B`
    for fn in ast.walk(workers) if workers else ():
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "_build_rollout"):
            continue
        for branch in ast.walk(fn):
            engine = _engine_of(branch)
            if engine is None:
                continue
            for e in (n for s in branch.body for n in ast.walk(s)):
                if isinstance(e, ast.IfExp) and "mode" in _names(e.test) and _const(e.test) == "sync":
                    for cls, mode in ((e.body, "sync"), (e.orelse, "async")):
                        if isinstance(cls, ast.Name):
                            out.setdefault(cls.id, []).append([engine, mode])
    return out


def _engine_of(node: ast.AST) -> str | None:
    """"vllm" for `if rollout_name == "vllm":` (or `elif`)."""
    if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and "name" in " ".join(_names(node.test.left)):
        return _const(node.test)
    return None


def _const(test: ast.expr) -> str | None:
    if isinstance(test, ast.Compare) and len(test.comparators) == 1 and isinstance(test.ops[0], ast.Eq):
        c = test.comparators[0]
        if isinstance(c, ast.Constant) and isinstance(c.value, str):
            return c.value
    return None


def installed_refusals() -> list[dict]:
    from importlib.util import find_spec

    try:
        spec = find_spec("verl")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return refusals_of_tree(Path(list(spec.submodule_search_locations)[0]).parent)


def wheel_members(name: str) -> bool:
    """The files of a verl wheel refusals_of_tree reads."""
    return name in SELECTORS or (name.startswith(ROLLOUT_DIR + "/") and name.endswith(".py")
                                 and ".." not in name.split("/") and not os.path.isabs(name))
