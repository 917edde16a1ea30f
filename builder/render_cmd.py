"""`envbuild render [selectors]`: lock each planned combination and write its build context and
Dockerfile (the command around envbuild.render, which renders one combination)."""

from __future__ import annotations

import json
import sys

from .expand import plan_from_args
from .index import Metadata
from .lock import Locker
from .matrix import matrix_from_args
from .outcome import exit_of_lock
from .render import base_for, render_combo
from .selector import add_selector_args


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("--out", default="rendered", help="output folder (default: ./rendered)")
    p.add_argument("--locks", default="locks", help="where lock files go (default: ./locks)")
    p.add_argument("--base", default="nvidia", help="nvidia (default) | bootstrap | IMAGE")
    p.add_argument("--base-ref", default=None, help="the image for --base bootstrap (default: detect)")
    p.add_argument("--json", action="store_true", help="print what was rendered (or why not) as JSON")


def run(args) -> int:
    meta = Metadata()
    m = matrix_from_args(args)
    locker = Locker(m, meta)
    rc = 0
    report = []
    for c in plan_from_args(args, meta).combos:
        lock = locker.lock(c, args.locks)
        if not lock.ok:
            report.append({"id": c.id, "status": lock.status, "detail": lock.detail})
            if not args.json:
                print(f"{c.id}: not rendered: {lock.status}: {' '.join(lock.detail.split())}")
            rc = max(rc, exit_of_lock(lock.status))
            continue
        r = render_combo(c, lock, base_for(c, args.base, args.base_ref), args.out)
        report.append({"id": c.id, "status": "ok", "dockerfile": str(r.dockerfile), "content_hash": r.content_hash})
        if not args.json:
            print(f"{c.id}: {r.dockerfile} (content {r.content_hash[:12]})")
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        print()
    return rc
