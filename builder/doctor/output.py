"""doctor, output group: checkpoint and log folders (atomic writes, free space)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

from ..verl_config import VerlConfig
from .common import (FAIL, GiB, PASS, SKIP, WARN, Options, Result, _gib, model_facts)

CKPT = "trainer.default_local_dir"


def check_output(cfg: VerlConfig, opt: Options) -> list[Result]:
    out = []
    facts = model_facts(cfg.get("actor_rollout_ref.model.path"))
    for key in ("trainer.default_local_dir", "trainer.rollout_data_dir", "trainer.validation_data_dir"):
        d = cfg.get(key)
        if d is None or (d == "" and key != CKPT):
            continue  # the dumps are off
        if isinstance(d, str) and not d.strip():
            # verl joins "" with its working directory: global_step_N/ land there, and resume_mode=auto
            # resumes from any latest_checkpointed_iteration.txt found there (ray_trainer._load_checkpoint)
            out.append(Result("output", key, WARN,
                              f"{key} is empty: verl saves global_step_N/ straight into the trainer's working "
                              f"directory ({os.getcwd()} from here) and resume_mode=auto resumes from whatever "
                              "checkpoint is there (an unset variable in the launch script?)",
                              f"set {key} to a directory of its own"))
            continue
        d = str(d)
        if re.match(r"^[a-z][a-z0-9+]*://", d):
            out.append(Result("output", key, SKIP, f"remote path {d} not checked here"))
            continue
        # rough size of one FSDP checkpoint: fp32 params + Adam's two fp32 moments = 6 x bf16 weights
        need = 6 * facts["weights"] if facts and facts["weights"] and key == "trainer.default_local_dir" else None
        r = check_writable(d, key, need)
        if key == CKPT and r.status != FAIL:
            r.reason += _resume_note(d, cfg.get("trainer.resume_mode"))
        out.append(r)
    hdfs = cfg.get("trainer.default_hdfs_dir")
    if hdfs:
        out.append(Result("output", "trainer.default_hdfs_dir", SKIP, f"{hdfs}: remote, not checked here"))
    return out


def _resume_note(d: str, mode: object) -> str:
    """What verl's resume_mode=auto finds there: the step of latest_checkpointed_iteration.txt."""
    if mode != "auto":
        return ""
    try:
        step = (Path(d).expanduser() / "latest_checkpointed_iteration.txt").read_text()[:32].strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f"; resume_mode=auto resumes from global_step_{step} there" if step.isdigit() else ""


def check_writable(path: str, key: str, need_bytes: int | None = None) -> Result:
    """Create the directory, write + fsync + rename + remove a file there; leave nothing behind."""
    p = Path(path).expanduser().absolute()
    missing = []
    cur = p
    while not cur.exists() and cur != cur.parent:
        missing.append(cur)
        cur = cur.parent
    if not cur.is_dir():
        return Result("output", key, FAIL, f"{cur} exists and is not a directory", f"point {key} elsewhere")
    created: list[Path] = []
    token = f".envbuild-doctor-{os.getpid()}-{secrets.token_hex(4)}"
    tmp, final = p / (token + ".tmp"), p / token
    step = "mkdir"
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        step = "write"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"envbuild doctor write test\n" * 64)
            step = "fsync"
            os.fsync(fd)
        finally:
            os.close(fd)
        step = "rename"
        os.replace(tmp, final)
        dfd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        step = "remove"
        os.unlink(final)
    except OSError as e:
        return Result("output", key, FAIL,
                      f"{p}: {step} failed: {e.strerror or e} (as uid {os.getuid()})",
                      f"make {e.filename or p} writable for this user, or point {key} elsewhere")
    finally:
        for f in (tmp, final):
            try:
                f.unlink()
            except OSError:
                pass
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
    free = shutil.disk_usage(p if p.exists() else cur).free
    details = {"path": str(p), "free": free, "needed_estimate": need_bytes}
    msg = f"{p} writable atomically (write, fsync, rename, remove); {_gib(free)} free"
    if need_bytes and free < need_bytes:
        return Result("output", key, WARN, msg + f", one checkpoint needs roughly {_gib(need_bytes)}",
                      "free space, set trainer.max_actor_ckpt_to_keep, or point it at a larger disk", details)
    if free < GiB:
        return Result("output", key, WARN, msg + " (less than 1 GiB)", "free space or point it elsewhere", details)
    return Result("output", key, PASS, msg, details=details)
