"""Running the probe in a process of its own, and reading what it wrote: the one launcher every
path shares (here, in a container: envbuild.probe_run; doctor's env check). No container
engine here: doctor and `probe --here` judge this Python environment without one.

A probe runs in its own process group and writes its verdict as JSON; a level that outlives its
timeout is killed with its whole group (torchrun's children too) and its verdict is `timeout`,
which a record counts as a failure of the stack (envbuild.outcome). A verdict the probe could not
write (it crashed, it was killed) is made by outcome.unwritten, with every field a written one has.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from .errors import InputError
from .outcome import unwritten
from .probe.vocab import ENGINES, ERROR, EXPECT_KEYS, FAIL, LEVELS, TIMEOUT, expect_argv

IMAGE_PROBE_PARENT = "/opt/envbuild"
PROBE_MODULE = "envbuild_probe"
IMAGE_PROBE_DIR = f"{IMAGE_PROBE_PARENT}/{PROBE_MODULE}"
IMAGE_PYTHON = "/opt/venv/bin/python"
PROBE_SRC = Path(__file__).resolve().parent / "probe"

# Seconds per level: imports of a big stack take a minute on a slow disk; an engine start takes more.
DEFAULT_TIMEOUT = {"env": 300.0, "contract": 600.0, "gpu": 900.0}
EXIT_GRACE = 60.0  # seconds a probe whose levels all ended has to exit
STOP = (FAIL, TIMEOUT, ERROR)  # a level with this status ends the run: later levels build on it


# ---------------------------------------------------------------- what the probe checks


def expect_of(combo) -> dict:
    """The one builder of what the probe checks an image against (a Combo or its dict). The
    accelerator variant goes as its tag (cu124): the probe parses any spelling (hardware.parse_variant)."""
    d = combo if isinstance(combo, dict) else combo.to_dict()
    out = {"cuda": d.get("cuda") or "", "torch": d.get("torch"),
           "engine_version": d.get("engine_version"), "verl": d.get("verl"), "platform": d.get("platform")}
    return {k: v for k, v in out.items() if v and v != "?"}


def probe_args(level: str, engine: str, expect: dict) -> list[str]:
    if level not in LEVELS:
        raise InputError("command line", None, "level", level, f"not one of {', '.join(LEVELS)}")
    if engine not in ENGINES:
        raise InputError("command line", None, "engine", engine, f"not one of {', '.join(ENGINES)}")
    unknown = set(expect) - set(EXPECT_KEYS)
    if unknown:
        raise InputError("command line", None, "expect", sorted(unknown), f"unknown key(s); known: {', '.join(EXPECT_KEYS)}")
    return ["--level", level, "--engine", engine, *expect_argv(expect)]


# ---------------------------------------------------------------- launchers


def _launcher(python: str, nproc: int) -> list[str]:
    if nproc > 1:
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", PROBE_MODULE]
    return [python, "-m", PROBE_MODULE]


def run_bounded(cmd: list[str], timeout: float, env: dict | None, on_timeout,
                cwd: str | None = None) -> tuple[int | None, str, str, float]:
    """Run in its own process group; on timeout kill the group (torchrun's children too).
    -> (exit code, None if killed; stdout; stderr; wall)."""
    rc, out, err, _ends, wall = _run_levels(cmd, [""], [timeout], None, None, on_timeout, env=env, cwd=cwd)
    return rc, out, err, wall


def _run_levels(cmd: list[str], levels: list[str], limits: list[float], ldir: Path | None, on_level,
                on_timeout, env: dict | None = None,
                cwd: str | None = None) -> tuple[int | None, str, str, list[float], float]:
    """Run a probe in its own process group, which writes `ldir/<level>.json` as each level ends
    (no ldir: one level, the whole run). Each level has its limit, counted from the end of the one
    below; past it the group is killed (torchrun's children too). on_level(level) is called as each
    starts. -> (exit code, None if killed at a limit; stdout; stderr; seconds at which each level
    ended; wall)."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, text=True, env=env, cwd=cwd, start_new_session=True)
        ends: list[float] = []
        if on_level:
            on_level(levels[0])
        rc = None
        while True:
            try:
                rc = p.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                rc = None
            while ldir is not None and len(ends) < len(levels) and (ldir / f"{levels[len(ends)]}.json").is_file():
                ends.append(time.monotonic() - t0)
                if on_level and len(ends) < len(levels) and rc is None:
                    on_level(levels[len(ends)])
            if rc is not None:
                break
            # every level ended: the process only has to exit (os._exit in the probe's __main__)
            limit = limits[len(ends)] if len(ends) < len(levels) else EXIT_GRACE
            if time.monotonic() - t0 > (ends[-1] if ends else 0.0) + limit:
                on_timeout(p)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
                rc = None
                break
        wall = time.monotonic() - t0
        fo.seek(0)
        fe.seek(0)
        return rc, fo.read(), fe.read(), ends, wall


def _finish(out_json: Path, rc: int | None, out: str, err: str, wall: float, level: str, engine: str,
            expect: dict, timeout: float, runner: dict, timed_out: bool | None = None) -> dict:
    if rc is None if timed_out is None else timed_out:
        v = unwritten(level, engine, expect, TIMEOUT, "timeout",
                    f"killed after {timeout:.0f}s; last output:\n{(out + err)[-1500:]}")
    elif out_json.is_file():
        try:
            v = json.loads(out_json.read_text())
        except (OSError, json.JSONDecodeError) as e:
            v = unwritten(level, engine, expect, ERROR, "bad-verdict", f"unreadable verdict: {e}")
    else:
        v = unwritten(level, engine, expect, ERROR, "no-verdict",
                    f"probe exited {rc} without a verdict:\n{(out + err)[-1500:]}")
    v["runner"] = {**runner, "exit_code": rc, "wall_seconds": round(wall, 3), "timeout": timeout,
                   "stderr_tail": err[-3000:]}
    return v


# Run in a new network namespace (unshare, as an unprivileged user where user namespaces are
# allowed), loopback brought up first: the in-image probe's `--network none` on a host.
_NETNS_TRAMPOLINE = (
    "import fcntl,os,socket,struct,sys\n"
    "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
    "f=struct.unpack('16sH',fcntl.ioctl(s,0x8913,struct.pack('16sH22x',b'lo',0))[:18])[1]\n"
    "fcntl.ioctl(s,0x8914,struct.pack('16sH22x',b'lo',f|1))\n"
    "os.execvp(sys.argv[1],sys.argv[1:])\n")


@lru_cache(maxsize=1)
def _netns_works() -> bool:
    exe = shutil.which("unshare")
    if not exe:
        return False
    try:
        return subprocess.run([exe, "--net", "--map-root-user", sys.executable, "-c", _NETNS_TRAMPOLINE, "true"],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def isolated(cmd: list[str], python: str) -> tuple[list[str], str]:
    """The command in a network namespace without interfaces but loopback, where this host allows
    one; else as it is (the probe's audit hook still refuses Python's own sockets).
    ENVBUILD_PROBE_NETWORK=host keeps the host's network."""
    if os.environ.get("ENVBUILD_PROBE_NETWORK") == "host" or not _netns_works():
        return cmd, "host (audit hook only)"
    return ["unshare", "--net", "--map-root-user", python, "-c", _NETNS_TRAMPOLINE, *cmd], "none (network namespace)"


@contextmanager
def probe_importable(extra_env: dict | None = None):
    """A scratch folder and an environment in which any Python imports the probe as the image's
    does (`envbuild_probe`, a link to builder/probe, whatever envbuild's install)."""
    with tempfile.TemporaryDirectory(prefix="envbuild-probe-") as tmp:
        os.symlink(PROBE_SRC, os.path.join(tmp, PROBE_MODULE))
        env = {**os.environ, **(extra_env or {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, env.get("PYTHONPATH")) if p)
        yield tmp, env


def probe_here(*, level: str, engine: str, expect: dict, timeout: float | None = None, nproc: int = 1,
               python: str | None = None, extra_env: dict | None = None) -> dict:
    """Probe this Python environment (or `python`) in a child process, killed at its timeout."""
    timeout = float(timeout or DEFAULT_TIMEOUT[level])
    python = python or sys.executable
    with probe_importable(extra_env) as (tmp, env):
        out_json = Path(tmp) / "verdict.json"
        cmd = [*_launcher(python, nproc), *probe_args(level, engine, expect), "--json", str(out_json)]
        cmd, network = isolated(cmd, python)
        # cwd: `python -m` puts it first on sys.path; a source checkout there would leak into the probe
        rc, out, err, wall = run_bounded(cmd, timeout, env, lambda p: None, cwd=tmp)
        return _finish(out_json, rc, out, err, wall, level, engine, expect, timeout,
                       {"mode": "here", "python": python, "cmd": cmd, "network": network})



@lru_cache(maxsize=1)
def probe_code_hash() -> str:
    """sha256 over the probe package's sources: a changed probe re-probes."""
    h = hashlib.sha256()
    for f in sorted(PROBE_SRC.rglob("*.py")):
        h.update(f.relative_to(PROBE_SRC).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
