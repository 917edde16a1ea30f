#!/usr/bin/env python3
"""A full linux/arm64 build of a real stack on this amd64 machine, under qemu (issue #19).

Runs one `envbuild build --platform linux/arm64 ... --base bootstrap --push --probe cpu` of a
combination the default index serves for aarch64 (default: verl 0.9.1, hf, torch 2.11.0 cu130 —
torch 2.11's aarch64 wheel on the default index is the CUDA 13.0 build), pushing to the loopback
registry, and reports the wall time, the record's stage timings, the image size, the verdict and
the GPU architectures its native code carries. Prints a table and writes JSON
(bench/arm64_build.json). The image is removed afterwards (the registry keeps its copy until the
bench's repository is deleted; the arm64 base stays in the registry as the cache it is).

Needs: ci/services.sh and ci/emulation.sh, root, the package index, ~25 GB free disk.

  python bench/arm64_build.py [--verl 0.9.1 --hf --cuda cu130] [--out bench/arm64_build.json]
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

ROOT = Path(__file__).resolve().parents[1]
REPO = "127.0.0.1:5000/envbuild-bench/arm64"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "arm64_build.json"))
    ap.add_argument("--keep", action="store_true", help="keep the local image")
    ap.add_argument("sel", nargs="*", default=["--verl", "0.9.1", "--hf", "--cuda", "cu130"])
    a = ap.parse_args()
    sel = a.sel or ["--verl", "0.9.1", "--hf", "--cuda", "cu130"]
    results = Path(tempfile.mkdtemp(prefix="envbuild-bench-arm64-"))
    cmd = [sys.executable, "-m", "envbuild", "build", *sel, "--platform", "linux/arm64", "--base", "bootstrap",
           "--repository", REPO, "--push", "--probe", "cpu", "--results", str(results), "--json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    recs = sorted((results / "records").rglob("*.json"))
    if not recs:
        print(p.stderr[-3000:], file=sys.stderr)
        return 1
    rec = json.loads(recs[-1].read_text())
    probe = rec.get("probe") or {}
    versions = next((v.get("versions") for v in probe.values() if v.get("versions")), {}) or {}
    out = {
        "date": time.strftime("%Y-%m-%d"), "command": " ".join(cmd[2:]), "exit": p.returncode,
        "wall_s": round(wall, 1), "timings": rec.get("timings"), "id": rec["combo"]["id"],
        "status": rec["status"], "stage": rec["stage"], "cause": rec.get("cause"),
        "levels": {lv: v.get("status") for lv, v in probe.items()},
        "machine": versions.get("machine"), "torch": versions.get("torch"), "torch_cuda": versions.get("torch_cuda"),
        "image_size": (rec.get("image") or {}).get("size"), "digest": (rec.get("image") or {}).get("digest"),
        "gpu_arch": (rec.get("hardware") or {}).get("gpu_arch") or next(
            (c.get("detail") for v in probe.values() for c in v.get("checks", []) if c.get("name") == "gpu-arch"), None),
        "cpus": os.cpu_count(), "load": os.getloadavg()[0],
    }
    print(f"{'what':<22} value")
    for k in ("id", "status", "stage", "cause", "levels", "machine", "torch", "torch_cuda", "wall_s", "timings",
              "image_size"):
        print(f"{k:<22} {out[k]}")
    Path(a.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    if not a.keep:
        for t in (rec.get("image") or {}).get("tags", []):
            subprocess.run(["/usr/bin/docker", "rmi", "-f", t], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
