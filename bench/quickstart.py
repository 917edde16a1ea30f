#!/usr/bin/env python3
"""The README's main job, timed: `bash ci/quickstart.sh` from a fresh clone, with caches of its own.

Prints a table (each of the quickstart's steps, and inside the build: lock, base, build, push,
probe) and writes JSON (bench/quickstart.json by default). Goal (issue #17): the first verified,
pushed, signed image in <= 8 min on a fresh 2-core machine.

  python bench/quickstart.py [--cold] [--load N] [--out bench/quickstart.json] [selectors...]

The load average is sampled every 2 s and recorded beside each step (mean and max over the step).
--load N adds N busy processes (one spinning Python loop each, at the lowest priority the kernel
gives them no edge over the quickstart: the default, nice 0) for the whole run: "under load N".

What is already on the machine is recorded, not hidden: whether Docker, the registry and
debootstrap were installed, whether the base image and envbuild's build cache existed, and whether
the registry already held the repository (a registry that has the layers makes the push a mount).
--cold first removes envbuild's images (the base included) and envbuild's BuildKit cache (its
steps and uv's download cache), as build_speed.py does; the registry's storage is not touched:
start from an empty one to time a cold push. The envbuild, pip and uv caches are always fresh
(XDG_CACHE_HOME and UV_CACHE_DIR in a temporary folder). Needs root, like the quickstart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL_S = 8 * 60  # quiet
GOAL_LOADED_S = 12 * 60  # at load 4 on 2 cores (issue 30)
REGISTRY = "127.0.0.1:5000"
STEP = re.compile(r"^== quickstart \[(\d+)m(\d+)s\] (.*)$")


def images(docker: str, pattern: str) -> list[str]:
    p = subprocess.run([docker, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True)
    return [i for i in p.stdout.split() if re.match(pattern, i)]


def found_on_machine(docker: str) -> dict:
    """What the quickstart would otherwise install or build."""
    from envbuild.docker import detect
    own = [e for e in detect().cache_entries() if "/opt/envbuild/" in e.get("Description", "")]
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://{REGISTRY}/v2/_catalog?n=10000", timeout=5) as r:
            repos = json.load(r).get("repositories") or []
        registry = {"answers": True, "has_envbuild_verl": "envbuild/verl" in repos}
    except OSError:
        registry = {"answers": False, "has_envbuild_verl": False}
    return {"installed": {c: bool(shutil.which(c)) for c in ("dockerd", "docker-registry", "debootstrap", "zstd")},
            "base_images": images(docker, r"^envbuild/base:"), "envbuild_images": images(docker, r"(^|.*/)envbuild/verl:"),
            "envbuild_build_cache_entries": len(own), "registry": registry}


def make_cold(docker: str) -> None:
    sys.path.insert(0, str(HERE))
    from build_speed import _cold  # the same pruning of envbuild's own build cache

    from envbuild.docker import detect
    engine = detect()
    mine = images(docker, r"^(envbuild/base|envbuild/verl|.*/envbuild/verl):")
    if mine:
        engine.remove(*mine, force=True)
    _cold(engine)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true", help="remove envbuild's images and build cache first")
    ap.add_argument("--out", default=str(HERE / "quickstart.json"))
    ap.add_argument("--load", type=int, default=0, metavar="N", help="N busy processes beside the run")
    ap.add_argument("selectors", nargs="*", help="passed to ci/quickstart.sh (default: its own)")
    args = ap.parse_args(argv)
    docker = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
    if args.cold:
        make_cold(docker)
    before = found_on_machine(docker)
    work = Path(tempfile.mkdtemp(prefix="envbuild-quickstart-"))
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache"), "UV_CACHE_DIR": str(work / "cache" / "uv")}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    samples: list[tuple[float, float]] = []  # (seconds since start, 1-minute load average)
    done = threading.Event()
    t0 = time.monotonic()

    def sample():
        while not done.wait(2.0):
            samples.append((time.monotonic() - t0, os.getloadavg()[0]))

    threading.Thread(target=sample, daemon=True).start()
    try:
        p = subprocess.Popen(["bash", "ci/quickstart.sh", *args.selectors], cwd=clone, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        steps, lines = [], []
        for line in p.stdout:
            sys.stdout.write(line)
            lines.append(line)
            m = STEP.match(line.strip())
            if m:
                steps.append({"at_s": int(m[1]) * 60 + int(m[2]), "at_wall_s": round(time.monotonic() - t0, 1),
                              "step": m[3]})
        rc = p.wait()
    finally:
        done.set()
        for b in burners:
            b.kill()
    wall = round(time.monotonic() - t0, 1)
    goal = GOAL_LOADED_S if args.load else GOAL_S
    for a, b in zip(steps, steps[1:] + [{"at_wall_s": wall}]):
        a["seconds"] = round(b["at_wall_s"] - a["at_wall_s"], 1)
        during = [ld for t, ld in samples if a["at_wall_s"] <= t < b["at_wall_s"]]
        if during:
            a["load"] = {"mean": round(sum(during) / len(during), 2), "max": round(max(during), 2)}
    loads = [ld for _, ld in samples]
    from envbuild.record import iter_records

    records = []
    for r in iter_records(clone / "results"):
        records.append({"combo": r.combo["id"], "status": r.status, "stage": r.stage, "timings": r.timings,
                        "image_bytes": (r.image or {}).get("size"), "digest": (r.image or {}).get("digest"),
                        "push": (r.image or {}).get("push"),
                        "probe": {lv: {"status": v.status, "wall_s": v.runner.get("wall_seconds")}
                                  for lv, v in r.probe.items()}})
    picked = next((ln.strip() for ln in reversed(lines) if re.search(r"@sha256:[0-9a-f]{64}$", ln.strip())), None)
    out = {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
           "load_after": os.getloadavg(), "added_load": args.load,
           "load": {"mean": round(sum(loads) / len(loads), 2), "max": round(max(loads), 2)} if loads else None,
           "exit": rc, "wall_s": wall, "goal_s": goal, "picked": picked,
           "found_on_machine": before, "steps": steps, "records": records}
    print(f"\n{'step':<78}{'seconds':>9}  load mean/max")
    for s in steps:
        ld = s.get("load") or {}
        print(f"{s['step'][:77]:<78}{s.get('seconds', 0):>9.1f}  {ld.get('mean', '-')}/{ld.get('max', '-')}")
    for r in records:
        for k, v in sorted(r["timings"].items()):
            print(f"  {r['combo'][:40]} {k:<31}{v:>9.1f}")
    print(f"{'wall (goal <= ' + str(goal) + ' s)':<78}{wall:>9.1f}  exit {rc}")
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
