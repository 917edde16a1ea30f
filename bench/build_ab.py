#!/usr/bin/env python3
"""One combination's cold build with envbuild at a git revision against the working tree,
interleaved, with each install step's seconds from the build log: where a change to the layers
or the template gained or lost time, judged within one run.

    python bench/build_ab.py [--base HEAD] [--repeat 2] [--cuda cu124 --vllm 0.8.4 --verl 0.4.1]
                             [--second] [--out bench/build_ab.json]

Every build starts from an empty build cache of envbuild's own steps (bench/build_speed.py's
_cold: layers and uv's cache mount), on the same debootstrapped base, with the lock resolved
beforehand (both sides read the same cached lock), and with --no-cache, so repeats also show
whether each side's layers are byte-identical from build to build. Each build also records the
CPU-seconds the whole machine spent busy and that over the cores (cpu_floor_s): the wall time the
same work needs at the least, however its steps overlap. With --second, each side then
builds the hf combination sharing the first one's torch, on the layer cache the first left (as
bench/build_speed.py's second combination). The revision runs from a `git archive` of
its builder/, dockerfiles/ and matrix/, imported as envbuild from there. Needs the Docker engine
and the package index (ci/services.sh); ~2.5 min and ~9 GB per build, images removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from build_speed import _cold, _prune_own_cache, cpu_times, cpu_used, envbuild, latest  # noqa: E402

STEP = re.compile(r"^#(\d+) \[[^\]]*\] (.*)$", re.M)
DONE = re.compile(r"^#(\d+) DONE ([0-9.]+)s$", re.M)


def tree(rev: str | None, work: Path) -> Path:
    """A folder whose `envbuild` is the package of `rev` (None: the working tree's)."""
    top = work / (rev or "worktree").replace("/", "_")
    top.mkdir()
    src = ROOT
    if rev is not None:
        src = top / "src"
        src.mkdir()
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "builder", "dockerfiles", "matrix"],
                             capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
    (top / "py").mkdir()
    (top / "py" / "envbuild").symlink_to(src / "builder")  # data_dir: dockerfiles/ next to builder/
    return top / "py"


def step_seconds(log: str) -> dict[str, float]:
    """Seconds of each step of a BuildKit plain log, named by the envbuild layer it installs."""
    names = {}
    for n, text in STEP.findall(log):
        m = re.search(r": envbuild layer ([a-z-]+) from", text)
        names[n] = m.group(1) if m else ("tools" if "locks/tools.txt" in text else None)
    out: dict[str, float] = {}
    for n, secs in DONE.findall(log):
        if names.get(n):
            out[names[n]] = float(secs)
    m = re.search(r"^#\d+ exporting layers ([0-9.]+)s done$", log, re.M)
    if m:
        out["export"] = float(m.group(1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="git revision to compare the working tree against")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cuda", default="cu124")
    ap.add_argument("--vllm", default="0.8.4")
    ap.add_argument("--verl", default="0.4.1")
    ap.add_argument("--second", action="store_true",
                    help="after each cold build, build the hf combination sharing its torch (layer cache on)")
    ap.add_argument("--out", default=str(HERE / "build_ab.json"))
    args = ap.parse_args(argv)

    from envbuild.base import bootstrap
    from envbuild.docker import detect
    from envbuild.index import Metadata
    from envbuild.lock import Locker
    from envbuild.matrix import load_matrix
    from envbuild.expand import plan
    from envbuild.selector import Selectors
    from envbuild.paths import default_matrix

    engine = detect()
    bootstrap(engine, log=lambda s: print(s, file=sys.stderr))  # the base both sides build on
    meta = Metadata()
    m = load_matrix(default_matrix())
    combo = plan(m, Selectors(cuda=args.cuda, engine="vllm", engine_version=args.vllm, verl=args.verl), meta).combos[0]
    work = Path(tempfile.mkdtemp(prefix="envbuild-ab-"))
    assert Locker(m, meta).lock(combo, work / "locks").ok
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                         text=True, check=True).stdout.strip()
    sides = {"before": tree(args.base, work), "after": tree(None, work)}
    sel = ["--cuda", args.cuda, "--vllm", args.vllm, "--verl", args.verl, "--base", "bootstrap"]
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    second = None
    if args.second:
        second = plan(m, Selectors(cuda=args.cuda, engine="hf", torch=combo.torch, verl=args.verl), meta).combos[0]
        assert Locker(m, meta).lock(second, work / "locks").ok
        runs.update({"before-second": [], "after-second": []})
    sel_b = ["--cuda", args.cuda, "--hf", "--torch", combo.torch, "--verl", args.verl, "--base", "bootstrap"]
    try:
        for i in range(args.repeat):
            for side, py in sides.items():
                _cold(engine)
                results = work / f"{side}-{i}"
                env = {**os.environ, "PYTHONPATH": f"{py}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
                print(f"[{i + 1}/{args.repeat}] {side}: cold build of {combo.id} ...", file=sys.stderr)
                cpu0 = cpu_times()
                secs, p = envbuild("build", *sel, "--results", str(results), "--rebuild", "--no-cache", env=env)
                assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
                rec = latest(results, combo.id)
                runs[side].append({"seconds": round(secs, 1), "build": rec.timings.get("build"), **cpu_used(cpu0),
                                   "size": rec.image["size"], "steps": step_seconds((results / rec.log).read_text()),
                                   "layers": engine.layers(rec.image["ref"])})
                tags = list(rec.image["tags"])
                if second is not None:
                    print(f"[{i + 1}/{args.repeat}] {side}: {second.id} after it ...", file=sys.stderr)
                    cpu0 = cpu_times()
                    secs, p = envbuild("build", *sel_b, "--results", str(results), "--rebuild", env=env)
                    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
                    rb = latest(results, second.id)
                    steps_b = step_seconds((results / rb.log).read_text())
                    # Its verl step must run: a cache record the prune left (seen 2026-12-06: a whole
                    # second build CACHED in the second round) would time a no-op as the second build.
                    assert "verl" in steps_b, f"{second.id}: its verl step came from the build cache"
                    runs[f"{side}-second"].append(
                        {"seconds": round(secs, 1), "build": rb.timings.get("build"), **cpu_used(cpu0),
                         "size": rb.image["size"],
                         "steps": steps_b, "layers": engine.layers(rb.image["ref"])})
                    tags += rb.image["tags"]
                engine.remove(*tags, force=True)
    finally:
        _prune_own_cache(engine)

    def med(side: str, key: str | None) -> float | None:
        vals = [r["build"] if key is None else r[key] if key.startswith("cpu_") else r["steps"].get(key)
                for r in runs[side]]
        vals = [v for v in vals if v is not None]
        return round(statistics.median(vals), 2) if vals else None

    def medians(suffix: str) -> dict:
        b, a = f"before{suffix}", f"after{suffix}"
        steps = list(dict.fromkeys(k for side in (b, a) for r in runs[side] for k in r["steps"]))
        return {**{k: {"before": med(b, k), "after": med(a, k)} for k in steps},
                "build": {"before": med(b, None), "after": med(a, None)},
                **{k: {"before": med(b, k), "after": med(a, k)} for k in ("cpu_busy_s", "cpu_floor_s")}}

    out = {"combo": combo.id, "base": f"{args.base} ({rev})", "engine": engine.describe(), "cpus": os.cpu_count(),
           "repeat": args.repeat, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "median": medians(""), "runs": runs}
    if second is not None:
        out["second"] = second.id
        out["median_second"] = medians("-second")
    # Every build is --no-cache: equal layers across one side's repeats came from equal bytes.
    out["same_layers"] = {side: f"{sum(len(set(l)) == 1 for l in zip(*(r['layers'] for r in rs)))} of "
                                f"{len(rs[0]['layers'])}" for side, rs in runs.items() if len(rs) > 1}
    for title, table in (("cold", out["median"]), ("second", out.get("median_second"))):
        if table is None:
            continue
        print(f"{title + ' step':<16}{'before':>10}{'after':>10}")
        for k, v in table.items():
            print(f"{k:<16}{v['before'] if v['before'] is not None else '-':>10}"
                  f"{v['after'] if v['after'] is not None else '-':>10}")
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    for side, same in out.get("same_layers", {}).items():
        print(f"{side}: {same} layers identical across the repeats")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
