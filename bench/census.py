"""The census of the whole bundled matrix, cold and warm (issue 28): `envbuild census` run twice
on an empty envbuild cache (locks, unpacked wheels, verdicts; uv's own HTTP cache is left as it
is), with the load average beside each run. Prints a table and writes JSON next to itself.

    python bench/census.py [-j 2] [--out bench/census.json] [selectors passed to envbuild census]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_once(cache: Path, results: Path, jobs: int, extra: list[str]) -> dict:
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "envbuild", "census", "--results", str(results), "--json",
                        "-j", str(jobs), *extra], capture_output=True, text=True,
                       env={**os.environ, "ENVBUILD_CACHE": str(cache)})
    wall = time.monotonic() - t0
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    counts: dict[str, int] = {}
    causes: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        if r.get("cause"):
            causes[r["cause"]] = causes.get(r["cause"], 0) + 1
    return {"wall_seconds": round(wall, 1), "exit": p.returncode, "combinations": len(rows), "counts": counts,
            "causes": causes, "reused": sum(1 for r in rows if r.get("reused")),
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            "stderr_tail": p.stderr[-400:], "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).with_name("census.json")))
    a, extra = ap.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="envbuild-census-bench-") as d:
        cache, results = Path(d) / "cache", Path(d) / "results"
        cold = run_once(cache, results, a.jobs, extra)
        warm = run_once(cache, results, a.jobs, extra)
    print(f"{'run':<6}{'seconds':>10}{'combos':>8}{'reused':>8}  load    verdicts")
    for name, r in (("cold", cold), ("warm", warm)):
        print(f"{name:<6}{r['wall_seconds']:>10}{r['combinations']:>8}{r['reused']:>8}  "
              f"{r['load_before']}->{r['load_after']}  {r['counts']} {r['causes']}")
    doc = {"command": "python bench/census.py " + " ".join(sys.argv[1:]), "jobs": a.jobs, "cpus": os.cpu_count(),
           "cold": cold, "warm": {k: v for k, v in warm.items() if k != "rows"}}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
