"""How long planning takes: the full default matrix, and 10^5 synthetic raw combinations.

Goal (issue 2): under 1 s for 10^5 raw combinations. Prints a table and writes JSON.
    python bench/plan_speed.py [--out bench/plan_speed.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from envbuild.index import Metadata
from envbuild.matrix import load_matrix
from envbuild.expand import plan
from envbuild.paths import default_matrix


class SyntheticMeta(Metadata):
    """Metadata for made-up releases: every vLLM 1.N pins torch 2.(N % 7 + 4).0."""

    def __init__(self):
        super().__init__(online=False)

    def torch_pin(self, engine, version):
        return f"2.{int(version.split('.')[1]) % 7 + 4}.0"

    def requires_python(self, name, version):
        return ">=3.9"


def synthetic_matrix(dirname: Path) -> Path:
    vllm = [f"1.{i}" for i in range(40)]
    verl = [f"0.{i}" for i in range(50)]
    python = [f"3.{i}" for i in range(8, 18)]
    cudas = {f"cu1{i}0": f'{{toolkit: "1{i}.0", base: "nvidia/cuda:1{i}.0-devel", glibc: "2.35", torch: ">=2.{i}"}}'
             for i in range(5)}
    text = ["schema: 1", f"python: {json.dumps(python)}", "cuda:"]
    text += [f"  {k}: {v}" for k, v in cudas.items()]
    text += ["engines:", f"  vllm: {json.dumps(vllm)}", f"verl: {json.dumps(verl)}", "exclude:",
             '  - {verl: "<0.10", vllm: ">1.30", reason: "synthetic pairing rule"}',
             '  - {python: "3.17", cuda: cu100, reason: "synthetic"}']
    p = dirname / "synthetic.yaml"
    p.write_text("\n".join(text) + "\n")
    return p


def timed(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).with_name("plan_speed.json")))
    args = ap.parse_args()
    rows = []
    m = load_matrix(default_matrix())
    t, pl = timed(lambda: plan(m, meta=Metadata(online=False)))
    rows.append({"case": "default matrix", "raw": len(pl.combos) + len(pl.excluded), "planned": len(pl.combos),
                 "seconds": round(t, 4), "goal_s": None})
    with tempfile.TemporaryDirectory() as d:
        sm = load_matrix(synthetic_matrix(Path(d)))
        t, pl = timed(lambda: plan(sm, meta=SyntheticMeta()))
    raw = len(pl.combos) + len(pl.excluded)
    rows.append({"case": "synthetic", "raw": raw, "planned": len(pl.combos), "seconds": round(t, 4), "goal_s": 1.0})
    print(f"{'case':<16} {'raw':>8} {'planned':>8} {'seconds':>8} {'goal':>6}")
    for r in rows:
        print(f"{r['case']:<16} {r['raw']:>8} {r['planned']:>8} {r['seconds']:>8.3f} {r['goal_s'] or '':>6}")
    Path(args.out).write_text(json.dumps({"python": sys.version.split()[0], "machine": platform.machine(),
                                          "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
