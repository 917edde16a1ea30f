"""Carry a vLLM wheel to the lent H200 in pieces and run the probe's gpu level on it (issue 9).

The H200 has torch, transformers and most of the scientific stack, but no vLLM and no network; a
device call carries at most 64 MiB of working tree, and the machine keeps /tmp while it stays warm
(30 s after a call). So the wheel is split into pieces, one carried per back-to-back call, and the
last call reassembles, installs with --target and runs the probe (ci/device/vllm_h200.sh).

    python bench/vllm_h200_carry.py prepare [--vllm 0.24.0] [--piece-mib 60]
        downloads the wheel and the few modules its offline import needs that the H200 lacks
        (DEPS, measured for 0.24.0) into .whl/ (ignored by git), splits it into .whl/pNN/, and prints
        the device calls to make, in order:   run(carry=[".whl/pNN"], command="bash ci/device/vllm_h200.sh stash .whl/pNN")
        ... and for the last piece           run(carry=[".whl/pNN"], command="bash ci/device/vllm_h200.sh run .whl/pNN")
    python bench/vllm_h200_carry.py record FETCHED_DIR [--out bench/vllm_h200.json]
        folds the files the last call left in $OUT (verdict.json, carry.json, gpumem.csv) into one
        JSON record and prints the per-stage table.

For another vLLM version: re-measure DEPS first (install the wheel with --no-deps in a throwaway
target, import vllm.entrypoints.llm and vllm.v1.engine.core with only the H200's packages on the
path, and add what ModuleNotFoundError names), then `prepare --vllm X.Y.Z`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHL = ROOT / ".whl"  # listed in .git/info/exclude: carried only when a call names it
LIMIT_MIB = 64
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_31_x86_64")

# What `import vllm.entrypoints.llm` / `vllm.v1.engine.core` asks for that the H200 image does not
# have (its package list: .library/device/KINDS.md), measured for vLLM 0.24.0 on Python 3.12.
# Why each: pydantic* (config dataclasses); msgspec, pyzmq, cbor2, pybase64, cachetools (engine core
# and serialisation, imported even in-process); llguidance, xgrammar (+ apache-tvm-ffi): class
# annotations in vllm.v1.structured_output evaluate them at import; fastapi/starlette (LLM imports the
# pooling IO factories), openai + openai-harmony, partial-json-parser (entrypoint types).
# openai 2.x, not 3.x: 3.x needs httpx2, the H200 has httpx. apache-tvm-ffi 0.1.11, not vLLM's pin
# 0.1.9: xgrammar 0.2.6+ needs >= 0.1.10, and 0.2.5 and older wheels are 45 MB; vLLM uses tvm_ffi
# only in cute-DSL kernels the probe never reaches.
DEPS = ("annotated_types==0.8.0", "apache_tvm_ffi==0.1.11", "cachetools==8.0.2", "cbor2==6.3.0", "distro==1.9.0",
        "fastapi==0.136.3", "jiter==0.19.0", "llguidance==1.7.6", "msgspec==0.23.0", "openai==2.54.0",
        "openai_harmony==0.0.8", "partial_json_parser==0.2.1.1.post7", "pybase64==1.5.1", "pydantic==2.13.4",
        "pydantic_core==2.46.4", "pyzmq==27.3.0", "sniffio==1.3.1", "starlette==1.10.0",
        "typing_inspection==0.4.5", "xgrammar==0.2.9")


def download(specs: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + specs, check=True)


def tree_bytes() -> int:
    """What travels without carry: tracked plus untracked-not-ignored files."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return sum((ROOT / f).stat().st_size for f in out.decode().split("\0") if f and (ROOT / f).is_file())


def prepare(args) -> int:
    stage = WHL / "download"
    if WHL.exists():
        for p in WHL.glob("p[0-9]*"):
            shutil.rmtree(p)
    stage.mkdir(parents=True, exist_ok=True)
    download([f"vllm=={args.vllm}"], stage)
    wheel = next(stage.glob(f"vllm-{args.vllm}-*.whl"))
    download(list(DEPS), stage)
    deps = sorted(p for p in stage.glob("*.whl") if not p.name.startswith("vllm-"))
    dep_bytes = sum(p.stat().st_size for p in deps)
    data = wheel.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    piece = args.piece_mib << 20
    chunks = [data[i:i + piece] for i in range(0, len(data), piece)]
    tree = tree_bytes()
    calls = []
    for i, c in enumerate(chunks):
        d = WHL / f"p{i:02d}"
        d.mkdir()
        (d / f"{wheel.name}.part{i:02d}").write_bytes(c)
        size = len(c)
        if i == len(chunks) - 1:  # the last call also brings the small wheels and the manifest
            for p in deps:
                shutil.copy2(p, d / p.name)
            size += dep_bytes
            (d / "manifest.txt").write_text(f"{sha}  {wheel.name}  {len(chunks)}\n")
        if size + tree > LIMIT_MIB << 20:
            sys.exit(f"call {i}: {(size + tree) / 2**20:.1f} MiB would travel (limit {LIMIT_MIB}); "
                     "lower --piece-mib")
        mode = "run" if i == len(chunks) - 1 else "stash"
        calls.append({"carry": [f".whl/p{i:02d}"], "command": f"bash ci/device/vllm_h200.sh {mode} .whl/p{i:02d}",
                      "mib": round((size + tree) / 2**20, 1)})
    plan = {"vllm": args.vllm, "wheel": wheel.name, "wheel_bytes": len(data), "sha256": sha,
            "deps": {p.name: p.stat().st_size for p in deps}, "deps_bytes": dep_bytes, "tree_bytes": tree,
            "pieces": len(chunks), "piece_mib": args.piece_mib, "calls": calls}
    (WHL / "plan.json").write_text(json.dumps(plan, indent=1))
    print(f"{wheel.name}: {len(data) / 2**20:.1f} MiB in {len(chunks)} pieces; {len(deps)} dependency wheels "
          f"{dep_bytes / 2**20:.1f} MiB; working tree {tree / 2**20:.2f} MiB")
    print("device calls, back to back (the machine goes back 30 s after a call):")
    for c in calls:
        print(f"  carry={json.dumps(c['carry'])}  command={c['command']!r}  ({c['mib']} MiB)")
    return 0


def record(args) -> int:
    src = Path(args.fetched)
    v = json.loads((src / "verdict.json").read_text())
    carry = json.loads((src / "carry.json").read_text()) if (src / "carry.json").exists() else {}
    plan = json.loads((WHL / "plan.json").read_text()) if (WHL / "plan.json").exists() else {}
    smi = []
    if (src / "gpumem.csv").exists():
        smi = [int(x.split(",")[1]) for x in (src / "gpumem.csv").read_text().splitlines() if x.count(",") == 1
               and x.split(",")[1].strip().isdigit()]
    gpu_checks = {c["name"]: {"status": c["status"], "detail": c["detail"][:300]} for c in v["checks"]
                  if c["name"].startswith("gpu:")}
    gpu_ok = bool(gpu_checks) and all(c["status"] == "pass" for c in gpu_checks.values())
    rec = {"what": "probe gpu level, engine vllm, on the lent H200 (issue 9)", "note": args.note,
           "command": "bash ci/device/vllm_h200.sh run .whl/pNN (after stash calls for the other pieces)",
           "overall_status": v["status"], "gpu_checks_pass": gpu_ok, "gpu_checks": gpu_checks,
           "other_checks_not_pass": {c["name"]: c["detail"][:300] for c in v["checks"]
                                     if not c["name"].startswith("gpu:") and c["status"] != "pass"},
           "versions": v.get("versions"), "gpu": v.get("gpu"), "timings_s": v.get("timings"),
           "peak_gpu_mem_torch_bytes": v.get("peak_gpu_mem"),
           "peak_gpu_mem_nvidia_smi_mib": max(smi) if smi else None,
           "metrics": v.get("metrics"), "carried": {**{k: plan.get(k) for k in (
               "wheel", "wheel_bytes", "sha256", "deps", "deps_bytes", "pieces", "piece_mib")}, **carry}}
    Path(args.out).write_text(json.dumps(rec, indent=1, default=str) + "\n")
    print(f"{'stage':<18}{'seconds':>10}")
    for k, s in (v.get("timings") or {}).items():
        print(f"{k:<18}{s:>10.3f}")
    print(f"peak GPU memory: torch {rec['peak_gpu_mem_torch_bytes']} B, nvidia-smi {rec['peak_gpu_mem_nvidia_smi_mib']} MiB")
    print(f"gpu checks: {'all pass' if gpu_ok else 'NOT all pass'}; overall verdict {v['status']}; wrote {args.out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--vllm", default="0.24.0")
    p.add_argument("--piece-mib", type=int, default=60)
    r = sub.add_parser("record")
    r.add_argument("fetched", help="folder holding what the last call wrote to $OUT")
    r.add_argument("--out", default=str(ROOT / "bench" / "vllm_h200.json"))
    r.add_argument("--note", default="", help="what this run was (attempt, fixes in place)")
    args = ap.parse_args()
    return prepare(args) if args.cmd == "prepare" else record(args)


if __name__ == "__main__":
    sys.exit(main())
