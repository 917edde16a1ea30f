"""`envbuild ci matrix [selectors]`: the plan as {"include": [...]} for a workflow's
strategy.matrix (fromJson), each row naming exactly one combination."""

from __future__ import annotations

import json

from .expand import plan_from_args
from .outcome import RECORD_FAIL
from .probe.vocab import ENGINE
from .selector import add_selector_args



def combo_selectors(c) -> str:
    """Selectors naming exactly one combination (every axis given)."""
    eng = f"--{c.engine} {c.engine_version}" if ENGINE[c.engine].versioned else f"--{c.engine}"
    return f"--verl {c.verl} {eng} --torch {c.torch} --cuda {c.cuda} --python {c.python} --platform {c.platform}"


def matrix_json(pl, skip: set[str] = frozenset()) -> dict:
    return {"include": [{"id": c.id, "cuda": c.cuda, "platform": c.platform, "selectors": combo_selectors(c)}
                        for c in pl.combos if c.id not in skip]}


def condemned(results: str) -> set[str]:
    """Combinations whose newest census failed (envbuild census): not worth an image tonight."""
    from .record import is_census, iter_records
    newest: dict = {}
    for r in iter_records(results):
        if is_census(r):
            cid = r.combo.get("id")
            if cid not in newest or r.run_id > newest[cid].run_id:
                newest[cid] = r
    return {cid for cid, r in newest.items() if r.status == RECORD_FAIL}


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("--skip-condemned", metavar="RESULTS",
                   help="leave out combinations whose newest census in RESULTS failed")


def run(args) -> int:
    skip = condemned(args.skip_condemned) if args.skip_condemned else set()
    print(json.dumps(matrix_json(plan_from_args(args), skip), separators=(",", ":")))
    return 0
