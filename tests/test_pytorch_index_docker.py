"""lock -> build -> probe through the PyTorch-index code path, end to end on the real engine.

A local index laid out like the PyTorch index (`<root>/cu128/torch/`, PEP 503 HTML, no upload
times) serves a real torch wheel: this machine's CPU build of 2.13.0, relabelled +cu128 with
consistent metadata (torch 2.13.0's default build on the package index is cu130, so cu128 goes
through the PyTorch index). Everything else comes from the configured index. The image must hold
the mirror's torch, and the probe must see what it really is: a CPU build where cu128 was asked
for (`cuda-mismatch`), never "works". ~1 min warm, a 1.7 GB image, removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from local_index import LocalIndex, find_local_wheel, relabel_wheel  # noqa: E402

CID = "verl0.6.1-hf-torch2.13.0-cu128-py3.11"


def test_build_and_probe_a_torch_from_the_pytorch_index(tmp_path):
    cpu = find_local_wheel("torch-2.13.0+cpu-cp311-*.whl")
    if cpu is None:
        pytest.skip("no torch 2.13.0 CPU wheel in pip's find-links folders")
    from envbuild.base import bootstrap
    from envbuild.docker import detect

    engine = detect()
    base = bootstrap(engine).ref
    idx = LocalIndex(tmp_path / "index")
    idx.html_roots.add("cu128")
    served = idx.add("cu128", relabel_wheel(cpu, tmp_path, "cpu", "cu128"), uploaded="")["sha256"]
    results = tmp_path / "results"
    env = {**os.environ, "ENVBUILD_PYTORCH_INDEX": idx.root_url.replace("http://", "http://envbuild:pt-s3cr3t@")}
    rec = None
    try:
        p = subprocess.run([sys.executable, "-m", "envbuild", "build", "--cuda", "cu128", "--hf", "--torch", "2.13.0",
                            "--verl", "0.6.1", "--base", base, "--probe", "cpu", "--results", str(results)],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=3000)
        recs = sorted((results / "records" / CID).glob("*.json"))
        assert recs, p.stdout + p.stderr
        rec = json.loads(recs[-1].read_text())
        assert rec["stage"] != "build", (rec["cause"], rec["detail"], p.stderr[-2000:])
        # the lock took torch from the mirror, by its hash
        torch_txt = (results / "locks" / CID / "torch.txt").read_text()
        assert "torch==2.13.0+cu128" in torch_txt and f"--hash=sha256:{served}" in torch_txt
        # the build downloaded that file whole from the mirror (its torch-index secret; the lock only reads ranges), and the image holds it
        whole = [r for r in idx.requests if r.startswith("GET /files/cu128/torch-2.13.0+cu128") and "[range]" not in r]
        log = next((results / "logs").rglob("*.log"), None)
        steps = [ln for ln in (log.read_text().splitlines() if log else []) if "torch" in ln and ("CACHED" in ln or "RUN" in ln)]
        assert whole, ([r for r in idx.requests if "torch" in r], steps[-6:], p.stdout[-1500:])
        checks = {c["name"]: c for c in rec["probe"]["env"]["checks"]}
        assert checks["import-torch"]["status"] == "pass"
        # ... and the probe tells the truth about it: a CPU build, not cu128
        assert (rec["status"], rec["stage"], rec["cause"]) == ("fail", "probe", "cuda-mismatch"), rec["detail"]
        assert checks["torch-cuda"]["status"] == "fail" and "a CPU build, expected cu128" in checks["torch-cuda"]["detail"]
        # the mirror's credentials are in no record, lock or rendered file
        for f in results.rglob("*"):
            if f.is_file() and f.stat().st_size < 50_000_000:
                assert b"pt-s3cr3t" not in f.read_bytes(), f
    finally:
        idx.close()
        if rec and rec.get("image"):
            engine.remove(*rec["image"].get("tags", []), force=True)
