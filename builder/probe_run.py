"""Probing images, and turning the outcome into a record: the one path every caller takes
(`envbuild build`, `envbuild probe IMAGE`, `envbuild probe --ray`, `envbuild ci probe`); the
process it runs is envbuild.probe_exec's, as for `probe --here` and doctor.

The probe package (builder/probe) is self-contained; for an image it is mounted read-only into
the container at the path the Dockerfile renderer copies it to, so any image (also one built by
someone else) is probed by this version of the probe. A probe that outlives its level's timeout is
killed and its verdict is `timeout`, which a record counts as a failure of the stack (outcome's
VERDICT_TO_RECORD: a stack that hangs is not usable, and an infrastructure error would let an
earlier "works" stand). A broken stack never raises here; only bad arguments do.

A verdict is reused when nothing it depends on changed: the image's content (its image ID, a
digest of its config and layers), the probe's code, the level, the engine, what it expects and
whether a GPU is present. The record then says which run it was reused from.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import host
from .docker import Engine
from .errors import EnvbuildError
from .fsutil import write_json_atomic
from .outcome import Verdict, record_status, unwritten
from .paths import cache_dir
from .probe.vocab import ERROR, FAIL, NEEDS_GPU, PASS
from .probe_exec import (DEFAULT_TIMEOUT, IMAGE_PROBE_DIR, IMAGE_PROBE_PARENT, IMAGE_PYTHON, PROBE_SRC, STOP, _finish,
                         _launcher, _run_levels, run_bounded, expect_of, probe_args, probe_code_hash)
from .record import Record, iter_records, latest, machine_info, write_record
from .values import parse_pinned

CONTAINER_PREFIX = "envbuild-probe-"  # probe containers' names (fanout removes orphans by it)


# ---------------------------------------------------------------- kernels compiled at the gpu level

# HOME is /tmp in the container: ~/.cache is where FlashInfer, vLLM, TVM-FFI and torch's C++
# extensions keep what they compile; the caches kept elsewhere by default are pointed into it.
JIT_MOUNT = "/tmp/.cache"
JIT_ENV = {"TRITON_CACHE_DIR": f"{JIT_MOUNT}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{JIT_MOUNT}/torchinductor",
           "CUDA_CACHE_PATH": f"{JIT_MOUNT}/nv-compute"}
JIT_KEEP_DAYS = 14  # an image's folder unused this long is removed when any probe opens one


class JitCache:
    """What an image compiles just in time at its gpu level (FlashInfer's sampling kernel: about two
    minutes of a vLLM engine's first start on an H200), kept on this machine for the next gpu probe
    of the same image. One folder per image content (the reference's manifest digest, else the
    image ID), never shared between images: a kernel built against one image's torch headers is not
    another's. The record's runner says how many files the folder held before the run.
    ENVBUILD_PROBE_JIT_CACHE=0 turns it off."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else cache_dir() / "probe-jit"

    @staticmethod
    def enabled() -> bool:
        return os.environ.get("ENVBUILD_PROBE_JIT_CACHE", "1") != "0"

    @staticmethod
    def key(eng: Engine, image: str) -> str | None:
        pinned = parse_pinned(image)
        if pinned:
            return pinned[1]
        iid = eng.image_id(image)  # None: not here yet (docker run pulls it); no cache this run
        return iid.split(":", 1)[-1] if iid else None

    def open(self, key: str) -> tuple[Path, dict]:
        d = self.root / key[:32]
        files = sum(1 for f in d.rglob("*") if f.is_file()) if d.is_dir() else 0
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o777)  # the image may run as another user
        os.utime(d)
        self.prune(keep=d)
        return d, {"key": key[:32], "files_before": files}

    def prune(self, keep: Path) -> None:
        cutoff = time.time() - JIT_KEEP_DAYS * 86400
        for d in self.root.iterdir():
            if d != keep and d.is_dir() and d.stat().st_mtime < cutoff:
                shutil.rmtree(d, ignore_errors=True)


def _jit_mount(eng: Engine, image: str, levels) -> tuple[str | None, dict | None]:
    """(host folder to mount at JIT_MOUNT, what the runner records) for a run that reaches the gpu level."""
    if "gpu" not in levels:
        return None, None
    if not JitCache.enabled():
        return None, {"off": "ENVBUILD_PROBE_JIT_CACHE=0"}
    try:
        key = JitCache.key(eng, image)
    except (EnvbuildError, OSError, subprocess.SubprocessError) as e:  # docker run then says what is wrong
        return None, {"off": f"image not inspected: {e}"}
    if key is None:
        return None, {"off": "image not on this machine before the run"}
    try:
        d, info = JitCache().open(key)
    except OSError as e:  # an unwritable cache folder costs the run its cache, never its verdict
        return None, {"off": f"cache folder: {e}"}
    return str(d), info


def _image_cmd(eng: Engine, name: str, tmp: str, image: str, level: str, engine: str, expect: dict, *,
               nproc: int, gpus: bool | None, mount_probe: bool, python: str, pull: str,
               jit_dir: str | None = None) -> list[str]:
    """`docker run` of the probe in a throw-away container; its verdicts land in `tmp` (/out); the
    kernels it compiles in `jit_dir` (JitCache), when given."""
    mounts = [(tmp, "/out", False)] + ([(str(PROBE_SRC), IMAGE_PROBE_DIR, True)] if mount_probe else [])
    mounts += [(jit_dir, JIT_MOUNT, False)] if jit_dir else []
    devices = host.container_device_args() if gpus is None else (["--gpus", "all"] if gpus else [])
    launcher = _launcher(python, nproc)[1:]  # the entrypoint is the python
    return eng.run_argv(image, [*launcher, *probe_args(level, engine, expect), "--json", "/out/verdict.json",
                                "--scratch", "/tmp"],
                        name=name, entrypoint=python, mounts=mounts, read_only=True,
                        tmpfs=["/tmp:rw,exec,size=4g"], shm_size="2g", workdir="/tmp",
                        env={"HOME": "/tmp", "PYTHONPATH": IMAGE_PROBE_PARENT, "PYTHONDONTWRITEBYTECODE": "1",
                             **(JIT_ENV if jit_dir else {})},
                        devices=devices, platform=expect.get("platform"), pull=pull,
                        # The probe needs no network (its model is built offline; loopback stays):
                        # any client below Python (a tokenizer's own HTTP code) fails fast there
                        # and is classified needs-network, instead of succeeding on a host that
                        # happens to reach the internet.
                        network="none")


def _docker_failed(rc: int | None, out: str, err: str, wrote: bool, level: str, engine: str, expect: dict,
                   runner: dict) -> dict | None:
    """docker itself failed (no such image, daemon error): infrastructure, not a verdict."""
    if rc == 125 or (rc in (126, 127) and not wrote):
        v = unwritten(level, engine, expect, ERROR, "docker-error", (err or out)[-2000:])
        v["runner"] = {**runner, "exit_code": rc}
        return v
    return None


def probe_image(image: str, *, level: str, engine: str, expect: dict, timeout: float | None = None,
                docker: str = "docker", nproc: int = 1, gpus: bool | None = None, mount_probe: bool = True,
                python: str = IMAGE_PYTHON, pull: str = "missing") -> dict:
    """Probe IMAGE in a throw-away container; returns the verdict dict (never raises for a broken stack)."""
    timeout = float(timeout or DEFAULT_TIMEOUT[level])
    eng = Engine.for_containers(docker)
    name = f"{CONTAINER_PREFIX}{secrets.token_hex(5)}"
    with tempfile.TemporaryDirectory(prefix="envbuild-probe-") as tmp:
        os.chmod(tmp, 0o777)  # the image may run as another user
        try:
            jit_dir, jit = _jit_mount(eng, image, [level])
            cmd = _image_cmd(eng, name, tmp, image, level, engine, expect, nproc=nproc, gpus=gpus,
                             mount_probe=mount_probe, python=python, pull=pull, jit_dir=jit_dir)
            rc, out, err, wall = run_bounded(cmd, timeout, None, lambda _p: eng.kill(name))
        except FileNotFoundError as e:
            return unwritten(level, engine, expect, ERROR, "no-docker", f"{eng.client}: {e}")
        runner = {"mode": "image", "image": image, "cmd": cmd, **({"jit_cache": jit} if jit else {})}
        failed = _docker_failed(rc, out, err, (Path(tmp) / "verdict.json").exists(), level, engine, expect, runner)
        return failed or _finish(Path(tmp) / "verdict.json", rc, out, err, wall, level, engine, expect, timeout,
                                 runner)


def probe_image_levels(image: str, *, levels, engine: str, expect: dict, timeout: float | None = None,
                       on_level=None, docker: str = "docker", nproc: int = 1, gpus: bool | None = None,
                       python: str = IMAGE_PYTHON, pull: str = "missing") -> dict:
    """{level: verdict} for `levels` (each includes the ones before it) from ONE container: the probe
    writes each level's verdict as that level ends and stops after a failing one. Starting the
    stack once, not once per level, saves the lower levels' imports (bench/probe_plan_cpu.json). Each
    level keeps its own timeout (`timeout`, else DEFAULT_TIMEOUT), counted from the end of the
    level below; a level that outlives it is `timeout`, the levels that ended keep their verdicts."""
    levels = list(levels)
    eng = Engine.for_containers(docker)
    name = f"{CONTAINER_PREFIX}{secrets.token_hex(5)}"
    limits = [float(timeout or DEFAULT_TIMEOUT[lv]) for lv in levels]
    with tempfile.TemporaryDirectory(prefix="envbuild-probe-") as tmp:
        os.chmod(tmp, 0o777)  # the image may run as another user
        ldir = Path(tmp) / "levels"
        ldir.mkdir()
        os.chmod(ldir, 0o777)
        try:
            jit_dir, jit = _jit_mount(eng, image, levels)
            cmd = _image_cmd(eng, name, tmp, image, levels[-1], engine, expect, nproc=nproc, gpus=gpus,
                             mount_probe=True, python=python, pull=pull, jit_dir=jit_dir)
            cmd += ["--levels-dir", "/out/levels", "--stop-at-failure"]
            rc, out, err, ends, wall = _run_levels(cmd, levels, limits, ldir, on_level, lambda _p: eng.kill(name))
        except FileNotFoundError as e:
            return {levels[0]: unwritten(levels[0], engine, expect, ERROR, "no-docker", f"{eng.client}: {e}")}
        runner = {"mode": "image", "image": image, "cmd": cmd, "levels_in_run": levels,
                  **({"jit_cache": jit} if jit else {})}
        failed = _docker_failed(rc, out, err, any(ldir.iterdir()), levels[0], engine, expect, runner)
        if failed:
            return {levels[0]: failed}
        verdicts: dict[str, dict] = {}
        for i, lv in enumerate(levels):
            f = ldir / f"{lv}.json"
            if not f.is_file() and i != len(ends):
                break  # never started: the level below stopped the run
            wall_i = (ends[i] if i < len(ends) else wall) - (ends[i - 1] if i else 0.0)
            # An ended level keeps its verdict even when a later one was killed at its timeout. A
            # level with no file of its own, when the probe stopped below it (at a level not asked
            # for) has the probe's final verdict: everything that ran.
            src = f if f.is_file() else Path(tmp) / "verdict.json"
            v = _finish(src, rc, out, err, wall_i, lv, engine, expect, limits[i], runner,
                        timed_out=rc is None and not f.is_file())
            v["level"] = lv
            verdicts[lv] = v
            if v.get("status") in STOP:
                break
        return verdicts


# ---------------------------------------------------------------- reuse by content


def reuse_key(image_id: str, level: str, engine: str, expect: dict, gpu: bool) -> str:
    blob = json.dumps({"image": image_id, "probe": probe_code_hash(), "level": level, "engine": engine,
                       "expect": expect, "gpu": gpu}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class VerdictCache:
    """Verdicts by reuse key, in the user's cache dir. Only verdicts of the stack (pass, fail,
    needs-gpu) are kept: an error or a timeout may be the machine's and is always run again."""

    KEEP = (PASS, FAIL, NEEDS_GPU)

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else cache_dir() / "verdicts"

    def get(self, key: str) -> dict | None:
        try:
            return json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, verdict: dict, run_id: str) -> None:
        if verdict.get("status") in self.KEEP:
            write_json_atomic(self.root / f"{key}.json", {**verdict, "probed_in_run": run_id})


# ---------------------------------------------------------------- levels, and the record they make


@dataclass
class Target:
    """What to probe: an image reference and, when known, its content (docker image ID)."""
    ref: str
    engine: str
    expect: dict
    image_id: str | None = None


def probe_levels(t: Target, levels, *, timeout: float | None = None, probe_fn=None,
                 cache: VerdictCache | None = None, run_id: str = "", on_level=None) -> dict[str, Verdict]:
    """{level: Verdict} for the levels in order, stopping at the first that fails, times out or
    errs (the next level builds on it). `probe_fn(ref, levels=, engine=, expect=, timeout=,
    on_level=)` -> {level: verdict} runs them (default probe_image_levels: one container for all).
    When every level's verdict is in `cache` under the same reuse key, they are returned with
    `reused_from` instead of running; otherwise all run (a level includes the ones below it)."""
    probe_fn = probe_fn or probe_image_levels
    levels = list(levels)
    gpu = host.gpu_present() if cache is not None and t.image_id else False
    keys = {lv: reuse_key(t.image_id, lv, t.engine, t.expect, gpu) for lv in levels} \
        if cache is not None and t.image_id else {}
    hits: dict[str, dict] = {}
    for lv in levels:
        hit = cache.get(keys[lv]) if keys else None
        if hit is None:
            break
        hits[lv] = {**hit, "reused_from": hit.pop("probed_in_run", None) or "an earlier run"}
        if hits[lv].get("status") in STOP:
            break
    if hits and (len(hits) == len(levels) or list(hits.values())[-1].get("status") in STOP):
        return {lv: Verdict.of(v, lv) for lv, v in hits.items()}
    out = probe_fn(t.ref, levels=levels, engine=t.engine, expect=t.expect, timeout=timeout, on_level=on_level)
    for lv, v in out.items():
        if keys:
            cache.put(keys[lv], v if isinstance(v, dict) else v.to_dict(), run_id)
    return {lv: Verdict.of(v, lv) for lv, v in out.items()}


def probe_seconds(verdicts: dict) -> float:
    return round(sum(Verdict.of(v).wall_seconds for v in verdicts.values()), 3)


# ---------------------------------------------------------------- images recorded in a results folder


@dataclass
class ProbeJob:
    """An image a results folder records for a combination, to probe again (ci probe, --ray)."""
    combo: dict
    image: dict  # the build record's image: ref, digest ("repo@sha256:..."), id, ...
    base: dict | None = None
    lock_hash: str | None = None

    @property
    def ref(self) -> str:
        return self.image.get("digest") or self.image.get("ref")

    def target(self) -> Target:
        return Target(self.ref, self.combo["engine"], expect_of(self.combo), self.image.get("id"))


def jobs_from_results(results: str | os.PathLike, combos) -> tuple[list[ProbeJob], list[str]]:
    """(jobs, ids without an image) for the planned combinations."""
    newest = latest(iter_records(results), with_image=True)
    jobs, missing = [], []
    for c in combos:
        r = newest.get(c.id)
        if r is None:
            missing.append(c.id)
        else:
            jobs.append(ProbeJob(dict(r.combo), dict(r.image), r.base, r.lock_hash))
    return jobs, missing


def record_probe(results: str | os.PathLike, job: ProbeJob, verdicts: dict, *, machine: dict | None = None,
                 extra_detail: str = "", status: str | None = None, cause: str | None = None) -> Record:
    """Write the record of a probe of an already built image (status from the verdicts unless given)."""
    st, cs, detail = record_status(verdicts)
    if status is not None:
        st, cs = status, cause
    detail = "\n".join(x for x in (detail, extra_detail) if x)
    rec = Record(combo=job.combo, stage="probe", status=st, cause=cs, detail=detail[:4000], base=job.base,
                 image=job.image, lock_hash=job.lock_hash, probe=dict(verdicts), machine=machine or machine_info())
    rec.timings = {"probe": probe_seconds(verdicts)}
    write_record(results, rec)
    return rec
