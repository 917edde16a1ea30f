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

Read from an installed verl's files by doctor (verl_config.base_config); recorded per release by
ci/record_verl_config.py.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from .probe.staticcalls import Trees

BATCHED_TOKENS = "batched_tokens"  # the rule's name in the record and in doctor
ROLLOUT_DIR = "verl/workers/rollout"


def refusals_of_tree(root: str | Path) -> list[dict]:
    """[{"rule", "class", "selected_by": [[name, mode], ...], "requires": {flag: bool}, "where",
    "message"}] from the verl source tree under `root` (the folder holding verl/)."""
    root = Path(root)
    selected = _class_selection(root)
    out, seen, trees = [], set(), Trees()
    for path in sorted((root / ROLLOUT_DIR).rglob("*.py")):
        tree = trees.get(str(path))
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
    """rollout class name -> the (rollout.name, rollout.mode) pairs that select it: the rollout
    registry as the verdict's registry check reads it."""
    from .probe.registry import rollout_registry

    return (rollout_registry(str(root / "verl")) or {}).get("selects") or {}


def wheel_members(name: str) -> bool:
    """The files of a verl wheel refusals_of_tree reads besides verl_choices.SOURCES (which holds
    what selects a rollout class: the registry and fsdp_workers)."""
    return (name.startswith(ROLLOUT_DIR + "/") and name.endswith(".py")
            and ".." not in name.split("/") and not os.path.isabs(name))
