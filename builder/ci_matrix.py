"""`envbuild ci matrix [selectors]`: the plan as {"include": [...]} for a workflow's
strategy.matrix (fromJson), each row naming exactly one combination."""

from __future__ import annotations

import json

from .matrix import plan_from_args
from .probe.vocab import ENGINE
from .selector import add_selector_args



def combo_selectors(c) -> str:
    """Selectors naming exactly one combination (every axis given)."""
    eng = f"--{c.engine} {c.engine_version}" if ENGINE[c.engine].versioned else f"--{c.engine}"
    return f"--verl {c.verl} {eng} --torch {c.torch} --cuda {c.cuda} --python {c.python} --platform {c.platform}"


def matrix_json(pl) -> dict:
    return {"include": [{"id": c.id, "cuda": c.cuda, "platform": c.platform, "selectors": combo_selectors(c)}
                        for c in pl.combos]}




def add_arguments(p) -> None:
    add_selector_args(p)


def run(args) -> int:
    print(json.dumps(matrix_json(plan_from_args(args)), separators=(",", ":")))
    return 0
