"""`envbuild wheelhouse SELECTORS --out DIR`: download exactly the files of each row's lock, for a
node without Docker or an index (the command around envbuild.wheelhouse)."""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import InputError
from .expand import plan_from_args
from .fsutil import write_json_atomic
from .index import Metadata
from .index_config import torch_source
from .lock import Locker
from .lockfile import text_of
from .materialize import MANIFEST, SCHEMA, read_manifest
from .matrix import matrix_from_args
from .outcome import exit_of_lock
from .probe.hardware import DEFAULT_PLATFORM, host_platform
from .progress import Progress
from .selector import add_selector_args
from .wheelhouse import add_row, host_packages, platform_machine_of


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("--out", required=True, help="the wheelhouse folder (created; rows already there are kept)")
    p.add_argument("--locks", default="locks", help="lock folder (default: ./locks)")
    p.add_argument("--host-packages", metavar="FILE",
                   help="JSON {name: version} (or `pip list --format=json`) of what the node has: files of "
                        "pins it has at that version are not downloaded")


def run(args) -> int:
    meta = Metadata()
    if getattr(args, "platform", None) is None:
        # One platform, the node's: a wheelhouse is carried to one node. This machine's unless
        # --platform names the node's (every platform of the matrix once meant an exit 3 on the
        # one whose index could not be reached).
        args.platform = host_platform() or DEFAULT_PLATFORM
        print(f"wheelhouse: rows for {args.platform} (this machine's platform; --platform names the node's)",
              file=sys.stderr)
    m = matrix_from_args(args)
    pl = plan_from_args(args, meta)
    locker = Locker(m, meta)
    out = Path(args.out)
    host = host_packages(args.host_packages)
    try:
        doc = read_manifest(out)
    except InputError:
        doc = {"schema": SCHEMA, "rows": {}}
    with Progress("wheelhouse", len(pl.combos), "rows") as beat:
        return _rows(args, pl, locker, out, doc, host, meta, m, beat)


def _rows(args, pl, locker, out: Path, doc: dict, host, meta, m, beat) -> int:
    worst = 0
    for c in pl.combos:
        beat.stage_to(f"wheelhouse {c.id}: locking")
        lr = locker.lock(c, args.locks)
        if not lr.ok:
            print(f"{c.id}: not locked: {lr.status}: {' '.join(lr.detail.split())[:300]}", file=sys.stderr)
            worst = max(worst, exit_of_lock(lr.status))
            continue
        src = torch_source(c.cuda, c.torch, meta, m.pytorch_index, machine=platform_machine_of(c))
        layers = {layer.name: layer.text() for layer in lr.layers}
        files, got, skipped = add_row(out, doc, c, layers, meta, host, lock_hash=lr.lock_hash, era=lr.era,
                                      torch_index=src.url, beat=beat, full_lock=text_of(lr.full_lock))
        write_json_atomic(out / MANIFEST, doc)  # after each row: an interrupted run keeps what it has
        print(f"{c.id}: {len(files)} files, {got / 2**20:.0f} MiB here"
              + (f", {skipped} the node has (--host-packages)" if skipped else "") + f" -> {out}")
    return worst
