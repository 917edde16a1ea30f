"""`envbuild lock [selectors]`: the command around envbuild.lock's Locker: resolve each
combination (in parallel, plan order kept), write its layer locks, say what happened."""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import InputError
from .index import Metadata
from .lock import Locker
from .lockmodel import LockResult, explain
from .matrix import matrix_from_args
from .expand import plan_from_args
from .outcome import exit_of_lock
from .progress import Progress
from .selector import add_selector_args



HEARTBEAT_S = 15.0  # piped: one plain stderr line this often while resolutions run


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("--out", default="locks", help="output folder (default: ./locks)")
    p.add_argument("--json", action="store_true", help="print one JSON object per combination")
    p.add_argument("-j", "--jobs", type=int, default=min(4, os.cpu_count() or 1),
                   help="combinations resolved at once (default: min(4, CPUs))")
    p.add_argument("--no-build", action="store_true",
                   help="refuse packages that have no wheel for the image (built from source otherwise, "
                        "with pinned build dependencies)")
    p.add_argument("--allow-build", action="append", default=[], metavar="NAME",
                   help="with --no-build: a package that may still be built from source (repeatable)")


def summary(r: LockResult, out: Path) -> str:
    """The text line(s) of one result: uv's explanation in full, wrapped."""
    c = r.combo
    line = f"{c.id}: {r.status}"
    if r.ok:
        line += (f" (as of {r.era}, {sum(len(l.packages) for l in r.layers)} packages"
                 f"{', cached' if r.cached else ''}) -> {out / c.id}")
    extra = [f"  note: {n}" for n in r.relaxed]
    if r.built_from_source:
        extra.append(f"  built from source: {', '.join(r.built_from_source)} (build constraints in "
                     f"{out / c.id / 'build-constraints.txt'})")
    if not r.ok:
        extra.append(explain(r.detail))
    return "\n".join([line] + extra)


def run(args) -> int:
    if args.jobs < 1:
        raise InputError("command line", None, "--jobs", args.jobs, "must be at least 1")
    meta = Metadata()
    m = matrix_from_args(args)
    pl = plan_from_args(args, meta)
    locker = Locker(m, meta, no_build=args.no_build, allow_build=tuple(args.allow_build))
    out = Path(args.out)
    worst = 0

    def one(c):
        r = locker.lock(c, out)
        if not r.ok:
            locker.write(r, out)
        return r

    def emit(r: LockResult):
        nonlocal worst
        c = r.combo
        if args.json:
            print(json.dumps({"id": c.id, "status": r.status, "lock_hash": r.lock_hash, "era": r.era,
                              "cached": r.cached, "detail": r.detail, "torch_index": r.torch_index,
                              "relaxed": r.relaxed, "built_from_source": r.built_from_source,
                              "layers": {l.name: l.packages for l in r.layers}}), flush=True)
        else:
            print(summary(r, out), flush=True)
        worst = max(worst, exit_of_lock(r.status))

    pool = ThreadPoolExecutor(max_workers=args.jobs, thread_name_prefix="envbuild-lock")
    interrupted = False
    try:
        with Progress("lock", len(pl.combos), "combinations", every=HEARTBEAT_S) as progress:
            futs = []
            for c in pl.combos:
                futs.append(pool.submit(progress.wrap(one, c.id), c))
            for f in futs:  # plan order, whatever order they finish in
                emit(f.result())
    except KeyboardInterrupt:
        interrupted = True  # the locks not started are cancelled; a running resolution is not waited for
        raise
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
    if os.environ.get("ENVBUILD_DEBUG"):
        print(f"uv resolutions run: {locker.uv_runs}", file=sys.stderr)
    return worst
