"""Where the contract level's time goes, before and after: the probe of a git revision against the
probe of the working tree, in one Python environment (or one built image), runs interleaved.

    python bench/probe_speed.py --python /path/to/venv/bin/python [--base REV] [--repeat 3]
        [--engine hf] [--level contract] [--expect-verl 0.4.1] [--out bench/probe_speed.json]
    python bench/probe_speed.py --image IMAGE ...   (docker run --network host, the probe mounted)
    python bench/probe_speed.py --image IMAGE --plan cpu ...   (what `envbuild build --probe cpu`
        runs: before, one process per level, env then contract, as build ran them; after, one
        process for both levels, each level's verdict written as it ends, as build runs them now)
    --cold drops the page cache before each run (root): an image's first probe on a machine.

Wall seconds on a shared 2-core machine vary run to run: compare the two columns of one run, and
the CPU seconds (user+sys of the probe's process tree), which load changes less.
Needs only the probe package and git.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("import_torch", "pip-check", "env", "import_verl", "static_imports", "native_extensions",
          "native_extensions_wait", "engine_api", "contract", "build_model", "engine_start", "rollout",
          "trainer_setup", "update", "push", "rollout2", "gpu", "process")


def probe_copy(rev: str | None, dest: Path) -> Path:
    """<dest>/envbuild_probe: the probe of `rev` (git archive), or the working tree's (a copy)."""
    pkg = dest / "envbuild_probe"
    if rev is None:
        shutil.copytree(ROOT / "builder" / "probe", pkg, ignore=shutil.ignore_patterns("__pycache__"))
        return dest
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "builder/probe"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
    (dest / "builder" / "probe").rename(pkg)
    return dest


def run_plan(where: Path, args, out: Path, one_process: bool) -> dict:
    """The levels of a plan (env, contract[, gpu]) as one process or one process per level."""
    levels = ("env", "contract", "gpu")[:{"cpu": 2, "gpu": 3}[args.plan]]
    if one_process:
        ldir = out.parent / "levels"
        ldir.mkdir(exist_ok=True)
        os.chmod(ldir, 0o777)
        inside = "/out/levels" if args.image else str(ldir)
        r = run_once(where, args, out, level=levels[-1], extra=["--levels-dir", inside, "--stop-at-failure"])
        shutil.rmtree(ldir)
        return r
    parts = [run_once(where, args, out, level=lv) for lv in levels]
    last = dict(parts[-1])
    last["timings"] = {**last["timings"], "wall": round(sum(p["timings"]["wall"] for p in parts), 3),
                       "cpu": round(sum(p["timings"]["cpu"] for p in parts), 3)}
    return last


def run_once(where: Path, args, out: Path, level: str | None = None, extra: list[str] = ()) -> dict:
    cmd_args = ["--level", level or args.level, "--engine", args.engine, *extra, "--json"]
    extra = [a for k, val in (("--expect-verl", args.expect_verl), ("--expect-torch", args.expect_torch))
             if val for a in (k, val)] + args.gpu_args.split()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    if args.image:
        cmd = ["docker", "run", "--rm", "--network", "host", "-v", f"{where}:/probe:ro", "-v", f"{out.parent}:/out",
               "-e", "PYTHONPATH=/probe", "--entrypoint", "python3", args.image, "-m", "envbuild_probe",
               *cmd_args, f"/out/{out.name}", *extra]
    else:
        cmd = [args.python, "-m", "envbuild_probe", *cmd_args, str(out), *extra]
    env = {**os.environ, "PYTHONPATH": str(where)}
    r = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not out.exists():
        sys.exit(f"probe wrote no verdict (exit {r.returncode}):\n{r.stderr[-3000:]}")
    d = json.loads(out.read_text())
    out.unlink()
    t = dict(d.get("timings", {}))
    for c in d.get("checks", []):
        if c["name"] == "pip-check":
            t["pip-check"] = c.get("seconds", 0.0)
    t["wall"] = round(wall, 3)
    t["cpu"] = round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3)  # not in a container
    return {"timings": t, "status": d.get("status"), "checks": len(d.get("checks", [])),
            "fail": sorted(c["name"] for c in d.get("checks", []) if c["status"] == "fail")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--python", help="interpreter of the environment to probe")
    g.add_argument("--image", help="a built image to probe (docker run)")
    ap.add_argument("--base", default="HEAD~1", help="git revision of the 'before' probe (default HEAD~1)")
    ap.add_argument("--base-dir", help="a folder holding the 'before' probe as envbuild_probe/ (no git needed)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--level", default="contract")
    ap.add_argument("--plan", choices=("cpu", "gpu"),
                    help="measure a build's probe plan instead of one level: before = a process per level, "
                         "after = one process for all (--levels-dir); --base should predate that option")
    ap.add_argument("--expect-verl")
    ap.add_argument("--expect-torch")
    ap.add_argument("--gpu-args", default="", help="extra probe arguments, e.g. '--expect-cuda 12.8'")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache before each run (root): the first probe of an image on a machine")
    ap.add_argument("--out", default=str(ROOT / "bench" / "probe_speed.json"))
    args = ap.parse_args()

    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="probe-speed-") as tmp:
        tmp = Path(tmp)
        (tmp / "before").mkdir()
        (tmp / "after").mkdir()
        before = Path(args.base_dir).resolve() if args.base_dir else probe_copy(args.base, tmp / "before")
        where = {"before": before, "after": probe_copy(None, tmp / "after")}
        for i in range(args.repeat):  # interleaved: load drifts over minutes on a shared machine
            for label in ("before", "after"):
                out = tmp / f"{label}{i}.json"
                if args.cold:
                    os.sync()
                    Path("/proc/sys/vm/drop_caches").write_text("3\n")
                r = run_plan(where[label], args, out, label == "after") if args.plan else run_once(where[label], args, out)
                runs[label].append(r)
                print(f"  {label} #{i + 1}: wall {r['timings']['wall']:.1f}s cpu {r['timings']['cpu']:.1f}s "
                      f"{r['status']} ({r['checks']} checks, failing: {', '.join(r['fail']) or 'none'})", file=sys.stderr)

    def med(label, key):
        xs = [r["timings"][key] for r in runs[label] if key in r["timings"]]
        return round(statistics.median(xs), 3) if xs else None

    rows = [(k, med("before", k), med("after", k)) for k in (*STAGES, "wall", "cpu")]
    print(f"{'stage (median s)':<24}{'before':>10}{'after':>10}{'after/before':>14}")
    for k, b, a in rows:
        ratio = f"{a / b:.2f}" if a is not None and b else ""
        print(f"{k:<24}{'' if b is None else f'{b:.2f}':>10}{'' if a is None else f'{a:.2f}':>10}{ratio:>14}")
    result = {"target": args.image or args.python, "engine": args.engine, "level": args.level, "base": args.base,
              "plan": args.plan, "cold": args.cold,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load": os.getloadavg()}, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "median": {k: {"before": b, "after": a} for k, b, a in rows}, "runs": runs}
    tmp_out = args.out + ".tmp"
    Path(tmp_out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    os.replace(tmp_out, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
