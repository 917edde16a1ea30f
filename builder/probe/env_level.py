"""Level 1, env: is this the stack the combination asked for, and is it consistent?"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import subprocess
import sys
import time

from .classify import classify_exception
from . import requirements
from .fatbin import image_coverage
from .vocab import ENGINE, ENGINE_SPECS
from .hardware import ACCELERATORS, Variant, parse_platform, parse_variant, variant_of
from .verdict import FAIL, NOT_APPLICABLE, PASS, SKIPPED, Verdict


def dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def base_version(v: str) -> str:
    """'2.6.0+cu124' -> '2.6.0': a local variant still satisfies ==2.6.0."""
    return v.split("+", 1)[0]


def same_version(seen: str | None, want: str) -> bool:
    if seen is None:
        return False
    try:
        from packaging.version import Version  # present wherever pip/vllm/verl are
        return Version(base_version(seen)) == Version(base_version(want))
    except ImportError:
        return base_version(seen) == base_version(want)
    except Exception:
        return base_version(seen) == base_version(want)


def torch_variant(torch) -> Variant:
    """The accelerator variant this torch was built for, asked the way each kind's descriptor says
    (torch.version.cuda, torch.version.hip); cpu when it reports none."""
    for kind in ACCELERATORS.values():
        seen = getattr(torch.version, kind.torch_attr, None) if kind.torch_attr else None
        if seen:
            return variant_of(kind.name, seen)
    return Variant("cpu")


def variant_matches(seen: Variant, want: str) -> bool:
    """Compare as variants (hardware.parse_variant: 12.4 == cu124 == 12.4.1; cpu expects a CPU build)."""
    return parse_variant(want or "cpu") == seen


# NCCL keeps its buffers in /dev/shm; Docker's 64 MB default makes recent NCCL fail at the first
# collective ("unhandled system error"), and Ray's object store wants more. 1 GiB is what verl's
# own launch docs ask for (--shm-size); the table shows it and doctor checks the host.
MIN_SHM_BYTES = 1 << 30


def site_roots() -> list[str]:
    """The environment's site-packages folders, in sys.path order."""
    return [p for p in dict.fromkeys(sys.path) if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]


def _start_gpu_arch():
    """The coverage read in a process of its own, started with env: a CPU build of torch (by its
    version's local tag) needs none."""
    if "+cpu" in (dist_version("torch") or ""):
        return None
    from .spawn import child_env, package
    try:
        return subprocess.Popen([sys.executable, "-m", f"{package()}.fatbin", *sorted(site_roots())],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env(),
                                cwd="/"), time.perf_counter()
    except OSError:
        return None


def _coverage(started) -> dict:
    """The child's answer; read here when it broke (the same function, so the same answer)."""
    if started is not None:
        proc, _ = started
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            _stop(started)
            out = ""
        try:
            if proc.returncode == 0:
                return json.loads(out)
        except ValueError:
            pass
    return image_coverage(sorted(site_roots()))


def _stop(started) -> None:
    if started is not None:
        started[0].kill()
        started[0].communicate()


def _library_checks(v: Verdict, torch, seen: Variant, gpu_arch=None) -> None:
    """The GPU libraries and kernels of a torch of this kind, as its descriptor lists them
    (AcceleratorKind.env_checks); a kind without them (a CPU build; ROCm: AMD code objects are
    not read) is said not checked, and the coverage child started beside torch's import stops."""
    checks = {"cudnn": _check_cudnn, "nccl": _check_nccl,
              "gpu-arch": lambda v, torch: _check_gpu_arch(v, torch, gpu_arch)}
    for name, check in checks.items():
        if name in seen.accelerator.env_checks:
            check(v, torch)
        else:
            v.add(name, NOT_APPLICABLE, "CPU build of torch" if seen.kind == "cpu" else
                  f"a {seen.label} build of torch: envbuild has no {name} check for it")
    if "gpu-arch" not in seen.accelerator.env_checks:
        _stop(gpu_arch)


def _check_gpu_arch(v: Verdict, torch, started=None) -> None:
    """Which GPUs every native extension of this environment has kernels for (no GPU needed)."""
    t0 = started[1] if started is not None else time.perf_counter()
    cov = _coverage(started)
    v.hardware["gpu_arch"] = cov
    v.hardware["min_shm_bytes"] = MIN_SHM_BYTES
    limits = {sm: pkgs for sm, pkgs in cov["lacking"].items() if int(sm[3:]) >= 80}
    detail = f"runs on {', '.join(cov['supports']) or 'no known GPU'}"
    if limits:
        detail += "; not on " + "; ".join(f"{sm} ({', '.join(p[:3])})" for sm, p in limits.items())
    # A fact about the image, never a verdict on the stack: the row shows it and `pick --gpu`
    # decides with it; the gpu level on a real GPU is what fails when a kernel is missing.
    v.add("gpu-arch", PASS, detail, None, time.perf_counter() - t0)


def run_env(v: Verdict, expect: dict, engine: str) -> None:
    pip_check = _start_pip_check()  # separate processes: they run while torch imports
    gpu_arch = _start_gpu_arch()
    v.versions["python"] = platform.python_version()
    v.versions["glibc"] = "-".join(platform.libc_ver()) or None
    v.add("python", PASS, f"{sys.executable} {platform.python_version()}")
    machine = platform.machine()
    v.versions["machine"] = machine
    want_platform = expect.get("platform")
    if want_platform:  # an image built for another machine (or run without emulation) is not this row's
        ok = parse_platform(machine) == parse_platform(want_platform)
        v.add("platform", PASS if ok else FAIL, f"machine {machine}, expected {want_platform}",
              None if ok else "platform-mismatch")

    t0 = time.perf_counter()
    try:
        import torch
    except BaseException as e:  # a broken torch is the first thing a bad image shows
        c = classify_exception(e, engine)
        v.add("import-torch", c.status, c.detail, c.cause, time.perf_counter() - t0)
        _check_pip(v, pip_check)
        _stop(gpu_arch)
        return
    v.timings["import_torch"] = round(time.perf_counter() - t0, 4)
    v.versions["torch"] = torch.__version__
    v.versions["torch_cuda"] = torch.version.cuda
    v.add("import-torch", PASS, torch.__version__, seconds=time.perf_counter() - t0)

    want_torch = expect.get("torch")
    if want_torch:
        ok = same_version(torch.__version__, want_torch)
        v.add("torch-version", PASS if ok else FAIL, f"torch {torch.__version__}, expected {want_torch}",
              None if ok else "version-mismatch")

    seen = torch_variant(torch)
    v.versions["torch_variant"] = seen.tag
    want_cuda = expect.get("cuda")
    if want_cuda:
        ok = variant_matches(seen, want_cuda)
        v.add("torch-cuda", PASS if ok else FAIL,
              f"torch is a {seen.label} build, expected {want_cuda}"
              + ("" if ok else ": the wrong torch variant got installed"), None if ok else "cuda-mismatch")
    else:
        v.add("torch-cuda", SKIPPED, f"torch is a {seen.label} build; no --expect-cuda given")

    _library_checks(v, torch, seen, gpu_arch)

    abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False))
    v.versions["cxx11_abi"] = abi
    v.add("cxx11-abi", PASS, f"torch._C._GLIBCXX_USE_CXX11_ABI={abi} (extensions must match; the contract "
                             "level checks their symbols)")

    _check_pip(v, pip_check)

    want_engine = expect.get("engine_version")
    dist = ENGINE[engine].dist
    seen = dist_version(dist)
    v.versions[dist] = seen
    if seen is None:
        v.add("engine-version", FAIL, f"{dist} is not installed", "module-missing")
    elif want_engine:
        ok = same_version(seen, want_engine)
        v.add("engine-version", PASS if ok else FAIL, f"{dist} {seen}, expected {want_engine}",
              None if ok else "version-mismatch")
    else:
        v.add("engine-version", PASS, f"{dist} {seen}")

    kernels = sorted({k for e in ENGINE_SPECS for k in e.kernels})
    for extra in ("transformers", "flash-attn", *kernels, "xformers", "ray", "tensordict", "numpy"):
        if extra not in v.versions:
            v.versions[extra] = dist_version(extra)
    want_verl = expect.get("verl")
    seen = dist_version("verl")
    v.versions["verl"] = seen
    if want_verl:
        ok = same_version(seen, want_verl)
        v.add("verl-version", PASS if ok else FAIL, f"verl {seen}, expected {want_verl}",
              None if ok else ("module-missing" if seen is None else "version-mismatch"))
    else:
        v.add("verl-version", PASS if seen else NOT_APPLICABLE, f"verl {seen}" if seen else "verl not installed")


def _torch_pins(prefix: str) -> dict[str, str]:
    """nvidia-* pins from torch's own metadata: {'nvidia-cudnn-cu12': '9.1.0.70'}."""
    out = {}
    for r in md.requires("torch") or []:
        m = re.match(r"\s*(nvidia-[\w\-]+)\s*(?:\[[^\]]*\])?\s*\(?\s*==\s*([\w.]+)", r)  # "(==x)": old metadata
        if m and m.group(1).startswith(prefix) and "extra ==" not in r:
            out[m.group(1)] = m.group(2)
    return out


def _check_cudnn(v: Verdict, torch) -> None:
    t0 = time.perf_counter()
    try:
        rt = torch.backends.cudnn.version()  # e.g. 90100; loads libcudnn, needs no driver
    except BaseException as e:
        c = classify_exception(e)
        v.add("cudnn", c.status, c.detail, c.cause, time.perf_counter() - t0)
        return
    v.versions["cudnn"] = rt
    compiled = None
    try:
        compiled = ".".join(map(str, torch._C._cudnn.getCompileVersion()))
    except Exception:
        pass
    pins = _torch_pins("nvidia-cudnn")
    problems = []
    if rt is None:
        problems.append("torch cannot load cuDNN")
    for dist, pin in pins.items():
        seen = dist_version(dist)
        if seen is None:
            problems.append(f"{dist}=={pin} pinned by torch is not installed")
        elif not same_version(seen, pin):
            problems.append(f"{dist} {seen} installed, torch pins {pin}")
        elif rt is not None and seen.split(".")[:2] != [str(rt // 10000), str(rt // 100 % 100)]:
            problems.append(f"runtime cuDNN {rt} is not the pinned wheel {seen} (another libcudnn is loaded first)")
    detail = f"runtime {rt}, compiled {compiled}, pins {pins or 'none'}"
    v.add("cudnn", FAIL if problems else PASS, "; ".join(problems) or detail,
          "cudnn-mismatch" if problems else None, time.perf_counter() - t0)


def _check_nccl(v: Verdict, torch) -> None:
    t0 = time.perf_counter()
    try:
        ver = torch.cuda.nccl.version()
        ver = ".".join(map(str, ver)) if isinstance(ver, tuple) else str(ver)
    except BaseException as e:
        c = classify_exception(e)
        v.add("nccl", c.status, c.detail, c.cause, time.perf_counter() - t0)
        return
    v.versions["nccl"] = ver
    pins = _torch_pins("nvidia-nccl")
    problems = []
    for dist, pin in pins.items():
        seen = dist_version(dist)
        if seen is None:
            problems.append(f"{dist}=={pin} pinned by torch is not installed")
        elif not same_version(seen, pin):
            problems.append(f"{dist} {seen} installed, torch pins {pin}")
        elif seen.split(".")[:3] != ver.split(".")[:3]:
            problems.append(f"torch reports NCCL {ver} but {dist} is {seen}")
    v.add("nccl", FAIL if problems else PASS, "; ".join(problems) or f"NCCL {ver}, pins {pins or 'none'}",
          "nccl-mismatch" if problems else None, time.perf_counter() - t0)


OWN_CHECK = "requirements of installed distributions"


def _start_pip_check():
    """`pip check` where pip is installed, else requirements.py's reading of the same (uv-made
    environments have no pip), in a process of its own: it runs while torch imports."""
    # Ask the metadata, never `import pip`: a failed import of pip flips setuptools' distutils shim
    # into pip mode, and a later `import setuptools` (verl -> pkg_resources) then dies on an assertion.
    from .spawn import child_env, package
    if dist_version("pip") is not None:
        how, cmd = "pip check", [sys.executable, "-m", "pip", "check", "--disable-pip-version-check"]
        env = {**os.environ, "PIP_NO_INPUT": "1"}
    else:
        how, cmd, env = OWN_CHECK, [sys.executable, "-m", f"{package()}.requirements"], child_env()
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd="/"), time.perf_counter(), how
    except OSError:
        return None


def _check_pip(v: Verdict, started) -> None:
    t0 = time.perf_counter()
    problems, how = None, OWN_CHECK
    if started is not None:
        proc, t0, how = started
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines = [ln for ln in out.strip().splitlines() if ln.strip()]
        if proc.returncode == 0:
            problems = []
        elif proc.returncode == 1 and lines:  # both say what is broken, a line each, and exit 1
            problems = lines
        elif how == "pip check" or proc.returncode != requirements.NO_PACKAGING:
            # Killed at the timeout, or the child broke, not the stack: silence is no answer, so
            # read it here (what pip check would say, requirements.py).
            started = None
    if started is None:
        problems = requirements.problems()
    if problems is None:
        v.add("pip-check", SKIPPED, "neither pip nor packaging is installed", seconds=time.perf_counter() - t0)
    else:
        v.add("pip-check", FAIL if problems else PASS, "\n".join(problems[:30]) or f"{how}: no broken requirements",
              "broken-requirements" if problems else None, time.perf_counter() - t0)
