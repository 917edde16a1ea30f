"""How much two combinations that differ only in verl share, layer by layer.

    python bench/lock_sharing.py                      # locks the pair below, prints a table, writes JSON
    python bench/lock_sharing.py --dirs LOCKS/A LOCKS/B   # measures two existing lock folders

For each layer: the lock file's bytes and pins in each combination, whether the two files are
byte-identical (then the image layer is shared), and the download size of the layer's wheels (the
wheel an image on the lock's platform installs, sizes from the index). Writes bench/lock_sharing.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from packaging.utils import parse_wheel_filename

from envbuild.index import Metadata
from envbuild.lock import Locker
from envbuild.lockmodel import wheel_tags
from envbuild.lockfile import parse_lock
from envbuild.matrix import load_matrix
from envbuild.expand import plan
from envbuild.selector import selectors_from_args
from envbuild.paths import default_matrix

PAIR = [dict(cuda="cu124", vllm="0.8.4", verl="0.4.1"), dict(cuda="cu124", vllm="0.8.4", verl="0.5.0")]


def wheel_bytes(meta: Metadata, name: str, version: str, tags) -> int:
    order = {t: i for i, t in enumerate(sorted(tags, key=str))}
    best = None
    for f in meta.files(name):
        fn = f["filename"]
        if not fn.endswith(".whl"):
            continue
        _, v, _, ft = parse_wheel_filename(fn)
        if str(v) == version and ft & tags:
            rank = min(order[t] for t in ft & tags)
            best = min(best or (rank, f.get("size") or 0), (rank, f.get("size") or 0))
    return best[1] if best else 0


def measure(dirs: list[Path], meta: Metadata) -> list[dict]:
    tags = wheel_tags("3.11", "2.35")
    rows = []
    layers = sorted({p.stem for d in dirs for p in d.glob("*.txt")} - {"tools", "build-constraints"},
                    key=lambda n: ["torch", "engine", "verl", "full"].index(n) if n in ("torch", "engine", "verl", "full") else 9)
    for layer in layers:
        texts = [(d / f"{layer}.txt").read_bytes() if (d / f"{layer}.txt").exists() else b"" for d in dirs]
        pins = [parse_lock(t.decode()) for t in texts]
        wb = [sum(wheel_bytes(meta, n, v, tags) for n, (v, _) in p.items()) for p in pins]
        rows.append({"layer": layer, "bytes": [len(t) for t in texts], "pins": [len(p) for p in pins],
                     "identical": texts[0] == texts[1], "wheel_bytes": wb})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dirs", nargs=2, type=Path)
    ap.add_argument("--label", default="after")
    ap.add_argument("--json", type=Path, default=Path(__file__).with_suffix(".json"))
    a = ap.parse_args()
    meta = Metadata()
    if a.dirs:
        dirs = a.dirs
    else:
        m = load_matrix(default_matrix())
        out = Path(tempfile.mkdtemp(prefix="envbuild-lock-sharing-"))
        locker = Locker(m, meta)
        dirs = []
        for sel in PAIR:
            c = plan(m, selectors_from_args(SimpleNamespace(**sel)), meta=meta).combos[0]
            r = locker.lock(c, out)
            if not r.ok:
                print(f"{c.id}: {r.status}: {r.detail}", file=sys.stderr)
                return 1
            dirs.append(out / c.id)
    rows = measure(dirs, meta)
    print(f"{a.label}: {dirs[0].name} vs {dirs[1].name}")
    print(f"{'layer':8} {'lock bytes':>17} {'pins':>9} {'identical':>9} {'wheel MB':>15}")
    for r in rows:
        print(f"{r['layer']:8} {r['bytes'][0]:>8} {r['bytes'][1]:>8} {r['pins'][0]:>4} {r['pins'][1]:>4} "
              f"{'yes' if r['identical'] else 'no':>9} {r['wheel_bytes'][0] / 1e6:>7.1f} {r['wheel_bytes'][1] / 1e6:>7.1f}")
    shared = sum(r["wheel_bytes"][0] for r in rows if r["identical"] and r["layer"] != "full")
    total = next((r["wheel_bytes"][1] for r in rows if r["layer"] == "full"), 0)
    print(f"shared image layers: {shared / 1e6:.1f} MB of wheels"
          + (f" of {total / 1e6:.1f} MB ({100 * shared / total:.0f}%)" if total else ""))
    doc = json.loads(a.json.read_text()) if a.json.exists() else {}
    doc[a.label] = {"dirs": [d.name for d in dirs], "layers": rows, "shared_wheel_bytes": shared,
                    "total_wheel_bytes": total}
    a.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
