"""doctor, env group: the probe's env and contract levels here, and what the stack needs from this host."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from ..verl_config import VerlConfig
from .. import drivers, host
from ..probe.env_level import MIN_SHM_BYTES
from ..probe import vocab  # the probe's statuses (doctor's own PASS/FAIL are its results')
from ..probe.vocab import DEFAULT_ENGINE, ENGINE, ENGINES, QUIET, engine_of_rollout
from ..probe.hardware import ACCELERATORS, variant_of
from .tablecheck import check_table
from .common import (FAIL, PASS, SKIP, WARN, Options, Result)


def probe_available() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("envbuild.probe.__main__") is not None
    except (ImportError, ValueError):
        return False


def check_env(cfg: VerlConfig, opt: Options) -> list[Result]:
    name = str(cfg.get("actor_rollout_ref.rollout.name") or DEFAULT_ENGINE)
    engine = engine_of_rollout(name) or name  # verl's rollout names -> the engine (vocab.ENGINE_SPECS)
    out = [run_probe(engine, opt)]
    out += check_host(out[0].details.get("verdict") or {}, opt)
    if opt.table:
        versions = out[0].details.get("versions") or installed_versions(engine)
        from ..runscope import scopes_of
        out.append(check_table(opt, engine, versions, frozenset(scopes_of(cfg))))
    return out


def _ver_tuple(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def check_host(verdict: dict, opt: Options, shm_path: str = "/dev/shm") -> list[Result]:
    """What the stack needs from this host (the row's `hardware`): /dev/shm, the NVIDIA driver for
    the installed torch's CUDA, and kernels for this host's GPU in every extension."""
    out = []
    try:
        st = os.statvfs(shm_path)
        shm = st.f_frsize * st.f_blocks
    except OSError:
        shm = None
    if shm is None:
        out.append(Result("env", "env.shm", WARN, f"{shm_path} is missing: NCCL and Ray keep buffers there"))
    elif shm < MIN_SHM_BYTES:
        out.append(Result("env", "env.shm", FAIL, f"{shm_path} holds {shm >> 20} MiB; NCCL and Ray need "
                          f"≥ {MIN_SHM_BYTES >> 20} MiB (Docker's default 64 MB fails at the first collective)",
                          "docker run --shm-size=16g (or --ipc=host); on Kubernetes an emptyDir with medium: Memory"))
    else:
        out.append(Result("env", "env.shm", PASS, f"{shm_path}: {shm >> 20} MiB"))
    gpus = (opt.gpus_smi or host.gpus)()
    versions = verdict.get("versions") or {}
    toolkit = versions.get("torch_cuda")
    need = drivers.min_driver(toolkit) if toolkit else None
    if gpus and need:
        have, label = gpus[0]["driver"], drivers.driver_label(toolkit)
        if _ver_tuple(have) >= _ver_tuple(need):
            out.append(Result("env", "env.driver", PASS, f"{label} {have} ≥ {need} (CUDA {toolkit})"))
        else:
            floor = drivers.driver_floor(toolkit)
            out.append(Result("env", "env.driver", FAIL if not floor or _ver_tuple(have) < _ver_tuple(floor) else WARN,
                              f"{label} {have} is older than {need}, the minimum for CUDA {toolkit}",
                              "update the driver, use an image of an older CUDA (envbuild pick --cuda ...), or the "
                              "forward-compatibility package (cuda-compat) on data-center GPUs"))
    arch = ((verdict.get("hardware") or {}).get("gpu_arch") or {})
    if gpus and arch.get("supports") is not None:
        gpu = gpus[0].get("arch")  # sm_90: as the table spells it (host.gpus, through the kind)
        if gpu is not None and gpu not in arch["supports"]:
            lacking = (arch.get("lacking") or {}).get(gpu) or []
            out.append(Result("env", "env.gpu-arch", FAIL, f"{gpus[0]['name']} ({gpu}) has no kernels in "
                              f"{', '.join(lacking) or 'some extension'}: 'no kernel image is available' at run time",
                              f"envbuild pick --gpu {gpu} ..."))
        elif gpu is not None:
            out.append(Result("env", "env.gpu-arch", PASS, f"every extension has kernels for {gpus[0]['name']} ({gpu})"))
    return out


def run_probe(engine: str, opt: Options) -> Result:
    if engine not in ENGINES:
        return Result("env", "env.probe", SKIP, f"rollout.name={engine}: the probe knows {', '.join(ENGINES)}")
    if not probe_available():
        return Result("env", "env.probe", WARN, "probe not available (envbuild.probe has no __main__ here)",
                      "install an envbuild with the probe, or run `envbuild probe` on the image")
    from ..probe_exec import probe_here  # the one probe launcher (envbuild.probe_exec): no container engine

    v = probe_here(level="contract", engine=engine, expect={}, timeout=opt.probe_timeout)
    if v.get("status") == vocab.TIMEOUT:
        return Result("env", "env.probe", FAIL,
                      f"probe (env + contract) did not finish in {opt.probe_timeout:.0f}s",
                      f"run `envbuild probe --here --level contract --engine {engine}` by hand to see where")
    if v.get("cause") in ("no-verdict", "bad-verdict"):
        tail = (v["checks"][0].get("detail") or "").strip().splitlines()[-1:] or ["no output"]
        return Result("env", "env.probe", WARN, f"probe wrote no verdict: {tail[0][:300]}",
                      f"run `envbuild probe --here --level contract --engine {engine}` by hand")
    status = v.get("status")
    bad = [c for c in v.get("checks", []) if c.get("status") not in QUIET]
    names = ", ".join(f"{c['name']} ({c.get('cause') or c['status']})" for c in bad[:5])
    details = {"verdict": v, "versions": v.get("versions", {})}
    n = len(v.get("checks", []))
    if status == vocab.PASS:
        return Result("env", "env.probe", PASS, f"probe env+contract for {engine}: {n} checks pass", details=details)
    if status == vocab.NEEDS_GPU:
        return Result("env", "env.probe", WARN, f"probe env+contract for {engine}: some checks need a GPU: {names}",
                      "run doctor on a GPU machine for a full verdict", details)
    if status == vocab.FAIL:
        return Result("env", "env.probe", FAIL, f"probe env+contract for {engine} fails: {names}",
                      "use a verified image (`envbuild pick`) or fix the versions the probe names", details)
    return Result("env", "env.probe", WARN, f"the probe itself errored ({names or status})",
                  "report it with the verdict JSON (--json)", details)


def installed_versions(engine: str) -> dict:
    """Versions without importing the heavy packages (the probe's numbers are preferred when it ran)."""
    from importlib import metadata

    out: dict = {"python": ".".join(map(str, sys.version_info[:2]))}
    for dist in ("verl", "torch", ENGINE[engine].dist if engine in ENGINE else engine):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec and spec.submodule_search_locations:
            text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
            # torch's own version.py names its build, as each accelerator kind's descriptor says
            for kind in ACCELERATORS.values():
                m = kind.torch_attr and re.search(rf"^{kind.torch_attr}\s*(?::[^=]*)?=\s*['\"]([\d.]+)", text, re.M)
                if m:
                    out["torch_variant"] = variant_of(kind.name, m.group(1)).tag
                    out["torch_cuda"] = m.group(1) if kind.name == "cuda" else None
                    break
            else:
                out["torch_variant"] = "cpu"
    except (OSError, ImportError, ValueError):
        pass
    return out
