"""Pushing an image from the daemon to its registry with a chosen layer compression, and asking a
registry for a tag's digest (envbuild.docker's Engine.push uses both).

Codecs (one descriptor each; `--compression` and every check derive from CODECS):
  none  the layers as the daemon stores them (OCI media type `…layer.v1.tar`): nothing to
        compress, so a push to a registry on the same machine costs reading the image once.
  zstd  `zstd -3 -T0` (every core) per layer, OCI media types.
  gzip  `docker push` (Docker media types, every client reads them; the daemon compresses).
  auto  none for a loopback registry; elsewhere zstd where the `zstd` program is here and the
        engine pulls zstd itself (Docker >= 23: 20.10, Debian bookworm's, fails on zstd layers
        with "archive/tar: invalid tar header"), else gzip; the report says which and why.

none and zstd go through envbuild's own pusher: `docker save` streamed (never written to disk),
each missing layer streamed into a chunked blob upload while it is read; blobs the repository
holds are not sent, blobs another repository of the same registry holds are mounted (where
this machine pushed them before: envbuild remembers which digest a layer had under which codec),
and a registry that refuses OCI media types gets gzip through `docker push`, said in the report.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field

from .errors import InfraError
from .values import registry_host, split_ref

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


@dataclass(frozen=True)
class Codec:
    name: str
    media_type: str  # of a layer in the pushed manifest ("" where docker push decides)
    argv: tuple[str, ...] = ()  # the compressor, stdin -> stdout; () = the bytes as they are
    tool: str = "envbuild"  # who pushes: envbuild | docker


CODECS = {c.name: c for c in (
    Codec("none", "application/vnd.oci.image.layer.v1.tar"),
    Codec("zstd", "application/vnd.oci.image.layer.v1.tar+zstd", ("zstd", "-3", "-T0", "-q", "-c")),
    Codec("gzip", "", tool="docker"),
)}
COMPRESSIONS = ("auto", *CODECS)


ZSTD_PULL_MAJOR = 23  # the first Docker Engine that pulls zstd layers (moby 23.0.0 release notes)


def codec_for(compression: str, ref: str, engine=None) -> Codec:
    """The codec a push of `ref` uses for `--compression` (module docstring)."""
    from .registry import is_loopback

    if compression == "auto":
        host = registry_host(split_ref(ref)[0]) or ""
        if host and is_loopback(host):
            return CODECS["none"]
        major = re.match(r"(\d+)", getattr(engine, "server_version", "") or "")
        pulls_zstd = bool(major) and int(major.group(1)) >= ZSTD_PULL_MAJOR
        return CODECS["zstd" if shutil.which("zstd") and pulls_zstd else "gzip"]
    if compression not in CODECS:
        raise InfraError("bad-compression", f"--compression {compression}: expected one of {', '.join(COMPRESSIONS)}")
    return CODECS[compression]


def pusher_for(engine, compression: str, ref: str = "") -> str:
    """Which tool pushes: `docker` or `envbuild`; refused up front (before a build) where the
    codec's program is missing."""
    codec = codec_for(compression, ref, engine)
    if codec.argv and not shutil.which(codec.argv[0]):
        raise InfraError("no-zstd-pusher",
                         f"--compression {codec.name}: the `{codec.argv[0]}` program is not on PATH "
                         f"({engine.client} pushes gzip only): apt-get install {codec.argv[0]}")
    return codec.tool


@dataclass
class PushReport:
    """What a push did: recorded beside the image (record.image["push"])."""
    digest: str  # repo@sha256:...
    codec: str
    tool: str
    seconds: float = 0.0
    sent_bytes: int = 0  # bytes uploaded (after compression)
    read_bytes: int = 0  # bytes read from the daemon
    blobs: dict = field(default_factory=lambda: {"uploaded": 0, "present": 0, "mounted": 0})
    note: str = ""

    def to_dict(self) -> dict:
        return {"codec": self.codec, "tool": self.tool, "seconds": round(self.seconds, 3),
                "sent_bytes": self.sent_bytes, "read_bytes": self.read_bytes, "blobs": dict(self.blobs),
                **({"note": self.note} if self.note else {})}


# --- the streaming pusher ---------------------------------------------------------------------

CHUNK = 1 << 20


class _Known:
    """Which blob digest a layer (by diff id) had under a codec, and in which repositories of a
    registry this machine pushed it: the pusher's memory for skipping and mounting. Losing an
    update to a concurrent push only loses a hint (the blob is uploaded instead)."""

    def __init__(self):
        from .paths import cache_dir
        self.path = cache_dir() / "pushed-blobs.json"
        try:
            self.data = json.loads(self.path.read_text())
            if not isinstance(self.data, dict):
                self.data = {}
        except (OSError, ValueError):
            self.data = {}

    def get(self, host: str, codec: str, diff_id: str) -> dict:
        e = self.data.get(f"{host} {codec} {diff_id}")
        return e if isinstance(e, dict) and isinstance(e.get("repos"), list) else {}

    def put(self, host: str, codec: str, diff_id: str, digest: str, size: int, tar_size: int, repo: str):
        e = self.get(host, codec, diff_id)
        repos = [r for r in e.get("repos", []) if r != repo][-7:] + [repo] if e.get("digest") == digest else [repo]
        self.data[f"{host} {codec} {diff_id}"] = {"digest": digest, "size": size, "tar_size": tar_size,
                                                    "repos": repos}

    def save(self):
        from .fsutil import write_json_atomic
        try:
            write_json_atomic(self.path, self.data)
        except OSError:
            pass  # a hint: the push itself succeeded


class _Compressed:
    """A layer's bytes through the codec: yields the bytes to send and hashes both sides (the diff
    id of what was read, the digest of what was sent)."""

    def __init__(self, src, codec: Codec):
        self.src, self.codec = src, codec
        self.tar_sha, self.blob_sha = hashlib.sha256(), hashlib.sha256()
        self.read = self.sent = 0
        self.error: BaseException | None = None

    def _source(self):
        while chunk := self.src.read(CHUNK):
            self.tar_sha.update(chunk)
            self.read += len(chunk)
            yield chunk

    def __iter__(self):
        if not self.codec.argv:  # the blob is the tar: one hash serves both
            self.blob_sha = self.tar_sha
            for chunk in self._source():
                self.sent += len(chunk)
                yield chunk
            return
        p = subprocess.Popen(list(self.codec.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE)

        def feed():
            try:
                for chunk in self._source():
                    p.stdin.write(chunk)
            except BaseException as e:  # noqa: BLE001 - handed to the reading side
                self.error = e
            finally:
                try:
                    p.stdin.close()
                except OSError:
                    pass

        t = threading.Thread(target=feed, daemon=True, name="envbuild-push-feed")
        t.start()
        try:
            while chunk := p.stdout.read(CHUNK):
                self.blob_sha.update(chunk)
                self.sent += len(chunk)
                yield chunk
        finally:
            t.join()
            rc = p.wait()
        if self.error:
            raise InfraError("daemon-error", f"reading the image from the daemon: {self.error}")
        if rc != 0:
            raise InfraError("daemon-error", f"{self.codec.argv[0]} exited {rc}")

    def digests(self) -> tuple[str, int]:
        return "sha256:" + self.blob_sha.hexdigest(), self.sent


class _Reread(Exception):
    """A layer skipped by its size was not the layer it looked like: read the image again."""


def stream_push(engine, ref: str, codec: Codec, timeout: float = 3600) -> PushReport:
    """Push `ref` from the daemon with `codec` (none | zstd) through envbuild's streaming pusher."""
    from .registry import OCI_MANIFEST, Registry, sha256_digest

    t0 = time.monotonic()
    repo, tag = split_ref(ref)
    host = registry_host(repo)
    if not host:
        raise InfraError("daemon-error", f"push {ref}: no registry host in the reference")
    name = repo[len(host) + 1:]
    info = engine.inspect(ref)
    if not info:
        raise InfraError("daemon-error", f"push {ref}: no such image in the daemon")
    diff_ids = list(info.get("RootFS", {}).get("Layers") or [])
    config_digest = info["Id"]
    reg = Registry(host, timeout=600, deadline_s=timeout)
    known = _Known()
    rep = PushReport("", codec.name, "envbuild")

    # 1. What the repository holds already, by name or by a mount from another repository.
    blobs: dict[str, tuple[str, int]] = {}  # diff id -> (blob digest, size) in the repository
    tar_sizes: dict[int, set] = {}  # uncompressed size -> diff ids of layers that need no upload
    for d in dict.fromkeys(diff_ids):
        e = known.get(host, codec.name, d)
        digest = d if not codec.argv else e.get("digest")
        if not digest:
            continue
        size = reg.blob_size(name, digest)
        if size is None:
            for src in reversed(e.get("repos", [])):
                if src != name and e.get("digest") == digest and reg.mount_blob(name, digest, src):
                    size = reg.blob_size(name, digest)
                    rep.blobs["mounted"] += 1
                    break
        else:
            rep.blobs["present"] += 1
        if size is not None:
            blobs[d] = (digest, size)
            tar = size if not codec.argv else e.get("tar_size")
            if isinstance(tar, int):
                tar_sizes.setdefault(tar, set()).add(d)
    config_size = reg.blob_size(name, config_digest)
    if config_size is None:
        for src in reversed(known.get(host, "config", config_digest).get("repos", [])):
            if src != name and reg.mount_blob(name, config_digest, src):
                config_size = reg.blob_size(name, config_digest)
                break

    # 2. The rest, from one streamed `docker save` (only when something is missing).
    missing = [d for d in dict.fromkeys(diff_ids) if d not in blobs]
    if missing or config_size is None:
        try:
            config_size = _upload_missing(engine, reg, ref, name, codec, missing, blobs, tar_sizes,
                                          config_digest, config_size, rep, known, host)
        except _Reread:
            config_size = _upload_missing(engine, reg, ref, name, codec, missing, blobs, {},
                                          config_digest, config_size, rep, known, host)
    for d in dict.fromkeys(diff_ids):
        digest, size = blobs[d]
        known.put(host, codec.name, d, digest, size, known.get(host, codec.name, d).get("tar_size") or
                  (size if not codec.argv else 0), name)
    known.put(host, "config", config_digest, config_digest, config_size, config_size, name)
    known.save()

    # 3. The manifest: the layers in the image's order, the daemon's config as the OCI config.
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
                "layers": [{"mediaType": codec.media_type, "digest": blobs[d][0], "size": blobs[d][1]}
                           for d in diff_ids]}
    body = json.dumps(manifest, separators=(",", ":")).encode()
    r = reg.request("PUT", name, f"manifests/{tag}", headers={"Content-Type": OCI_MANIFEST}, data=body)
    if r.status_code in (400, 415):  # MANIFEST_INVALID / unsupported: a registry without OCI types
        raise _NoOci(r.text[:200])
    if r.status_code not in (200, 201, 202):
        raise reg._fail(r, f"PUT {name}:{tag}")
    sent = sha256_digest(body)
    said = r.headers.get("Docker-Content-Digest")
    if said and said != sent:
        raise InfraError("daemon-error", f"push {ref}: sent a manifest with digest {sent} but the registry says {said}")
    rep.digest, rep.seconds = f"{repo}@{sent}", time.monotonic() - t0
    return rep


class _NoOci(Exception):
    """The registry refused an OCI manifest."""


def _upload_missing(engine, reg, ref, name, codec, missing, blobs, tar_sizes, config_digest,
                    config_size, rep, known, host) -> int:
    """Stream `docker save` once: upload each missing layer as it is read; skip a layer whose
    size equals one the repository holds (then check by its hash that it was that layer)."""
    want = set(missing)
    with engine.save_stream(ref) as stream, tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            base = m.name.rsplit("/", 1)[-1]
            blob_hex = m.name[len("blobs/sha256/"):] if m.name.startswith("blobs/sha256/") else None
            if m.isfile() and (base == config_digest[7:] + ".json" or blob_hex == config_digest[7:]):
                if config_size is None:
                    data = tf.extractfile(m).read()
                    config_size = reg.put_blob(name, data, OCI_CONFIG).size
                continue
            is_layer = base == "layer.tar" or (blob_hex is not None and f"sha256:{blob_hex}" in want | set(blobs))
            if not (m.isfile() and is_layer) or not want:
                continue  # a duplicate layer (a link), metadata, or nothing left to send
            if blob_hex is not None and f"sha256:{blob_hex}" not in want:
                continue
            src = tf.extractfile(m)
            if blob_hex is None and m.size in tar_sizes:
                h = hashlib.sha256()
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                rep.read_bytes += m.size
                if "sha256:" + h.hexdigest() not in tar_sizes[m.size]:
                    raise _Reread()
                continue
            body = _Compressed(src, codec)
            desc = reg.upload_stream(name, iter(body), body.digests)
            diff_id = "sha256:" + body.tar_sha.hexdigest()
            rep.read_bytes += body.read
            rep.sent_bytes += body.sent
            rep.blobs["uploaded"] += 1
            blobs[diff_id] = (desc.digest, desc.size)
            known.put(host, codec.name, diff_id, desc.digest, desc.size, body.read, name)
            want.discard(diff_id)
    if want:
        raise InfraError("daemon-error", f"push {ref}: `docker save` did not contain layer(s) {', '.join(sorted(want))}")
    if config_size is None:
        raise InfraError("daemon-error", f"push {ref}: `docker save` did not contain the image config")
    return config_size


def push(engine, ref: str, compression: str = "auto", timeout: float = 3600) -> PushReport:
    """Push `ref` with the codec `compression` names (module docstring) -> the report."""
    codec = codec_for(compression, ref, engine)
    pusher_for(engine, compression, ref)
    if codec.tool == "envbuild":
        try:
            return stream_push(engine, ref, codec, timeout)
        except _NoOci as e:
            rep = docker_push(engine, ref, timeout)
            rep.note = f"the registry refused OCI media types ({e}): pushed gzip through docker push"
            return rep
    rep = docker_push(engine, ref, timeout)
    if compression == "auto":
        rep.note = (f"gzip: zstd needs the zstd program and Docker >= {ZSTD_PULL_MAJOR} to pull it "
                    f"(engine {getattr(engine, 'server_version', '') or 'unknown'})")
    return rep


def docker_push(engine, ref: str, timeout: float = 3600) -> PushReport:
    t0 = time.monotonic()
    p = engine.cmd("push", ref, timeout=timeout)
    # The registry's own answer is the digest (a HEAD through envbuild.registry, with the
    # user's credentials); the push's output is only read when the registry cannot be asked.
    dig = registry_digest(ref)
    m = re.search(r"digest:\s*(sha256:[0-9a-f]{64})", p.stdout)
    if dig and m and dig != m.group(1):
        raise InfraError("daemon-error", f"docker push {ref}: pushed {m.group(1)} but the registry serves {dig}")
    if not (dig or m):
        raise InfraError("daemon-error", f"docker push {ref}: the registry names no digest for it")
    return PushReport(f"{split_ref(ref)[0]}@{dig or m.group(1)}", "gzip", "docker", time.monotonic() - t0)


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
