"""`envbuild plan`: expand and filter the matrix, one row per combination."""

from __future__ import annotations

import json
import os
import shutil
import sys

from .index import Metadata, snapshot
from .matrix import matrix_from_args
from .expand import plan_from_args
from .paths import metadata_snapshot_for_write
from .selector import add_selector_args
from .probe.vocab import dist_of


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("--json", action="store_true", help="print a JSON list of combinations")
    p.add_argument("--all", action="store_true", help="also list excluded combinations and why")
    p.add_argument("--refresh-metadata", action="store_true",
                   help="re-read the matrix's releases from the index and rewrite matrix/metadata.json")


def run(args) -> int:
    meta = Metadata()
    if args.refresh_metadata:
        _refresh(args, meta)
    pl = plan_from_args(args, meta)
    rows = [c.to_dict() for c in pl.combos]
    if args.json:
        out = rows
        if args.all:
            out = {"combos": rows, "excluded": [{**e.combo.to_dict(), "reason": e.reason} for e in pl.excluded]}
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    cols = ["id", "platform", "cuda", "python", "torch", "engine", "engine_version", "verl"]
    widths = [max([len(c)] + [len(str(r[c])) for r in rows]) for c in cols]
    # A terminal narrower than the table: the id holds every other column, so those go first,
    # right to left, until it fits (piped output keeps them all, unless COLUMNS says otherwise).
    room = _terminal_columns()
    while room and len(cols) > 1 and sum(widths) + 2 * (len(cols) - 1) > room:
        cols.pop(), widths.pop()
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c] or "-").ljust(w) for c, w in zip(cols, widths)))
    image = matrix_from_args(args).repository
    print(f"{len(rows)} combination(s)" + (f", {len(pl.excluded)} excluded" if pl.excluded else "")
          + f"; each image is tagged {image}:<ID> (plus <ID>-<content hash> once rendered)")
    if args.all:
        for e in pl.excluded:
            print(f"excluded {e.combo.id}: {e.reason}")
    return 0


def _terminal_columns() -> int | None:
    """The terminal's width when stdout is one (or COLUMNS is set); None for a pipe."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _refresh(args, meta) -> None:
    """Fetch metadata for every release the matrix names and record it (matrix/metadata.json)."""
    m = matrix_from_args(args)
    meta._snap = {}  # read everything afresh (the disk cache still saves requests)
    # Every release the matrix names, its includes' too (planning one offline needs its metadata).
    engine_releases = {(eng, v) for eng in m.engines for v in m.releases(eng) if v}
    keys = [("verl", v) for v in sorted(m.releases("verl"))]
    keys += [(dist_of(eng), v) for eng, v in sorted(engine_releases)]
    torches = set(m.torch or [])
    torches |= {inc["torch"] for inc in m.include if "torch" in inc}
    for eng, v in sorted(engine_releases):
        pin = meta.torch_pin(eng, v)
        if pin:
            torches.add(pin)
    keys += [("torch", t) for t in sorted(torches)]
    # Next to the bundled matrix in a checkout (committed); the user's data dir for an install.
    path = snapshot(meta, keys, metadata_snapshot_for_write())
    print(f"recorded metadata of {len(keys)} releases in {path}", file=sys.stderr)
