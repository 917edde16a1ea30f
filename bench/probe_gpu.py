"""Speed and tolerance of the probe's gpu level (hf engine), in this Python environment.

    python bench/probe_gpu.py [--repeat 3] [--calibrate] [--out FILE]

Runs `envbuild probe --here --level gpu --engine hf` REPEAT times as whole processes (imports and
model build included), prints per-stage timings and peak GPU memory, and with --calibrate runs
larger batches with the engine in bf16 and fp32 and a loose tolerance to measure how far the
engine's logprobs are from the trainer's (the basis of probe/gpu_level.py's TOLERANCE).
Writes bench/probe_gpu.json on a GPU host (bench/probe_gpu.cpu.json otherwise).
Needs only the probe package: envbuild need not be installed (the repo root is put on sys.path).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("import_torch", "env", "contract", "build_model", "init_distributed", "engine_start", "rollout",
          "trainer_setup", "old_logprobs", "update", "push", "rollout2", "new_logprobs", "gpu", "process")


def probe_env(tmp: str) -> dict:
    link = os.path.join(tmp, "envbuild_probe")
    if not os.path.exists(link):
        os.symlink(ROOT / "builder" / "probe", link)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p)}


def run_probe(tmp: str, args: list[str]) -> tuple[dict, float]:
    out = os.path.join(tmp, f"v{time.monotonic_ns()}.json")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "envbuild_probe", "--level", "gpu", "--engine", "hf", *args,
                        "--json", out], env=probe_env(tmp), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if not os.path.exists(out):
        sys.exit(f"probe wrote no verdict (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(Path(out).read_text()), wall


def cuda_arg() -> list[str]:
    try:
        import torch
        return ["--expect-cuda", torch.version.cuda or "cpu"]
    except ImportError:
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = {"machine": {"host": platform.node(), "python": platform.python_version()}, "runs": [], "calibration": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeat):
            v, wall = run_probe(tmp, cuda_arg())
            res["runs"].append({"wall": round(wall, 3), "status": v["status"], "timings": v["timings"],
                                "peak_gpu_mem": v["peak_gpu_mem"], "gpu": v["gpu"], "versions": v["versions"],
                                "metrics": v["metrics"], "failed": [c for c in v["checks"] if c["status"] != "pass"
                                                                    and c["status"] != "not-applicable"]})
        if a.calibrate:
            for dtype in ("bfloat16", "float32"):
                for seed in (0, 1):
                    v, wall = run_probe(tmp, ["--engine-dtype", dtype, "--prompts", "16", "-n", "8",
                                              "--max-tokens", "48", "--seed", str(seed), "--tol-max", "10",
                                              "--tol-mean", "10"])
                    m = v["metrics"]
                    res["calibration"].append({"engine_dtype": dtype, "seed": seed, "status": v["status"],
                                               "after_push": m.get("logprob_match"),
                                               "before_update": m.get("rollout1_logprob_diff"),
                                               "wall": round(wall, 3)})
    gpu = (res["runs"] or [{}])[0].get("gpu", {}).get("name", "cpu")
    res["machine"]["gpu"] = gpu
    print_table(res)
    out = a.out or str(ROOT / "bench" / ("probe_gpu.json" if gpu != "cpu" else "probe_gpu.cpu.json"))
    Path(out).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["status"] == "pass" for r in res["runs"]) else 1


def print_table(res: dict) -> None:
    runs = res["runs"]
    print(f"probe gpu level, hf engine, on {res['machine'].get('gpu')}  ({len(runs)} whole-process runs)")
    print(f"{'stage':<18}" + "".join(f"{'run ' + str(i + 1):>10}" for i in range(len(runs))))
    for s in STAGES:
        print(f"{s:<18}" + "".join(f"{r['timings'].get(s, float('nan')):>10.3f}" for r in runs))
    print(f"{'wall (outside)':<18}" + "".join(f"{r['wall']:>10.3f}" for r in runs))
    print(f"{'peak GPU MiB':<18}" + "".join(f"{(r['peak_gpu_mem'] or 0) / 2**20:>10.1f}" for r in runs))
    print(f"{'status':<18}" + "".join(f"{r['status']:>10}" for r in runs))
    for c in res["calibration"]:
        ap, bu = c["after_push"] or {}, c["before_update"] or {}
        print(f"calibration {c['engine_dtype']:<9} seed {c['seed']}: after push max {ap.get('max', 0):.2e} "
              f"mean {ap.get('mean', 0):.2e} ({ap.get('tokens')} tokens); before update max {bu.get('max', 0):.2e} "
              f"mean {bu.get('mean', 0):.2e}; vs old weights {ap.get('vs_old_weights_mean', 0):.2e}")


if __name__ == "__main__":
    sys.exit(main())
