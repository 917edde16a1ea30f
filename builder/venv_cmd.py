"""`envbuild venv SELECTORS --wheelhouse DIR --out VENV`: a row installed offline into a venv and
checked (the command around envbuild.materialize)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import TrustError
from .materialize import Refused, check_lock, check_paths, materialize, read_manifest, record_refusal, select_row
from .probe.hardware import DEFAULT_PLATFORM, host_platform
from .selector import add_selector_args, selectors_from_args


def add_arguments(p) -> None:
    add_selector_args(p, matrix=False)
    p.add_argument("--wheelhouse", required=True, help="the folder `envbuild wheelhouse` wrote")
    p.add_argument("--out", required=True, help="the venv to make (a new folder)")
    p.add_argument("--node-python", default=sys.executable, help="the node's interpreter the venv is made from (default: this one)")
    p.add_argument("--host-packages", action="store_true",
                   help="reuse the node's own distributions where they are the lock's pins (listed in the venv)")
    p.add_argument("--results", metavar="DIR", help="record a refusal (the row cannot be judged on this node) here")
    p.add_argument("--table", default=None, metavar="PATH|URL",
                   help="a signed table: the wheelhouse's lock must be the one that table names for the row")
    p.add_argument("--pubkey", default=None, help="the key --table must verify with")
    p.add_argument("--json", action="store_true", help="print what was made as JSON")
    p.add_argument("--no-compile", action="store_true",
                   help="leave Python files uncompiled (a faster install; the first import compiles them)")
    p.add_argument("--no-kernels", action="store_true",
                   help="leave the engine's JIT kernels to its first use (as an image without nvcc does)")


def run(args) -> int:
    wheelhouse = Path(args.wheelhouse)
    manifest = read_manifest(wheelhouse)
    sel = selectors_from_args(args)
    if sel.platform is None:
        from dataclasses import replace

        sel = replace(sel, platform=host_platform() or DEFAULT_PLATFORM)
    row_id, row = select_row(manifest, sel)
    check_paths(wheelhouse, row)
    signed = None
    if args.table:
        from .trust import load_verified

        table, _ = load_verified(args.table, pubkey=args.pubkey, quiet=True)
        there = next((r for r in table.rows if r.id == row_id), None)
        if there is None or not there.lock_hash:
            raise TrustError(f"{args.table}: the signed table has no lock for {row_id}")
        signed = there.lock_hash
    lock_check = check_lock(wheelhouse, row, signed)
    try:
        info = materialize(row_id, row, wheelhouse, Path(args.out), args.node_python, args.host_packages,
                           compile_bytecode=not args.no_compile, compile_kernels=not args.no_kernels)
    except Refused as e:
        if args.results:
            record_refusal(args.results, row, str(e))
        raise
    info["lock_check"] = lock_check
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(f"{row_id}: {info['installed']} distributions installed, {len(info['reused'])} reused from the node "
              f"({info['seconds']['total']:.0f} s); {info['check']}; {lock_check}")
        for r in info["reused"]:
            print(f"  reused {r['name']} {r['version']}" + (f" (pin {r['pin']})" if r["pin"] != r["version"] else ""))
        for name, said in info.get("kernels", {}).items():
            print(f"  kernel {name}: {said}")
    return 0
