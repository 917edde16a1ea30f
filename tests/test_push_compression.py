"""Compression of pushed layers: gzip through `docker push`, zstd (OCI media types) through
skopeo, and a clear refusal where no zstd pusher exists."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import urllib.request
import uuid
from types import SimpleNamespace

import pytest

from envbuild import docker as D
from envbuild import push as P
from envbuild import values as V
from envbuild.errors import InfraError

REGISTRY = "127.0.0.1:5000"


def test_gzip_is_docker_and_zstd_needs_a_copier(monkeypatch):
    eng = SimpleNamespace(client="/usr/bin/docker", mode="buildkit")
    assert P.pusher_for(eng, "gzip") == "docker"
    monkeypatch.setattr(P.shutil, "which", lambda name: None)
    with pytest.raises(InfraError) as e:
        P.pusher_for(eng, "zstd")
    assert e.value.cause == "no-zstd-pusher" and "skopeo" in str(e.value) and "gzip only" in str(e.value)
    monkeypatch.setattr(P.shutil, "which", lambda name: "/usr/bin/skopeo" if name == "skopeo" else None)
    assert P.pusher_for(eng, "zstd") == "skopeo"
    with pytest.raises(InfraError):
        P.pusher_for(eng, "brotli")


def test_skopeo_push_arguments_and_digest(tmp_path, monkeypatch):
    """skopeo is asked for zstd layers in an OCI manifest, from the daemon to the same reference,
    plain HTTP only for a loopback registry; the digest comes from --digestfile."""
    log = tmp_path / "argv"
    fake = tmp_path / "skopeo"
    fake.write_text("#!/bin/sh\n"
                    f"printf '%s\\n' \"$@\" > {log}\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = --digestfile ] && printf 'sha256:%064d' 7 > \"$2\"; shift; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    ref = f"{REGISTRY}/envbuild-test/zstd:t1"
    assert P.skopeo_push(ref, "zstd") == f"{REGISTRY}/envbuild-test/zstd@sha256:{7:064d}"
    argv = log.read_text().split("\n")
    assert argv[argv.index("--dest-compress-format") + 1] == "zstd"
    assert argv[argv.index("--format") + 1] == "oci"
    assert "--dest-tls-verify=false" in argv
    assert argv[-3:-1] == [f"docker-daemon:{ref}", f"docker://{ref}"]
    P.skopeo_push("registry.example.org/a/b:t", "zstd")
    assert "--dest-tls-verify=false" not in log.read_text()


def _manifest(ref: str) -> dict:
    repo, tag = V.split_ref(ref)
    host = V.registry_host(repo)
    req = urllib.request.Request(f"http://{host}/v2/{repo[len(host) + 1:]}/manifests/{tag}",
                                 headers={"Accept": P.MANIFEST_TYPES})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as r:
        return json.load(r)


@pytest.mark.docker
def test_push_zstd_and_gzip_to_the_local_registry():
    """A one-file image pushed both ways to the real registry: zstd gives OCI zstd layers, gzip
    Docker gzip layers; the digests returned are the registry's."""
    if not shutil.which("skopeo"):
        pytest.skip("skopeo is not installed (apt-get install skopeo): the zstd path needs it")
    eng = D.detect()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = uuid.uuid4().hex.encode() * 64
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    run = uuid.uuid4().hex[:8]
    local = f"envbuild-test/compression:{run}"
    p = subprocess.run([eng.client, "import", "-", local], input=buf.getvalue(), capture_output=True)
    assert p.returncode == 0, p.stderr
    refs = {c: f"{REGISTRY}/envbuild-test/compression-{c}:{run}" for c in ("gzip", "zstd")}
    try:
        for comp, ref in refs.items():
            eng.tag(local, ref)
            digest = eng.push(ref, compression=comp)
            assert eng.last_push_tool == ("skopeo" if comp == "zstd" else "docker")
            assert digest.split("@")[1] == P.registry_digest(ref)
            types = {l["mediaType"] for l in _manifest(ref)["layers"]}
            want = "application/vnd.oci.image.layer.v1.tar+zstd" if comp == "zstd" else \
                "application/vnd.docker.image.rootfs.diff.tar.gzip"
            assert types == {want}
    finally:
        eng.remove(local, *refs.values(), force=True)
