"""What this machine has: the one place that asks whether a GPU is here and which.

Every accelerator kind says, in its descriptor (hardware.ACCELERATORS), which device files mean one
is present and which command lists them; `accelerator()` asks them in order. `gpus()`
reads the details doctor and pick need (name, driver, architecture) through each kind's listing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache

from .probe.hardware import ACCELERATORS, AcceleratorKind


def _answers(argv: tuple[str, ...]) -> bool:
    exe = shutil.which(argv[0]) if argv else None
    if not exe:
        return False
    try:
        return subprocess.run([exe, *argv[1:]], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@lru_cache(maxsize=1)
def accelerator() -> AcceleratorKind | None:
    """The kind of accelerator this host has (its device files, else its listing command), None
    for none. Asked once per process: a probe plan asks it for every image."""
    for kind in ACCELERATORS.values():
        if kind.device_nodes and any(os.path.exists(d) for d in kind.device_nodes):
            return kind
    for kind in ACCELERATORS.values():
        if kind.smi and _answers(kind.smi):
            return kind
    return None


def gpu_present() -> bool:
    return accelerator() is not None


def container_device_args() -> list[str]:
    """What `docker run` needs to give a container this host's accelerator ([] without one)."""
    kind = accelerator()
    return list(kind.container_args) if kind else []


def gpus() -> list[dict]:
    """[{'name', 'driver', 'sm', 'arch', 'kind'}] from the listing command of each kind that has one
    (AcceleratorKind.gpu_query); [] where none answers. `sm`: the architecture's number (90),
    `arch`: its spelling in the table (sm_90)."""
    out = []
    for kind in ACCELERATORS.values():
        exe = shutil.which(kind.gpu_query[0]) if kind.gpu_query else None
        if not exe:
            continue
        try:
            p = subprocess.run([exe, *kind.gpu_query[1:]], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        for line in p.stdout.splitlines() if p.returncode == 0 else []:
            parts = [x.strip() for x in line.split(",")]
            if len(parts) == 3:
                n = kind.arch_number(parts[2])
                out.append({"name": parts[0], "driver": parts[1], "sm": n, "arch": kind.arch_name(n) if n is not None else None,
                            "kind": kind.name})
    return out
