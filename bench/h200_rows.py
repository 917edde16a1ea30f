"""Judge rows of the matrix in place on the lent H200: their own locks, carried as a wheelhouse in
pieces, installed offline into a venv beside the node's own torch and CUDA libraries (reused only
where they are the lock's pins), and probed at the gpu level there (issue #29).

The H200 has Python 3.12, torch 2.11.0 (cu130) and most of the scientific stack, but no Docker and
no index; a device call carries at most 64 MiB, and the machine keeps /tmp while it stays warm (30 s
after a call). So:

    1. the node's distributions, once:  run(command="python3 -m pip list --format=json > $OUT/pip.json")
    2. the row's wheelhouse here, minus what the node has at the lock's versions:
         envbuild wheelhouse --verl 0.9.1 --hf --cuda cu130 --python 3.12 --platform linux/amd64 \\
             --out WH --host-packages pip.json
    3. python bench/h200_rows.py prepare WH [--piece-mib 60] [--select "SELECTORS"]
         splits WH into .whl/pNN/ (ignored by git) and prints the device calls, back to back:
         run(carry=[".whl/p00"], command="bash ci/device/row.sh stash .whl/p00") ... and the last one
         run(carry=[".whl/pNN"], command="bash ci/device/row.sh run .whl/pNN SELECTORS")
    4. python bench/h200_rows.py record FETCHED_DIR [--out bench/h200_rows]
         keeps the record (and verdict, venv report, GPU memory trace) as evidence and prints a table;
         publish folds the records into the table (`envbuild publish --results bench/h200_rows/results`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHL = ROOT / ".whl"  # ignored by git: carried only when a call names it
LIMIT_MIB = 64


def tree_bytes() -> int:
    """What travels without carry: tracked plus untracked-not-ignored files."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return sum((ROOT / f).stat().st_size for f in out.decode().split("\0") if f and (ROOT / f).is_file())


def prepare(args) -> int:
    wh = Path(args.wheelhouse)
    manifest = json.loads((wh / "manifest.json").read_text())
    piece = (args.piece_mib << 20)
    tree = tree_bytes()
    if piece + tree > LIMIT_MIB << 20:
        sys.exit(f"{args.piece_mib} MiB pieces + a {tree / 2**20:.1f} MiB tree exceed {LIMIT_MIB} MiB")
    files = sorted((p for p in (wh / "files").iterdir() if p.is_file() and not p.name.startswith(".")),
                   key=lambda p: -p.stat().st_size)
    # Items to carry: whole files, and files over a piece cut into parts (reassembled on the node).
    items: list[tuple[str, Path, int, int]] = []  # (folder in the piece, source, offset, size)
    for p in files:
        size = p.stat().st_size
        if size <= piece:
            items.append(("files", p, 0, size))
        else:
            for i, off in enumerate(range(0, size, piece)):
                items.append((f"parts:{p.name}.part{i:02d}", p, off, min(piece, size - off)))
    # First fit, largest first: few calls.
    bins: list[list] = []
    for it in items:
        for b in bins:
            if sum(x[3] for x in b) + it[3] <= piece:
                b.append(it)
                break
        else:
            bins.append([it])
    if WHL.exists():
        for d in WHL.glob("p[0-9]*"):
            shutil.rmtree(d)
    calls = []
    for i, b in enumerate(bins):
        d = WHL / f"p{i:02d}"
        (d / "files").mkdir(parents=True)
        (d / "parts").mkdir()
        for where, src, off, size in b:
            if where == "files":
                shutil.copy2(src, d / "files" / src.name)
            else:
                with open(src, "rb") as f:
                    f.seek(off)
                    (d / "parts" / where.split(":", 1)[1]).write_bytes(f.read(size))
        if i == len(bins) - 1:  # the last call brings the manifest and the locks, and runs
            shutil.copy2(wh / "manifest.json", d / "manifest.json")
            shutil.copytree(wh / "locks", d / "locks")
        mode = "run" if i == len(bins) - 1 else "stash"
        sel = f" {args.select}" if mode == "run" and args.select else ""
        calls.append({"carry": [f".whl/p{i:02d}"], "command": f"bash ci/device/row.sh {mode} .whl/p{i:02d}{sel}",
                      "mib": round((sum(x[3] for x in b) + tree) / 2**20, 1)})
    rows = {rid: {"files": len(r["files"]), "from_node": sum(1 for f in r["files"] if f["host"]),
                  "carried_bytes": sum(f["size"] or 0 for f in r["files"] if not f["host"])}
            for rid, r in manifest["rows"].items()}
    plan = {"rows": rows, "tree_bytes": tree, "piece_mib": args.piece_mib,
            "carried_bytes": sum(x[3] for b in bins for x in b), "calls": calls}
    (WHL / "plan.json").write_text(json.dumps(plan, indent=1))
    print(f"{plan['carried_bytes'] / 2**20:.1f} MiB in {len(calls)} calls (working tree {tree / 2**20:.2f} MiB)")
    for c in calls:
        print(f"  carry={json.dumps(c['carry'])}  command={c['command']!r}  ({c['mib']} MiB)")
    return 0


def record(args) -> int:
    src, out = Path(args.fetched), Path(args.out)
    recs = sorted(src.glob("record-*.json"))
    if not recs:
        sys.exit(f"{src}: no record-*.json (the run's output)")
    plan = json.loads((WHL / "plan.json").read_text()) if (WHL / "plan.json").exists() else {}
    for r in recs:
        doc = json.loads(r.read_text())
        cid = doc["combo"]["id"]
        dest = out / "results" / "records" / cid / f"{doc['run_id']}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(r, dest)
        mem = [int(x.split(",")[1]) for x in (src / "gpumem.csv").read_text().splitlines()
               if x.count(",") == 1 and x.split(",")[1].strip().isdigit()] if (src / "gpumem.csv").exists() else []
        venv = json.loads((src / "venv.json").read_text()) if (src / "venv.json").exists() else {}
        v = next(iter(doc.get("probe", {}).values()), {})
        evidence = {"row": cid, "status": doc["status"], "cause": doc.get("cause"), "place": doc.get("place"),
                    "timings": v.get("timings"), "checks": [(c["name"], c["status"]) for c in v.get("checks", [])],
                    "peak_gpu_mem_bytes": v.get("peak_gpu_mem"), "nvidia_smi_peak_mib": max(mem) if mem else None,
                    "venv": {k: venv.get(k) for k in ("installed", "reused", "seconds", "check", "linked_files")},
                    "carried": None, "calls": None, "carried_bytes": None}
        if cid in (plan.get("rows") or {}):  # the plan of the last `prepare` is this row's
            evidence.update(carried=plan["rows"][cid], calls=len(plan.get("calls") or []),
                            carried_bytes=plan.get("carried_bytes"))
        (out / f"{cid}.json").write_text(json.dumps(evidence, indent=1, sort_keys=True) + "\n")
        t = evidence["timings"] or {}
        print(f"{cid}: {doc['status']}" + (f" ({doc.get('cause')})" if doc.get("cause") else ""))
        for k in sorted(t):
            print(f"  {k:<28} {t[k]:8.2f} s" if isinstance(t[k], (int, float)) else f"  {k:<28} {t[k]}")
        print(f"  venv: {venv.get('installed')} installed, {len(venv.get('reused') or [])} reused from the node, "
              f"{(venv.get('seconds') or {}).get('total')} s; peak GPU memory {evidence['peak_gpu_mem_bytes']} B "
              f"(nvidia-smi {evidence['nvidia_smi_peak_mib']} MiB)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("wheelhouse")
    p.add_argument("--piece-mib", type=int, default=60)
    p.add_argument("--select", default="", help="selectors for `envbuild venv` on the node, one string "
                                                 "(needed when the wheelhouse holds several rows)")
    r = sub.add_parser("record")
    r.add_argument("fetched")
    r.add_argument("--out", default=str(ROOT / "bench" / "h200_rows"))
    args = ap.parse_args()
    return prepare(args) if args.cmd == "prepare" else record(args)


if __name__ == "__main__":
    sys.exit(main())
