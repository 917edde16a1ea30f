"""Kernels compiled ahead of time in an image (vocab.JIT_KERNELS).

An engine's kernel library compiles some kernels with nvcc on first use: FlashInfer's sampler took
99.4 s on a fresh H100, and 0.2 s once the same module, compiled ahead of time on a CPU machine,
sat where FlashInfer loads such modules (bench/verl_step/sglang_h100.json). The image's build step
(`python -m envbuild_probe.jit build NAME...`, dockerfiles/Dockerfile.j2) does that with the
library's own JIT builder, for every GPU architecture the image's torch has kernels for, in one
module.

The library loads a module in its ahead-of-time folder on any GPU without checking it, so a module
must run wherever torch's kernels run, or not be there at all: each of torch's `sm_XY` becomes the
target that runs on the same GPUs (`X.Ya` for 9.x, whose torch kernels are for 9.0 only; the
family target `X.Yf` from 10.x, as a plain sm_100 cubin also runs on 10.3; plain below 9). Where the
toolkit cannot build a family target (before CUDA 12.9), where nvcc is missing, or where any
architecture fails, nothing is placed and the engine compiles on first use as before; the step
says which in one line. The environment's distributions are unchanged (check-env.py still holds).

Standard library only at import (the probe's rule); the library is imported in a child process.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .fatbin import Coverage, parse_sm, scan
from .vocab import EXIT_BAD_INPUT, JIT_KERNELS, JitKernel

KERNEL = {k.name: k for k in JIT_KERNELS}
FAMILY_FROM = (12, 9)  # the first CUDA whose nvcc builds family targets (compute_100f)


def installed(k: JitKernel) -> str | None:
    try:
        return md.version(k.dist)
    except md.PackageNotFoundError:
        return None


def nvcc() -> str | None:
    """The nvcc the library's builder finds (CUDA_HOME, PATH, /usr/local/cuda: FlashInfer's order)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for cand in ([os.path.join(home, "bin", "nvcc")] if home else []) + [shutil.which("nvcc") or "",
                                                                          "/usr/local/cuda/bin/nvcc"]:
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def nvcc_version(path: str) -> tuple[int, int] | None:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.findall(r"release (\d+)\.(\d+)", out)
    return (int(m[0][0]), int(m[0][1])) if m else None


def nvcc_threads(targets: int) -> int:
    """Architectures one nvcc compiles at once: the library's build runs an nvcc per source file
    beside each other, so half the CPUs this process may use, at most one per target (two cores:
    one, as before; the lent H100's 16: six)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(targets, cpus // 2))


def torch_archs() -> list[str]:
    """The kernels torch carries, read from its libraries' fatbins (`sm_XY` SASS, `compute_XY` PTX):
    torch.cuda.get_arch_list() answers [] without a GPU, and an image is built without one."""
    spec = _where("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    cov = Coverage()
    for c in scan(Path(list(spec.submodule_search_locations)[0]) / "lib").values():
        cov.merge(c)
    return [f"sm_{a}" for a in sorted(cov.sass)] + [f"compute_{a}" for a in sorted(cov.ptx)]


def targets(archs: list[str], cuda: tuple[int, int]) -> tuple[list[str], str]:
    """The library's architecture targets that run wherever torch's `sm_XY` kernels run, or ([], why)."""
    out = []
    ptx = [a for a in archs if a.startswith("compute_")]
    if ptx:  # torch then also runs on GPUs after its list, where no prebuilt module could follow
        return [], f"torch carries PTX ({ptx[0]}) for GPUs after its list, which a prebuilt module cannot follow"
    for a in archs:
        cc = parse_sm(a)
        if cc is None:
            return [], f"torch lists {a!r}, which is not a GPU architecture envbuild reads"
        major, minor = divmod(cc, 10)
        if major < 9:
            out.append(f"{major}.{minor}")
        elif major == 9:
            out.append(f"{major}.{minor}a")
        elif cuda >= FAMILY_FROM:
            out.append(f"{major}.{minor}f")
        else:
            return [], (f"torch has {a} kernels, which also run on later {major}.x GPUs; CUDA "
                        f"{cuda[0]}.{cuda[1]} cannot build a target that does (family targets need 12.9)")
    return sorted(set(out), key=lambda t: tuple(int(x) for x in re.findall(r"\d+", t))), ""


_BUILD = """
import importlib, sys
spec = getattr(importlib.import_module(sys.argv[1]), sys.argv[2])()
spec.build(verbose=False)
print(spec.jit_library_path)
"""


def reproducible(lib: Path) -> bool:
    """nvcc names its temporary files after its process id and those names land in the module's
    static symbols, so two builds differ; `strip --strip-unneeded` drops them (the exported
    symbols and the kernels stay): two builds of FlashInfer's sampler were then byte-identical
    and loaded with the same functions."""
    exe = shutil.which("strip")
    return bool(exe) and subprocess.run([exe, "--strip-unneeded", str(lib)], capture_output=True).returncode == 0


def _where(package: str):
    """A package's spec from sys.path, never from sys.modules (importlib.util.find_spec answers an
    imported module's spec, whatever sys.path says now)."""
    return importlib.machinery.PathFinder.find_spec(package)


def aot_path(k: JitKernel) -> Path | None:
    spec = _where(k.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / k.aot / k.aot_name / f"{k.aot_name}.so"


def build(names: list[str], python: str = sys.executable, archs: list[str] | None = None) -> dict:
    """Compile each named kernel for torch's architectures into the library's ahead-of-time
    folder; returns {name: what happened} (one line each, printed too)."""
    said = {}

    def say(name, line):
        said[name] = line
        print(f"jit: {name}: {line}", flush=True)

    cc = nvcc()
    cuda = nvcc_version(cc) if cc else None
    archs = torch_archs() if archs is None else archs
    for name in names:
        k = KERNEL[name]
        version = installed(k)
        dest = aot_path(k)
        if version is None or dest is None:
            say(name, f"not built: {k.dist} is not installed")
            continue
        if _where(k.aot_package) is not None:
            say(name, f"not built: {k.aot_package} (the library's own ahead-of-time package) is installed")
            continue
        if not cc or not cuda:
            say(name, "not built: no nvcc here; the engine compiles it on first use")
            continue
        tg, why = targets(archs, cuda)
        if not tg:
            say(name, f"not built: {why or 'torch lists no GPU architecture'}; the engine compiles it on first use")
            continue
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="envbuild-jit-") as ws:
            env = {**os.environ, k.arch_env: " ".join(tg), k.workspace_env: ws}
            if k.threads_env and k.threads_env not in os.environ:
                env[k.threads_env] = str(nvcc_threads(len(tg)))
            p = subprocess.run([python, "-c", _BUILD, k.module, k.spec], capture_output=True, text=True, env=env)
            lib = Path(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else None
            if lib is None or not lib.is_file():
                tail = ((p.stderr or p.stdout).strip().splitlines() or ["no output"])[-1]
                say(name, f"not built ({tail[:300]}); the engine compiles it on first use")
                continue
            same = reproducible(lib)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink():  # an in-place venv links a node's files: never write through into them
                dest.unlink()
            shutil.copyfile(lib, dest)
        say(name, f"{k.dist} {version} for {' '.join(tg)} in {time.perf_counter() - t0:.1f} s -> {dest}"
                  + ("" if same else " (strip failed: this layer differs from build to build)"))
    return said


def main(argv: list[str]) -> int:
    if argv[:1] == ["build"] and argv[1:]:
        unknown = [n for n in argv[1:] if n not in KERNEL]
        if unknown:
            print(f"jit: unknown kernel {unknown[0]!r} (known: {', '.join(KERNEL)})", file=sys.stderr)
            return EXIT_BAD_INPUT
        # An optimisation: whatever goes wrong here, the image is the lock without it, and the
        # engine compiles the kernel on first use; the build goes on.
        try:
            print(json.dumps(build(argv[1:])), flush=True)
        except Exception as e:  # noqa: BLE001 - one line in the build log, never a failed image
            print(f"jit: not built ({type(e).__name__}: {str(e)[:300]}); the engine compiles on first use", flush=True)
        return 0
    print("usage: python -m envbuild_probe.jit build NAME...", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
