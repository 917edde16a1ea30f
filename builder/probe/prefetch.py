"""Ask the kernel for the files the gpu level's imports will read, many at once, as the probe starts.

On a node whose page cache is cold, importing torch faults its shared libraries in a range at a
time, one library after another (import-torch 4.1-4.8 s against 1.9 s warm on the H200,
bench/probe_modes_h200.json). posix_fadvise(WILLNEED) only schedules reads into the page cache, here
from several threads so that the disk sees many requests at once. It runs no code of the stack: a
broken library still breaks at the level that loads it, and a file it cannot open is not read ahead.

It runs in a process of its own (`python -m <package>.prefetch`): walking the package trees and
reading ELF headers is Python work that would take the GIL from the probe's own imports (as a
thread, its walk slowed a 2-core machine's cold torch import: 1.8 s against 1.6 s, medians of 3).
Asked for with ENVBUILD_PROBE_PREFETCH (auto, yes, no); auto: on a GPU node, where it was measured:
hf's gpu level on a row's venv, cold, 7.0 s against 7.3 s on an H100 (medians of 3; gpu-arch 0.86 s
against 1.12 s, the contract child's native-extensions 0.97 s against 1.67 s;
bench/probe_prefetch_h100.json). Off one, the gpu level is the CPU rehearsal of tests on a small
machine, where the walk only takes a core from the imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from .elfsyms import NotElf, read_elf
from .env_level import site_roots
from .fatbin import is_elf_library

# What the gpu level imports whatever the engine: torch (env), then transformers and tokenizers
# (the tiny model and the actor); the engine's own modules come after them.
TREES = ("torch", "transformers", "tokenizers")
WORKERS = 8


def _files(top: str) -> tuple[list[str], list[str]]:
    """(shared libraries, bytecode of this Python) under one package folder."""
    libs, pycs = [], []
    tag = f".{sys.implementation.cache_tag}."
    for d, _dirs, names in os.walk(top):
        for n in names:
            if is_elf_library(n):
                libs.append(os.path.join(d, n))
            elif tag in n and n.endswith(".pyc"):
                pycs.append(os.path.join(d, n))
    return libs, pycs


def _needed(paths: list[str], pool: dict[str, str]) -> list[str]:
    """The libraries of `pool` (file name -> path) that `paths` link, directly or through each other."""
    seen, out, todo = set(), [], list(paths)
    while todo:
        try:
            needs = read_elf(todo.pop(), want_defined=False, want_symbols=False).needed
        except (OSError, NotElf, ValueError, IndexError):
            continue  # not ours to judge: the loader will say what is wrong with it
        for n in needs:
            if n in pool and n not in seen:
                seen.add(n)
                out.append(pool[n])
                todo.append(pool[n])
    return out


def plan(site: list[str], modules: tuple[str, ...]) -> list[str]:
    """Paths in the order the probe needs them: torch's libraries and the CUDA libraries they link
    (the nvidia-* wheels, not the ones loaded only on demand, such as cuDNN's engines), then
    torch's bytecode, then each other package's libraries and bytecode."""
    found = {}
    for m in ("torch", *modules):
        top = next((os.path.join(r, m) for r in site if os.path.isdir(os.path.join(r, m))), None)
        if top is not None:  # the first root on sys.path, as for imports
            found[m] = _files(top)
    nvidia = {}
    for r in reversed(site):
        if os.path.isdir(os.path.join(r, "nvidia")):
            nvidia.update({os.path.basename(p): p for p in _files(os.path.join(r, "nvidia"))[0]})
    torch_libs, torch_pycs = found.pop("torch", ([], []))
    torch_libs.sort(key=lambda p: -os.path.getsize(p))  # the largest take longest: start them first
    out = torch_libs + _needed(torch_libs, nvidia) + torch_pycs
    for libs, pycs in found.values():
        out += libs + pycs
    return list(dict.fromkeys(out))


def read_ahead(paths: list[str], workers: int = WORKERS) -> None:
    """WILLNEED for every path, `workers` at a time; returns when all were asked for."""
    threads = [threading.Thread(target=_advise, args=(paths[i::workers],)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _advise(paths: list[str]) -> None:
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def wanted(choice: str | None = None) -> bool:
    """ENVBUILD_PROBE_PREFETCH: yes, no, or auto (the default): on a GPU node. One process per node."""
    choice = choice or os.environ.get("ENVBUILD_PROBE_PREFETCH") or "auto"
    if choice != "auto":
        return choice == "yes"
    from .sidebyside import accelerator_node
    return int(os.environ.get("LOCAL_RANK", "0")) == 0 and accelerator_node()


class Prefetch:
    """The read-ahead process for this environment's roots and `modules` (after torch)."""

    def __init__(self, modules: tuple[str, ...], site: list[str] | None = None, workers: int = WORKERS):
        from .spawn import child_env, package
        cmd = [sys.executable, "-m", f"{package()}.prefetch", "--workers", str(workers)]
        for r in (site_roots() if site is None else site):
            cmd += ["--root", r]
        self.proc = subprocess.Popen([*cmd, *modules], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=child_env(), cwd="/")

    def result(self, wait: float = 0.0) -> dict | None:
        """{"files", "seconds"} once it has asked for everything; None while it runs (it is then
        stopped: the probe is over) or when it broke."""
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return None
        out, _ = self.proc.communicate()  # it has ended: its one line is all there is
        try:
            return json.loads(out) if self.proc.returncode == 0 else None
        except ValueError:
            return None


def main(argv: list[str]) -> int:
    import argparse
    t0 = time.perf_counter()
    p = argparse.ArgumentParser(prog="envbuild-probe-prefetch", description=__doc__.splitlines()[0])
    p.add_argument("--root", action="append", default=[], help="a site-packages folder, in sys.path order")
    p.add_argument("--workers", type=int, default=WORKERS)
    p.add_argument("modules", nargs="*", help="packages read after torch, in this order")
    a = p.parse_args(argv)
    paths = plan(a.root, tuple(a.modules))
    read_ahead(paths, a.workers)
    print(json.dumps({"files": len(paths), "seconds": round(time.perf_counter() - t0, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
