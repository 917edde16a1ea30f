"""One combination rendered: its Dockerfile and build context (`envbuild render` is render_cmd).

The context holds the Dockerfile, the layer locks, the secrets helper and a copy of the
probe. Output is deterministic: the same combination, lock and base give the same bytes, and
the content hash over the whole context names the image (an image whose hash exists is not
rebuilt).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import image
from .base import resolve_base
from .errors import InputError
from .fsutil import write_atomic
from .layers import SEED_EXTRAS, SEED_STASH, STAGES, STEP_CACHE_DIR, ImageModel, expected_text, model_for
from .lockmodel import LockResult
from .values import Base, Combo
from .paths import templates_dir


__all__ = ["Base", "Rendered", "render_combo", "render_dockerfile", "render_stages", "context_hash", "base_for"]

PROBE_DIR = "envbuild_probe"  # the probe's package name inside images
BUILD_CONSTRAINTS = "locks/build-constraints.txt"
# /etc files the builder mounts its own over during RUN (present, so no step makes a stub)
ETC_STUBS = ("hostname", "hosts", "resolv.conf")
# ... added from a tar the render writes (ADD unpacks it with the archive's times, /etc's too;
# COPY into /etc would give /etc the build's time, and the layer would differ from build to build)
STUBS_TAR = "envbuild/etc-stubs.tar"
SECRETS = ("ca-bundle", "index-url", "torch-index-url")
# Template files every install step runs after uv (mounted from the context's envbuild/).
STEP_SCRIPTS = ("settle-overlaps.py", "compile-bytecode.py", "venv-seed.py")
# One time for every file envbuild writes into a context or an install step writes into a
# layer (2000-01-01, later than zip's 1980 floor): equal content gives equal layer bytes.
EPOCH = 946684800
NORMALIZE = (f"find /opt /root /run /tmp -xdev -newermt @{EPOCH} -exec touch -h -d @{EPOCH} {{}} + "
             "2>/dev/null || true")


@dataclass
class Rendered:
    combo: Combo
    context_dir: Path
    dockerfile: Path
    content_hash: str
    secrets: tuple[str, ...] = SECRETS
    base: Base | None = None
    model: ImageModel | None = None


def _probe_src() -> Path:
    return Path(__file__).resolve().parent / "probe"


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), autoescape=False,
                              keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def render_stages(model: ImageModel, stages=STAGES, from_ref: str | None = None, header: bool = True) -> str:
    """The template over some of the model's stages: all of them FROM the base is the image's
    Dockerfile; one of them FROM its parent stage is a bake target."""
    lab = image.render_labels(model.combo, model.base, model.era, model.lock_hash, model.torch_index)
    return _env().get_template("Dockerfile.j2").render(
        combo=model.combo, model=model, stages=tuple(stages), from_ref=from_ref or model.base.pinned,
        header=header, labels=lab, normalize=NORMALIZE, epoch=EPOCH,
        step_cache_dir=STEP_CACHE_DIR, step_scripts=STEP_SCRIPTS, stubs_tar=STUBS_TAR,
        seed_extras=SEED_EXTRAS, seed_stash=SEED_STASH).lstrip("\n")


def render_dockerfile(combo: Combo, lock: LockResult, base: Base) -> str:
    return render_stages(model_for(combo, lock, base))


def context_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def stubs_tar() -> bytes:
    """ETC_STUBS as a tar with fixed bytes: empty files, owner root, the mode /etc and its files
    have in every base, one time (EPOCH) for all."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        entries = [("etc", tarfile.DIRTYPE, 0o755)] + [(f"etc/{n}", tarfile.REGTYPE, 0o644) for n in ETC_STUBS]
        for name, kind, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.mtime, ti.uname, ti.gname = kind, mode, EPOCH, "root", "root"
            t.addfile(ti, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def context_files(model: ImageModel, dockerfile: str) -> dict[str, bytes]:
    """Every file of the build context, by its path in the context."""
    files: dict[str, bytes] = {"Dockerfile": dockerfile.encode(),
                               "envbuild/secrets-env.sh": (templates_dir() / "secrets-env.sh").read_bytes(),
                               "envbuild/check-env.py": (templates_dir() / "check-env.py").read_bytes(),
                               **{f"envbuild/{n}": (templates_dir() / n).read_bytes() for n in STEP_SCRIPTS},
                               STUBS_TAR: stubs_tar(),
                               "locks/tools.txt": model.tools.encode(),
                               "locks/expected.txt": expected_text(model).encode()}
    for layer in model.layers:
        files[layer.lock_file] = layer.text.encode()
    if model.build_constraints:
        files[BUILD_CONSTRAINTS] = model.build_constraints.encode()
    for p in sorted(_probe_src().rglob("*.py")):
        if "__pycache__" not in p.parts:
            files[f"{PROBE_DIR}/{p.relative_to(_probe_src())}"] = p.read_bytes()
    return files


def context_time_ns(data: bytes) -> int:
    """A context file's time, derived from its bytes. BuildKit sends a build context to the daemon
    the way rsync does, comparing size and time only, and keeps the last copy per context folder
    name (moby/buildkit#2592): with one time for every file, a lock that changed without changing
    its size (a version of the same length, another hash) was not sent again, and the build read
    the old one, --no-cache or not. Equal bytes get equal times on every machine (the context stays
    reproducible), other bytes another time (2^60 of them)."""
    h = int.from_bytes(hashlib.sha256(data).digest()[:8], "big")
    return (EPOCH + h % (1 << 30)) * 1_000_000_000 + h % 1_000_000_000


def set_context_times(root: Path) -> None:
    """Every file's time from its bytes (context_time_ns); folders one time (nothing is synced by it)."""
    for p in [*root.rglob("*"), root]:
        if p.is_file() and not p.is_symlink():
            t = context_time_ns(p.read_bytes())
            os.utime(p, ns=(t, t), follow_symlinks=False)
        else:
            os.utime(p, (EPOCH, EPOCH), follow_symlinks=False)


def render_combo(combo: Combo, lock: LockResult, base: Base, out_dir: str | Path) -> Rendered:
    d = Path(out_dir) / combo.id
    model = model_for(combo, lock, base)
    files = context_files(model, render_stages(model))
    # Replace the whole context so no stale file from an earlier render changes the hash.
    if d.exists():
        shutil.rmtree(d)
    for rel, data in files.items():
        write_atomic(d / rel, data)
    set_context_times(d)
    h = context_hash(d)
    write_atomic(meta_path(d), json.dumps(
        {"combo": combo.to_dict(), "content_hash": h, "base": base.to_dict(), "lock_hash": lock.lock_hash,
         "model": model.to_dict()}, indent=2, sort_keys=True) + "\n")
    return Rendered(combo, d, d / "Dockerfile", h, SECRETS, base, model)


def meta_path(context_dir: str | Path) -> Path:
    """What render_combo records beside a build context: combo, content hash, base, lock hash, model."""
    return Path(context_dir).parent / f"{Path(context_dir).name}.json"


def read_meta(context_dir: str | Path) -> dict | None:
    """The record meta_path names; None where there is none."""
    path = meta_path(context_dir)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(str(path), None, "rendered", str(path), f"unreadable ({e})") from None


def base_for(combo: Combo, choice: str, bootstrap_ref: str | None = None) -> Base:
    """--base nvidia | bootstrap | IMAGE -> the base, without a container engine (envbuild.base)."""
    return resolve_base(None, choice, combo, bootstrap_ref=bootstrap_ref)
