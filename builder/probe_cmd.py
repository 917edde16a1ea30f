"""`envbuild probe`: run the probe in a container (`IMAGE`) or in this Python (`--here`).

The probe package (builder/probe) is self-contained; here it is mounted read-only into the
container at the path the Dockerfile renderer copies it to, so any image (also one built by
someone else) is probed by this version of the probe. A probe that outlives its level's timeout
is killed and the verdict is `timeout`; a broken stack never raises, only infrastructure does.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import EnvbuildError

# Where the renderer puts things inside images (dockerfiles/ uses these constants).
IMAGE_PROBE_PARENT = "/opt/envbuild"
IMAGE_PROBE_DIR = f"{IMAGE_PROBE_PARENT}/envbuild_probe"
IMAGE_PYTHON = "/opt/venv/bin/python"
PROBE_MODULE = "envbuild_probe"
PROBE_SRC = Path(__file__).resolve().parent / "probe"

LEVELS = ("env", "contract", "gpu")
ENGINES = ("vllm", "sglang", "hf")
# Seconds per level: imports of a big stack take a minute on a slow disk; an engine start takes more.
DEFAULT_TIMEOUT = {"env": 300.0, "contract": 600.0, "gpu": 900.0}
EXPECT_KEYS = ("cuda", "torch", "engine_version", "verl")
EXIT = {"pass": 0, "fail": 1, "timeout": 1, "error": 2, "needs-gpu": 3}


def docker_exe(docker: str = "docker") -> str:
    """Debian's client (has buildx/BuildKit here); /usr/local/bin/docker is a newer client without."""
    if docker == "docker" and os.path.exists("/usr/bin/docker"):
        return "/usr/bin/docker"
    return docker


def gpu_present() -> bool:
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        return True
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    try:
        return subprocess.run([exe, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def probe_args(level: str, engine: str, expect: dict) -> list[str]:
    if level not in LEVELS:
        raise EnvbuildError(f"level={level!r}: not one of {', '.join(LEVELS)}")
    if engine not in ENGINES:
        raise EnvbuildError(f"engine={engine!r}: not one of {', '.join(ENGINES)}")
    unknown = set(expect) - set(EXPECT_KEYS)
    if unknown:
        raise EnvbuildError(f"expect has unknown key(s) {sorted(unknown)}; known: {', '.join(EXPECT_KEYS)}")
    args = ["--level", level, "--engine", engine]
    for k in EXPECT_KEYS:
        if expect.get(k):
            args += [f"--expect-{k.replace('_', '-')}", str(expect[k])]
    return args


def _launcher(python: str, nproc: int) -> list[str]:
    if nproc > 1:
        return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", PROBE_MODULE]
    return [python, "-m", PROBE_MODULE]


def _outcome(level: str, engine: str, expect: dict, status: str, cause: str, detail: str) -> dict:
    """A verdict the probe could not write itself (timeout, crash, docker error)."""
    return {"schema": 1, "level": level, "engine": engine, "expect": expect, "status": status, "cause": cause,
            "checks": [{"name": "probe-run", "status": status, "detail": detail[-2000:], "cause": cause,
                        "seconds": 0.0}], "versions": {}, "timings": {}, "gpu": {}, "peak_gpu_mem": None,
            "metrics": {}}


def _run(cmd: list[str], timeout: float, env: dict | None, on_timeout,
         cwd: str | None = None) -> tuple[int | None, str, str, float]:
    """Run in its own process group; on timeout kill the group (torchrun's children too)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True, cwd=cwd)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        on_timeout(p)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        return None, out, err, time.monotonic() - t0


def _finish(out_json: Path, rc: int | None, out: str, err: str, wall: float, level: str, engine: str,
            expect: dict, timeout: float, runner: dict) -> dict:
    if rc is None:
        v = _outcome(level, engine, expect, "timeout", "timeout",
                     f"killed after {timeout:.0f}s; last output:\n{(out + err)[-1500:]}")
    elif out_json.is_file():
        try:
            v = json.loads(out_json.read_text())
        except (OSError, json.JSONDecodeError) as e:
            v = _outcome(level, engine, expect, "error", "bad-verdict", f"unreadable verdict: {e}")
    else:
        v = _outcome(level, engine, expect, "error", "no-verdict",
                     f"probe exited {rc} without a verdict:\n{(out + err)[-1500:]}")
    v["runner"] = {**runner, "exit_code": rc, "wall_seconds": round(wall, 3), "timeout": timeout,
                   "stderr_tail": err[-3000:]}
    return v


def probe_image(image: str, *, level: str, engine: str, expect: dict, timeout: float | None = None,
                docker: str = "docker", nproc: int = 1, gpus: bool | None = None, mount_probe: bool = True,
                python: str = IMAGE_PYTHON, pull: str = "missing") -> dict:
    """Probe IMAGE in a throw-away container; returns the verdict dict (never raises for a broken stack)."""
    timeout = float(timeout or DEFAULT_TIMEOUT[level])
    exe = docker_exe(docker)
    name = f"envbuild-probe-{secrets.token_hex(5)}"
    with tempfile.TemporaryDirectory(prefix="envbuild-probe-") as tmp:
        os.chmod(tmp, 0o777)  # the image may run as another user
        cmd = [exe, "run", "--rm", "--pull", pull, "--name", name, "--network", "host", "--read-only",
               "--tmpfs", "/tmp:rw,exec,size=4g", "--shm-size", "2g", "-e", "HOME=/tmp", "-w", "/tmp",
               "-e", f"PYTHONPATH={IMAGE_PROBE_PARENT}", "-e", "PYTHONDONTWRITEBYTECODE=1",
               "-v", f"{tmp}:/out", "--entrypoint", python]
        if mount_probe:
            cmd[-2:-2] = ["-v", f"{PROBE_SRC}:{IMAGE_PROBE_DIR}:ro"]
        if gpus if gpus is not None else gpu_present():
            cmd[3:3] = ["--gpus", "all"]
        launcher = _launcher(python, nproc)[1:]  # the entrypoint is the python
        cmd += [image, *launcher, *probe_args(level, engine, expect), "--json", "/out/verdict.json",
                "--scratch", "/tmp"]

        def kill(_p):
            subprocess.run([exe, "kill", name], capture_output=True, timeout=60)
            subprocess.run([exe, "rm", "-f", name], capture_output=True, timeout=60)

        try:
            rc, out, err, wall = _run(cmd, timeout, None, kill)
        except FileNotFoundError as e:
            return _outcome(level, engine, expect, "error", "no-docker", f"{exe}: {e}")
        if rc == 125 or (rc in (126, 127) and not (Path(tmp) / "verdict.json").exists()):
            # docker itself failed (no such image, daemon error): infrastructure, not a verdict
            v = _outcome(level, engine, expect, "error", "docker-error", (err or out)[-2000:])
            v["runner"] = {"mode": "image", "image": image, "exit_code": rc, "cmd": cmd}
            return v
        return _finish(Path(tmp) / "verdict.json", rc, out, err, wall, level, engine, expect, timeout,
                       {"mode": "image", "image": image, "cmd": cmd})


def probe_here(*, level: str, engine: str, expect: dict, timeout: float | None = None, nproc: int = 1,
               python: str | None = None, extra_env: dict | None = None) -> dict:
    """Probe this Python environment (or `python`) in a child process, killed at its timeout."""
    timeout = float(timeout or DEFAULT_TIMEOUT[level])
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="envbuild-probe-") as tmp:
        # The image layout in miniature: <tmp>/envbuild_probe -> builder/probe, whatever envbuild's install.
        os.symlink(PROBE_SRC, os.path.join(tmp, PROBE_MODULE))
        env = {**os.environ, **(extra_env or {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, env.get("PYTHONPATH")) if p)
        out_json = Path(tmp) / "verdict.json"
        cmd = [*_launcher(python, nproc), *probe_args(level, engine, expect), "--json", str(out_json)]
        # cwd: `python -m` puts it first on sys.path; a source checkout there would leak into the probe
        rc, out, err, wall = _run(cmd, timeout, env, lambda p: None, cwd=tmp)
        return _finish(out_json, rc, out, err, wall, level, engine, expect, timeout,
                       {"mode": "here", "python": python, "cmd": cmd})


# ----------------------------------------------------------------------------- CLI
def add_arguments(p) -> None:
    p.add_argument("image", nargs="?", help="image to probe (omit with --here)")
    p.add_argument("--here", action="store_true", help="probe the current Python environment, no Docker")
    p.add_argument("--python-exe", metavar="PATH",
                   help="with --here: probe the environment of this interpreter (default: the current one)")
    p.add_argument("--level", choices=LEVELS, default="contract", help="a level includes the levels below it")
    p.add_argument("--engine", choices=ENGINES, default="vllm")
    p.add_argument("--expect-cuda", help="the combination's CUDA, e.g. 12.4 ('cpu' for a CPU build)")
    p.add_argument("--expect-torch")
    p.add_argument("--expect-engine-version")
    p.add_argument("--expect-verl")
    p.add_argument("--timeout", type=float, help="seconds before the probe is killed (default per level: "
                   + ", ".join(f"{k} {v:.0f}" for k, v in DEFAULT_TIMEOUT.items()) + ")")
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) for the gpu level, via torchrun")
    p.add_argument("--docker", default="docker", help="docker client (default: /usr/bin/docker if present)")
    p.add_argument("--json", dest="json_out", help="write the verdict here")
    p.epilog = "exit status: 0 pass, 1 fail or timeout, 2 error (probe or docker broke), 3 needs a GPU"
    from .fanout import add_ray_arguments  # --ray ADDRESS [selectors]: the Ray fan-out (envbuild.fanout)
    add_ray_arguments(p)


def run(args) -> int:
    if getattr(args, "ray", None):
        from .fanout import run_from_args
        return run_from_args(args)
    if bool(args.image) == bool(args.here):
        raise EnvbuildError("give either IMAGE or --here (not both)")
    if args.timeout is not None and args.timeout <= 0:
        raise EnvbuildError(f"--timeout={args.timeout}: must be > 0")
    if args.python_exe and not args.here:
        raise EnvbuildError("--python-exe goes with --here")
    if args.python_exe and not shutil.which(args.python_exe):
        raise EnvbuildError(f"--python-exe={args.python_exe!r}: no such interpreter")
    if args.nproc < 1:
        raise EnvbuildError(f"--nproc={args.nproc}: must be >= 1")
    expect = {"cuda": args.expect_cuda, "torch": args.expect_torch,
              "engine_version": args.expect_engine_version, "verl": args.expect_verl}
    expect = {k: v for k, v in expect.items() if v}
    if args.here:
        v = probe_here(level=args.level, engine=args.engine, expect=expect, timeout=args.timeout, nproc=args.nproc,
                       python=args.python_exe)
    else:
        v = probe_image(args.image, level=args.level, engine=args.engine, expect=expect, timeout=args.timeout,
                        docker=args.docker, nproc=args.nproc)
    if args.json_out:
        from .fsutil import write_json_atomic
        write_json_atomic(args.json_out, v)
    print_summary(v)
    return EXIT.get(v.get("status"), 2)


def print_summary(v: dict, file=None) -> None:
    file = file or sys.stdout
    for c in v.get("checks", []):
        if c["status"] not in ("pass", "not-applicable", "skipped"):
            first = (c.get("detail") or "").strip().splitlines()
            print(f"  {c['status']:<10} {c['name']}: {first[0][:200] if first else ''}", file=file)
    t = v.get("timings", {})
    where = v.get("runner", {}).get("image") or "here"
    print(f"probe {v.get('level')}/{v.get('engine')} [{where}]: {v.get('status')}"
          + (f" ({v.get('cause')})" if v.get("cause") else "")
          + (f", {t['process']:.1f}s" if "process" in t else ""), file=file)
