"""Pushing an image from the daemon to its registry with a chosen layer compression, and asking a
registry for a tag's digest (envbuild.docker's Engine.push uses both)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import InfraError
from .values import registry_host, split_ref

COMPRESSIONS = ("gzip", "zstd")


def pusher_for(engine, compression: str) -> str:
    """Which tool pushes with this compression: `docker` (gzip, the Docker media types every
    client reads) or `skopeo` (zstd, OCI media types). The classic docker client and daemon
    (`docker push`) only write gzip; BuildKit's image exporter can write zstd
    (compression=zstd,oci-mediatypes=true,force-compression=true) but only when it pushes while
    it builds, so for an image already in the daemon a copier does it: skopeo (Debian/Ubuntu
    package `skopeo`), `skopeo copy --dest-compress-format zstd docker-daemon:REF docker://REF`."""
    if compression == "gzip":
        return "docker"
    if compression != "zstd":
        raise InfraError("bad-compression", f"--compression {compression}: expected one of {', '.join(COMPRESSIONS)}")
    if shutil.which("skopeo"):
        return "skopeo"
    raise InfraError("no-zstd-pusher",
                     f"--compression zstd: {engine.client} ({engine.mode}) pushes gzip only; a copier from "
                     "the daemon to the registry is needed: install skopeo (apt-get install skopeo)")


def skopeo_push(ref: str, compression: str, timeout: float = 3600) -> str:
    """Copy a daemon image to its registry with zstd layers (OCI media types); -> repo@digest."""
    repo, _ = split_ref(ref)
    host = registry_host(repo) or ""
    insecure = host.split(":")[0] in ("localhost", "127.0.0.1") or host.startswith("127.")
    with tempfile.TemporaryDirectory(prefix="envbuild-push-") as td:
        dig = os.path.join(td, "digest")
        argv = ["skopeo", "copy", "--quiet", "--format", "oci", "--dest-compress-format", compression,
                "--dest-compress-level", "3", "--digestfile", dig,
                *(["--dest-tls-verify=false"] if insecure else []), f"docker-daemon:{ref}", f"docker://{ref}"]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise InfraError("daemon-error", f"skopeo copy {ref}: no end in {timeout:.0f}s") from None
        if p.returncode != 0:
            err = (p.stderr or p.stdout).strip().splitlines()
            raise InfraError("daemon-error", f"skopeo copy {ref}: {err[-1] if err else p.returncode}")
        digest = Path(dig).read_text().strip()
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise InfraError("daemon-error", f"skopeo copy {ref}: no digest written")
    return f"{repo}@{digest}"


# --- references and registries ----------------------------------------------------------------

MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json"])


def registry_digest(ref: str, timeout: float = 10) -> str | None:
    """The registry's digest for this tag, or None. A HEAD on the manifest (no pull) through
    envbuild.registry, with the user's Docker credentials, so a private registry answers too.
    Unknown (no registry in the ref, unreachable, auth refused) counts as absent, so a build
    happens rather than a wrong skip."""
    from .registry import Registry  # here: requests + oras cost ~0.2 s; only build/push need them

    repo, tag = split_ref(ref)
    host = registry_host(repo)
    if not host:
        return None
    try:
        d = Registry(host, timeout=timeout).head_manifest(repo[len(host) + 1:], tag.lstrip("@"))
    except InfraError:
        return None
    return d.digest if d else None


