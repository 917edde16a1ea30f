#!/usr/bin/env python3
"""Overlap in `envbuild build` (issue #17): what resolving the base while locking and pushing
while probing save, measured on this machine.

Prints a table and writes JSON (bench/build_overlap.json by default). Sections:
  push-probe  a warm `envbuild build SEL --base bootstrap --push --probe cpu --rebuild --reprobe`
              (the BuildKit cache is warm, so the build takes seconds and the push and the probe
              are the run) with the code of --before REV and of --after REV, each exported with
              `git archive` and run through PYTHONPATH, for --rounds rounds, the order flipped
              every round (so neither revision always runs second, on a page cache the other
              warmed, or while other load on the machine ebbs). Every
              run pushes to a registry of its own, started by this script on 127.0.0.1:--port
              with empty storage and removed afterwards: against a registry the daemon has pushed
              these layers to before, `docker push` mounts blobs instead of uploading them, and
              the first run's push is what the quickstart pays. Reported: the command's wall
              time, the record's timings (push, probe, and after the change push_probe_wall), the
              bytes the registry received, and per run with the overlap what it hid
              (push + probe - push_probe_wall), which other load on the machine moves less than
              the wall times. The images are removed after each run.
  base-lock   a cold lock of SEL (fresh envbuild and uv caches) and a fresh debootstrap (to a
              tag of this bench's, removed afterwards), first one after the other, then at once
              through build.BaseFutures as `envbuild build` does now (in this process, with the
              working tree's envbuild).

Needs a Docker engine with the combination's BuildKit cache warm, `docker-registry` and
`debootstrap` (ci/services.sh), root, the package index; ~10 GB of free disk while a run's image
and registry copy exist; ~8 min per push-probe run on 2 cores.

  python bench/build_overlap.py --before REV --after REV [--rounds 1] [--sections push-probe,base-lock]
                                [--cuda cu124 --vllm 0.8.4 --verl 0.4.1] [--port 5001]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCKER = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"


def export_rev(rev: str, into: Path) -> tuple[str, Path]:
    """git archive REV into INTO/tree; -> (full commit, the folder to put on PYTHONPATH)."""
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True, text=True,
                          check=True).stdout.strip()
    tree, shim = into / "tree", into / "pkg"
    tree.mkdir(parents=True)
    shim.mkdir()
    arch = subprocess.Popen(["git", "-C", str(ROOT), "archive", full], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=arch.stdout, check=True)
    if arch.wait() != 0:
        raise SystemExit(f"git archive {rev} failed")
    (shim / "envbuild").symlink_to(tree / "builder")  # envbuild.paths finds matrix/ next to builder/
    return full, shim


class Registry:
    """A throw-away registry on 127.0.0.1:PORT with its storage in a temporary folder."""

    def __init__(self, port: int, work: Path):
        self.addr = f"127.0.0.1:{port}"
        self.dir = Path(tempfile.mkdtemp(prefix="registry-", dir=work))
        cfg = self.dir / "config.yml"
        cfg.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                       f"    rootdirectory: {self.dir / 'store'}\n  delete:\n    enabled: true\n"
                       f"http:\n  addr: {self.addr}\n")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.dir / "log", "w"))
        for _ in range(60):
            try:
                urllib.request.urlopen(f"http://{self.addr}/v2/", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.5)
        self.close()
        raise SystemExit(f"docker-registry on {self.addr} did not answer: {(self.dir / 'log').read_text()[-500:]}")

    def stored_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.dir / "store").rglob("*") if p.is_file())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def build_run(label: str, rev: str, shim: Path, sel: list[str], port: int, work: Path) -> dict:
    from envbuild.record import latest_by_combo

    reg = Registry(port, work)
    results = work / f"results-{label}-{secrets.token_hex(3)}"
    cmd = [sys.executable, "-m", "envbuild", "build", *sel, "--base", "bootstrap",
           "--repository", f"{reg.addr}/envbuild-bench-overlap", "--push", "--probe", "cpu",
           "--results", str(results), "--rebuild", "--reprobe"]
    env = {**os.environ, "PYTHONPATH": str(shim), "DOCKER_BUILDKIT": "1"}
    print(f"{label} ({rev[:12]}): {' '.join(cmd[3:])}", file=sys.stderr)
    rec = None
    try:
        t = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
        wall = time.monotonic() - t
        (work / f"{results.name}.log").write_text(p.stdout + p.stderr)
        recs = list(latest_by_combo(results).values())
        rec = recs[0] if recs else None
        pushed = reg.stored_bytes()
    finally:
        reg.close()
        for ref in ((rec.image or {}).get("tags") or []) if rec else []:
            subprocess.run([DOCKER, "rmi", ref], capture_output=True)
    if rec is None:
        raise SystemExit(f"{label}: no record (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return {"label": label, "rev": rev, "exit": p.returncode, "wall_s": round(wall, 1),
            "stage": rec.stage, "status": rec.status, "cause": rec.cause,
            "digest": bool((rec.image or {}).get("digest")), "image_bytes": (rec.image or {}).get("size"),
            "registry_bytes": pushed, "timings": rec.timings,
            "levels": {lv: v.get("status") for lv, v in (rec.probe or {}).items()}}


def base_lock(sel: list[str], work: Path) -> dict:
    """A cold lock and a fresh debootstrap: one after the other, then overlapped (BaseFutures)."""
    from envbuild import build as B
    from envbuild import pipeline as PL
    from envbuild.base import bootstrap
    from envbuild.docker import detect
    from envbuild.index import Metadata
    from envbuild.matrix import matrix_from_args
    from envbuild.expand import plan_from_args

    p = argparse.ArgumentParser()
    B.add_arguments(p)
    args = p.parse_args(sel)
    meta = Metadata()
    m, combo = matrix_from_args(args), plan_from_args(args, meta).combos[0]
    engine = detect()
    quiet = lambda s: print(f"  {s}", file=sys.stderr)  # noqa: E731

    def fresh_caches(tag: str) -> None:  # a lock that resolves again; uv downloads metadata again
        os.environ["ENVBUILD_CACHE"] = str(work / f"cache-{tag}")
        os.environ["UV_CACHE_DIR"] = str(work / f"uv-{tag}")

    def lock_once(tag: str) -> float:
        fresh_caches(tag)
        t = time.monotonic()
        lr = B._lock_adapter(m, meta)(combo, work / f"locks-{tag}")
        if lr.status != "ok":
            raise SystemExit(f"lock: {lr.status}: {lr.detail[:500]}")
        return time.monotonic() - t

    def boot(ref: str):
        return bootstrap(engine, tag=ref, log=quiet)

    out: dict = {"combo": combo.id}
    refs = [f"envbuild-bench-overlap/base:{secrets.token_hex(4)}" for _ in range(2)]
    try:
        # Overlapped first: whatever a first download warms (a proxy, the mirror's own cache)
        # then favours the sequential run, so the saving reported is not flattered by it.
        print("base-lock: a cold lock and a fresh debootstrap at once (BaseFutures) ...", file=sys.stderr)
        bases = PL.BaseFutures(lambda c: boot(refs[0]), key=lambda c: "bootstrap")
        t = time.monotonic()
        bases.start(combo)
        lock_s = lock_once("ovl")
        tw = time.monotonic()
        bases(combo)
        out["overlapped"] = {"lock_s": round(lock_s, 1), "base_wait_s": round(time.monotonic() - tw, 1),
                             "wall_s": round(time.monotonic() - t, 1)}
        print("base-lock: a cold lock, then a fresh debootstrap ...", file=sys.stderr)
        t = time.monotonic()
        lock_s = lock_once("seq")
        tb = time.monotonic()
        boot(refs[1])
        boot_s = time.monotonic() - tb
        out["sequential"] = {"lock_s": round(lock_s, 1), "bootstrap_s": round(boot_s, 1),
                             "wall_s": round(time.monotonic() - t, 1)}
    finally:
        for ref in refs:
            subprocess.run([DOCKER, "rmi", ref], capture_output=True)
    out["saved_s"] = round(out["sequential"]["wall_s"] - out["overlapped"]["wall_s"], 1)
    return out


def summarize(runs: list[dict]) -> dict:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["label"], []).append(r)
    out = {}
    for label, rs in by.items():
        t = lambda k: [float(r["timings"].get(k) or 0) for r in rs]  # noqa: E731
        out[label] = {"runs": len(rs), "wall_s": statistics.median(r["wall_s"] for r in rs),
                      "push_s": statistics.median(t("push")), "probe_s": statistics.median(t("probe")),
                      "push_probe_wall_s": statistics.median(t("push_probe_wall")) if rs[0]["timings"].get(
                          "push_probe_wall") is not None else None}
        if out[label]["push_probe_wall_s"] is not None:
            out[label]["hidden_s"] = statistics.median(
                a + b - c for a, b, c in zip(t("push"), t("probe"), t("push_probe_wall")))
    if "before" in out and "after" in out:
        out["saved_s"] = round(out["before"]["wall_s"] - out["after"]["wall_s"], 1)
    return out


def print_table(out: dict) -> None:
    rows = [("run", "wall", "push", "probe", "push||probe", "pushed", "record")]
    for r in out.get("push_probe", {}).get("runs", []):
        tm = r["timings"]
        rows.append((f"{r['label']} {r['rev'][:8]}", f"{r['wall_s']:.0f} s", f"{tm.get('push', 0):.0f} s",
                     f"{tm.get('probe', 0):.0f} s",
                     f"{tm['push_probe_wall']:.0f} s" if "push_probe_wall" in tm else "-",
                     f"{r['registry_bytes'] / 1e9:.2f} GB", f"{r['stage']} {r['status']}"))
    bl = out.get("base_lock")
    if bl:
        s, o = bl["sequential"], bl["overlapped"]
        rows.append(("lock then bootstrap", f"{s['wall_s']:.0f} s", f"lock {s['lock_s']:.0f} s",
                     f"boot {s['bootstrap_s']:.0f} s", "-", "-", ""))
        rows.append(("lock || bootstrap", f"{o['wall_s']:.0f} s", f"lock {o['lock_s']:.0f} s",
                     f"wait {o['base_wait_s']:.0f} s", "-", "-", f"saved {bl['saved_s']:.0f} s"))
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
    s = out.get("push_probe", {}).get("summary", {})
    if "saved_s" in s:
        print(f"push-probe: median wall {s['before']['wall_s']:.0f} s before, {s['after']['wall_s']:.0f} s after "
              f"(saved {s['saved_s']:.0f} s); the overlap hid {s['after'].get('hidden_s', 0):.0f} s of probe "
              f"per run (median)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", default="cu124")
    ap.add_argument("--vllm", default="0.8.4")
    ap.add_argument("--verl", default="0.4.1")
    ap.add_argument("--before", default="HEAD~1", help="revision without the overlap")
    ap.add_argument("--after", default="HEAD", help="revision with it")
    ap.add_argument("--rounds", type=int, default=1, help="push-probe runs of each, alternating")
    ap.add_argument("--port", type=int, default=5001, help="loopback port for the throw-away registries")
    ap.add_argument("--sections", default="push-probe,base-lock")
    ap.add_argument("--out", default=str(HERE / "build_overlap.json"))
    args = ap.parse_args(argv)
    sel = ["--cuda", args.cuda, "--vllm", args.vllm, "--verl", args.verl]
    sections = set(args.sections.split(","))
    out: dict = {"selectors": sel, "cpus": os.cpu_count(), "measured": time.strftime("%Y-%m-%d"),
                 "load_before": os.getloadavg()}
    prev = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    work = Path(tempfile.mkdtemp(prefix="envbuild-bench-overlap-", dir="/var/tmp"))
    try:
        if "push-probe" in sections:
            code = {lb: export_rev(rev, work / lb) for lb, rev in (("before", args.before), ("after", args.after))}
            runs = []
            for i in range(args.rounds):
                for lb in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    runs.append(build_run(lb, code[lb][0], code[lb][1], sel, args.port, work))
            out["push_probe"] = {"revs": {lb: c[0] for lb, c in code.items()}, "runs": runs,
                                 "summary": summarize(runs)}
        elif "push_probe" in prev:
            out["push_probe"] = prev["push_probe"]
        if "base-lock" in sections:
            out["base_lock"] = base_lock(sel, work)
        elif "base_lock" in prev:
            out["base_lock"] = prev["base_lock"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    print_table(out)
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
