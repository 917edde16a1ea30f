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
    ap.add_argument("--cuobjdump", help="NVIDIA's cuobjdump (from the nvidia-cuda-cuobjdump wheel): exact cross-check")
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
           # torch's arch list names what TORCH_CUDA_ARCH_LIST built; some kernels (fp8, CUTLASS)
           # are built for more architectures, so the reader must find at least that list.
           "sass_match": set(want_sass) <= set(torch_sass), "ptx_match": (not want_ptx) or set(want_ptx) <= set(torch_ptx),
           "reader_says_runs": f"sm_{cc}" in site["supports"] or not site["lacking"].get(f"sm_{cc}"),
           "kernel_launch_ok": launched, "read_torch_lib_seconds": round(read_s, 3),
           "scan_site_packages_seconds": round(scan_s, 3), "packages_with_kernels": len(site["packages"]),
           "site_supports": site["supports"], "site_lacking": site["lacking"],
           "torch_lib_files": {n: c.to_dict() for n, c in per_file.items() if not c.empty()}}
    if args.cuobjdump:
        import re
        import subprocess

        exact = {}
        for n in res["torch_lib_files"]:
            outs = {w: subprocess.run([args.cuobjdump, f"--list-{w}", str(lib / n)], capture_output=True,
                                      text=True).stdout for w in ("elf", "ptx")}
            got = {w: sorted({int(m) for m in re.findall(r"\.sm_(\d+)[af]?\.(?:cubin|ptx)", o)}) for w, o in outs.items()}
            exact[n] = got["elf"] == sorted(per_file[n].sass) and got["ptx"] == sorted(per_file[n].ptx)
        res["cuobjdump_agrees"] = exact
        print(f"{'cuobjdump_agrees':<28} {exact}")
    for k in ("gpu", "capability", "torch", "cuda", "arch_list", "read_sass", "read_ptx", "sass_match", "ptx_match",
              "reader_says_runs", "kernel_launch_ok", "read_torch_lib_seconds", "scan_site_packages_seconds",
              "packages_with_kernels", "site_supports", "torch_lib_files"):
        print(f"{k:<28} {res[k]}")
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    ok = res["sass_match"] and res["reader_says_runs"] and launched and all(res.get("cuobjdump_agrees", {}).values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
