"""An image's OCI annotations and envbuild's own labels, and the repository images go to. Its
names (tags, content tags, references) are values: envbuild.values.

Labels come in two sets, because the Dockerfile is part of the content hash:
  * render_labels - facts fixed by the combination, its lock and its base; written into the
    Dockerfile (so they are part of what the content hash names);
  * build_labels  - facts of one build (content hash, created, revision); given to the builder
    (`--label`), so a new envbuild commit or another day does not rebuild an unchanged image.

envbuild's labels live under exactly one namespace, NS (`org.envbuild.`).

Version scheme (`org.opencontainers.image.version`): `<combination tag>-<lock era YYYYMMDD>`, e.g.
`verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11-20250711`. The combination tag names the declared
versions; the era is the date the lock was resolved "as of" (uv --exclude-newer), which fixes every
transitive pin. Two images with one version hold the same packages; a later era sorts later.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

from .errors import InputError
from .values import sanitize_tag

NS = "org.envbuild"
OCI = "org.opencontainers.image"
SRC = Path(__file__).resolve().parent.parent  # a source checkout when .git is there


def version(combo_tag: str, era: str) -> str:
    return sanitize_tag(f"{combo_tag}-{era.replace('-', '')}" if era else combo_tag)


def _ns(d: dict[str, str]) -> dict[str, str]:
    return {f"{NS}.{k}": v for k, v in d.items()}


def render_labels(combo, base, era: str, lock_hash: str, torch_index: str) -> dict[str, str]:
    """Labels written into the Dockerfile (ordered: OCI first, then envbuild's)."""
    eng = f"{combo.engine} {combo.engine_version}".strip()
    out = {f"{OCI}.title": f"envbuild {combo.id}",
           f"{OCI}.description": f"verl {combo.verl} with {eng}, torch {combo.torch} {combo.cuda}, "
                                 f"Python {combo.python}",
           f"{OCI}.version": version(combo.tag, era),
           f"{OCI}.base.name": base.ref}
    if base.digest:
        out[f"{OCI}.base.digest"] = base.digest
    out.update(_ns({"verl": combo.verl, "engine": combo.engine, "engine-version": combo.engine_version,
                    "torch": combo.torch, "cuda": combo.cuda, "python": combo.python, "combo": combo.id,
                    "lock-hash": lock_hash or "", "era": era, "torch-index": torch_index,
                    "base": f"{base.kind}:{base.ref}"}))
    return out


def build_labels(combo_id: str, content_hash: str, lock_hash: str | None, base_kind: str, base_ref: str,
                 created: str | None = None) -> dict[str, str]:
    """Labels given at build time (not part of the content hash). source and licenses appear
    only where envbuild knows them (a git remote; a licence in its package metadata)."""
    out = {f"{OCI}.created": created or now(), f"{OCI}.revision": envbuild_revision()}
    for key, val in ((f"{OCI}.source", _git("remote", "get-url", "origin")), (f"{OCI}.licenses", _licenses())):
        if val:
            out[key] = val
    out.update(_ns({"combo": combo_id, "content-hash": content_hash, "lock-hash": lock_hash or "",
                    "base": f"{base_kind}:{base_ref}"}))
    return out


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(*args: str) -> str | None:
    if not (SRC / ".git").exists():
        return None
    try:
        p = subprocess.run(["git", "-C", str(SRC), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() or None if p.returncode == 0 else None


def _licenses() -> str | None:
    try:
        md = metadata.metadata("envbuild")
    except metadata.PackageNotFoundError:
        return None
    return md.get("License-Expression") or md.get("License") or None


def envbuild_revision() -> str:
    """The git commit envbuild runs from (source checkout), else its package version."""
    rev = _git("rev-parse", "HEAD")
    if rev and re.fullmatch(r"[0-9a-f]{40}", rev):
        return rev
    try:
        return f"envbuild {metadata.version('envbuild')}"
    except metadata.PackageNotFoundError:
        return "unknown"


# ---------------------------------------------------------------- the repository images go to
# One name for one concept: the repository ("127.0.0.1:5000/envbuild/verl"). The matrix's
# `repository:` names its path; --repository / $ENVBUILD_REPOSITORY give the registry (host[:port],
# the matrix's path is appended) or the whole repository. The old spellings (--registry, --repo,
# $ENVBUILD_REPO, $ENVBUILD_REGISTRY, and `image:` in a matrix) work for one more release, with
# a deprecation warning.
REPOSITORY_ENV = "ENVBUILD_REPOSITORY"
DEPRECATED_ENV = ("ENVBUILD_REPO", "ENVBUILD_REGISTRY")
DEPRECATED_FLAGS = ("--registry", "--repo")
_REPOSITORY_RE = re.compile(r"[a-z0-9](?:[a-z0-9._:/-]{0,253}[a-z0-9])?")


def add_repository_arg(p, what: str = "tag for, check and push to") -> None:
    import argparse

    p.add_argument("--repository", metavar="REPO",
                   help=f"registry (host:port) or full repository to {what} "
                        f"(default: ${REPOSITORY_ENV}, else the matrix's repository, local)")
    for old in DEPRECATED_FLAGS:
        p.add_argument(old, dest="deprecated_" + old[2:], help=argparse.SUPPRESS)


def repository_from_args(args, matrix_repository: str, warn) -> tuple[str, bool]:
    """(repository, in a registry?) from --repository, the deprecated spellings, or the environment."""
    given, source = getattr(args, "repository", None), "--repository"
    for old in DEPRECATED_FLAGS:
        v = getattr(args, "deprecated_" + old[2:], None)
        if v:
            warn(f"{old} is deprecated and goes away in the next release: use --repository")
            given, source = given or v, source if given else old
    for var in (REPOSITORY_ENV, *DEPRECATED_ENV):
        if not given and os.environ.get(var):
            if var != REPOSITORY_ENV:
                warn(f"${var} is deprecated and goes away in the next release: use ${REPOSITORY_ENV}")
            given, source = os.environ[var], "$" + var
    if not given:
        return matrix_repository, False
    repo = given.rstrip("/")
    if not _REPOSITORY_RE.fullmatch(repo) or "//" in repo:
        raise InputError("command line" if source.startswith("-") else "environment", None, source, given,
                         "not a registry host[:port] or a repository host[:port]/path")
    return (repo if "/" in repo else f"{repo}/{matrix_repository}"), True
