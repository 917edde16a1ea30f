"""nvcc compiling several GPU architectures at once (FlashInfer's FLASHINFER_NVCC_THREADS, nvcc
--threads) against one after the other, for FlashInfer's sampler as envbuild's kernel step builds it.

FlashInfer's build runs one nvcc per source file (three for the sampler), each compiling every
target in turn: on the lent H100's 16 cores the six targets of torch 2.11 took 411 s with most cores
idle (bench/verl_step/verl_step_aot_h100.json). This times the sampler's compile with the sources
one at a time (MAX_JOBS=1: more cores than running nvccs, as on that node) and 1 or N threads.

    python bench/jit_threads.py --site SITE --cuda-home /usr/local/cuda-13.0 \\
        [--include DIR] [--archs sm_90,sm_100] [--threads 1,2] [--out bench/jit_threads.json]

SITE holds flashinfer-python (and apache-tvm-ffi, ninja, einops, tabulate, nvidia-ml-py: `pip install
--no-deps --target SITE ...`); --include adds a header folder nvcc lacks (curand.h from the
nvidia-curand wheel). Without the CUDA runtime libraries the final link fails here: the compile,
which is what the threads change, is timed all the same, and the table says whether it linked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BUILD = """
import sys
sys.path.insert(0, {builder!r})
import importlib.util
spec = importlib.util.spec_from_file_location("envbuild_probe", {init!r}, submodule_search_locations=[{probe!r}])
m = importlib.util.module_from_spec(spec); sys.modules["envbuild_probe"] = m; spec.loader.exec_module(m)
import envbuild_probe.jit as j
print(j.build(["flashinfer-sampling"], archs=sys.argv[1].split(","))["flashinfer-sampling"])
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", required=True)
    ap.add_argument("--cuda-home", required=True)
    ap.add_argument("--include", default=None)
    ap.add_argument("--archs", default="sm_90,sm_100")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    probe = ROOT / "builder" / "probe"
    code = BUILD.format(builder=str(ROOT / "builder"), init=str(probe / "__init__.py"), probe=str(probe))
    rows = []
    for th in a.threads.split(","):
        env = {**os.environ, "PYTHONPATH": a.site, "CUDA_HOME": a.cuda_home, "MAX_JOBS": "1",
               "FLASHINFER_NVCC_THREADS": th}
        if a.include:
            env["FLASHINFER_EXTRA_CUDAFLAGS"] = f"-I{a.include}"
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code, a.archs], capture_output=True, text=True, env=env)
        secs = round(time.perf_counter() - t0, 1)
        said = (p.stdout.strip().splitlines() or [p.stderr.strip()[-200:]])[-1]
        rows.append({"threads": int(th), "seconds": secs, "linked": "not built" not in said, "said": said[:200]})
        print(f"threads {th:>2}: {secs:7.1f} s  {'linked' if rows[-1]['linked'] else 'compiled (link failed here)'}")
    doc = {"date": time.strftime("%Y-%m-%d"), "cpus": len(os.sched_getaffinity(0)), "archs": a.archs,
           "max_jobs": 1, "rows": rows,
           "command": "python bench/jit_threads.py " + " ".join(sys.argv[1:])}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
