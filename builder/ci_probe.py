"""`envbuild ci probe [selectors]`: probe the images a results folder records, on this machine
(the workflow's GPU runners), one record per image."""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import InputError
from .expand import plan_from_args
from .outcome import exit_of_records
from .probe_run import jobs_from_results, probe_levels, record_probe
from .selector import add_selector_args
from .probe.vocab import LEVELS


def add_arguments(pr) -> None:
    add_selector_args(pr)
    pr.add_argument("--results", default="results", help="results folder with the build records (default ./results)")
    pr.add_argument("--levels", default="contract,gpu", help="comma-separated probe levels (default contract,gpu)")
    pr.add_argument("--timeout", type=float, help="seconds per level (default: the probe's per-level default)")


def run(args) -> int:
    """Probe the images a results folder records, on this machine (the workflow's GPU runners)."""
    levels = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    for lv in levels:
        if lv not in LEVELS:
            raise InputError("command line", None, "--levels", lv, f"not a probe level ({', '.join(LEVELS)})")
    results = Path(args.results)
    jobs, missing = jobs_from_results(results, plan_from_args(args).combos)
    for cid in missing:
        print(f"{cid}: no image recorded in {results}; nothing to probe", file=sys.stderr)
    statuses = []
    for job in jobs:
        verdicts = probe_levels(job.target(), levels, timeout=args.timeout)
        rec = record_probe(results, job, verdicts)
        statuses.append(rec.status)
        print(f"{job.combo['id']}: {rec.status}" + (f" ({rec.cause})" if rec.cause else "") + " - "
              + ", ".join(f"{lv} {v.status}" for lv, v in verdicts.items()))
    return exit_of_records(statuses, incomplete=bool(missing))
