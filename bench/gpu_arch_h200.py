"""Cross-check the fatbin reader against a real GPU: the architectures read from torch's libraries
must match torch.cuda.get_arch_list(), and the GPU's own compute capability must be one the reader
says torch runs on — then a real kernel launch proves it. Prints a table, writes bench/gpu_arch_h200.json.

Run where torch with CUDA and a GPU are installed (the H200 device):
    python3 bench/gpu_arch_h200.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "builder"))
from probe.fatbin import image_coverage, parse_sm, read_coverage  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).with_name("gpu_arch_h200.json")))
    args = ap.parse_args()
    import torch

    lib = Path(torch.__file__).parent / "lib"
    t0 = time.perf_counter()
    per_file = {p.name: read_coverage(p) for p in sorted(lib.glob("*.so*"))}
    read_s = time.perf_counter() - t0
    # torch's own kernels are in libtorch_cuda; other files in torch/lib are bundled third-party
    # libraries (their own arch lists), reported per file below.
    own = [c for n, c in per_file.items() if n.startswith("libtorch_cuda")]
    torch_sass = sorted(set().union(*(c.sass for c in own)))
    torch_ptx = sorted(set().union(*(c.ptx for c in own)))
    arch_list = torch.cuda.get_arch_list()  # e.g. ['sm_80', 'sm_90', 'sm_100', 'compute_120']
    want_sass = sorted({parse_sm(a) for a in arch_list if a.startswith("sm_")})
    want_ptx = sorted({parse_sm(a) for a in arch_list if a.startswith("compute_")})
    cap = torch.cuda.get_device_capability(0)
    cc = cap[0] * 10 + cap[1]
    t0 = time.perf_counter()
    site = image_coverage([str(Path(torch.__file__).parent.parent)])
    scan_s = time.perf_counter() - t0
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    launched = float((x * 2).sum().item()) == float(sum(range(1 << 20)) * 2)
    res = {"gpu": torch.cuda.get_device_name(0), "capability": f"sm_{cc}", "torch": torch.__version__,
           "cuda": torch.version.cuda, "arch_list": arch_list, "read_sass": [f"sm_{s}" for s in torch_sass],
           "read_ptx": [f"compute_{p}" for p in torch_ptx],
           "sass_match": torch_sass == want_sass, "ptx_match": (not want_ptx) or set(want_ptx) <= set(torch_ptx),
           "reader_says_runs": f"sm_{cc}" in site["supports"] or not site["lacking"].get(f"sm_{cc}"),
           "kernel_launch_ok": launched, "read_torch_lib_seconds": round(read_s, 3),
           "scan_site_packages_seconds": round(scan_s, 3), "packages_with_kernels": len(site["packages"]),
           "site_supports": site["supports"], "site_lacking": site["lacking"],
           "torch_lib_files": {n: c.to_dict() for n, c in per_file.items() if not c.empty()}}
    for k in ("gpu", "capability", "torch", "cuda", "arch_list", "read_sass", "read_ptx", "sass_match", "ptx_match",
              "reader_says_runs", "kernel_launch_ok", "read_torch_lib_seconds", "scan_site_packages_seconds",
              "packages_with_kernels", "site_supports", "torch_lib_files"):
        print(f"{k:<28} {res[k]}")
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["sass_match"] and res["reader_says_runs"] and launched else 1


if __name__ == "__main__":
    sys.exit(main())
