"""`envbuild ci sign-records --results DIR --job NAME --key KEY`: a job signs the records it wrote
before they leave its runner, so that publish folds them (`publish --signed-records`) and nothing
added to the artifacts on the way (envbuild.recordsig)."""

from __future__ import annotations

import os

from .recordsig import sign_records
from .sign import load_signer


def add_arguments(p) -> None:
    p.add_argument("--results", default="results", help="results folder whose new records to sign (default: results)")
    p.add_argument("--job", required=True, help="this job's name, one per run (the envelope: RESULTS/signatures/JOB.dsse.json)")
    p.add_argument("--combo", action="append", default=None, metavar="ID",
                   help="a combination this job speaks for (repeatable); a record of another one is refused "
                        "(default: the records' own)")
    p.add_argument("--run", default=os.environ.get("GITHUB_RUN_ID") or None, metavar="ID",
                   help="the CI run (default: $GITHUB_RUN_ID)")
    p.add_argument("--key", required=True, help="the record key (Ed25519 private PEM)")


def run(args) -> int:
    signer = load_signer(args.key)  # a bad key fails before anything is read
    got = sign_records(args.results, signer, job=args.job, run=args.run, combos=args.combo)
    if got["envelope"] is None:
        print(f"sign-records: no new record under {args.results}: nothing signed")
    else:
        print(f"sign-records: {len(got['records'])} record(s) of {', '.join(got['combos'])} signed as job "
              f"{args.job} of run {args.run} -> {got['envelope']}")
    return 0
