"""`envbuild publish`: fold result records into the signed compatibility table (the command around
envbuild.table.publish)."""

from __future__ import annotations

import json
import os
import sys

from . import recordsig
from .table import DEFAULT_EXPIRES_DAYS, publish

DEFAULT_RESULTS = "results"
DEFAULT_OUT = "table"
DEFAULT_KEY = os.path.join("keys", "envbuild.key")


def add_arguments(p) -> None:
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"results directory (default: {DEFAULT_RESULTS})")
    p.add_argument("--key", default=os.environ.get("ENVBUILD_SIGNING_KEY", DEFAULT_KEY),
                   help=f"Ed25519 private key PEM (default: $ENVBUILD_SIGNING_KEY or {DEFAULT_KEY})")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output: a symlink to the current site, switched atomically (default: {DEFAULT_OUT})")
    p.add_argument("--expires-days", type=float, default=DEFAULT_EXPIRES_DAYS, metavar="N",
                   help=f"readers refuse the table N days after publishing (default: {DEFAULT_EXPIRES_DAYS}); "
                        "publish again before then")
    p.add_argument("--name", default=None, metavar="NAME",
                   help="the table's series: every table of this name signed by this key is one table to readers, "
                        "wherever it is published (default: $ENVBUILD_TABLE_NAME, else the matrix's repository)")
    p.add_argument("--matrix", default=None, help="matrix YAML whose repository names the table (default: the bundled one)")
    recordsig.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print what was published as JSON")


def table_name(args) -> str:
    if args.name:
        return args.name
    if os.environ.get("ENVBUILD_TABLE_NAME"):
        return os.environ["ENVBUILD_TABLE_NAME"]
    from .matrix import load_matrix
    from .paths import default_matrix

    return load_matrix(args.matrix or default_matrix()).repository


def run(args) -> int:
    from .sign import load_signer

    only, refused = recordsig.from_arguments(args, load_signer(args.key))
    table = publish(args.results, args.key, args.out, args.expires_days, name=table_name(args), refused=refused,
                    only=only)
    for why in refused:
        print(f"envbuild publish: not folded: {why}", file=sys.stderr)
    c = table.counts
    if getattr(args, "json", False):
        print(json.dumps({"out": str(args.out), "rows": len(table.rows), "counts": c, "keyid": table.keyid,
                          "serial": table.serial, "expires": table.expires, "name": table.name,
                          "table_id": table.table_id}, indent=2, sort_keys=True))
        return 0
    print(f"{len(table.rows)} combinations: {c['verified']} verified, {c['broken']} broken, "
          f"{c['untested']} untested, {c['unpinned']} unpinned")
    print(f"wrote {args.out}/compat.json (+ .dsse), compat.md, index.html, pubkey.json (keyid {table.keyid}); "
          f"table {table.name} ({table.table_id}), serial {table.serial}, expires {table.expires}")
    return 0
