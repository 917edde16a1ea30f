"""Pushing layers: uncompressed (OCI) to a loopback registry, zstd on every core elsewhere where the
engine can pull it, gzip through `docker push`; envbuild's own streaming pusher sends only what the
repository lacks, mounts what another repository holds, and what it pushed pulls and runs."""

from __future__ import annotations

import io
import json
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


def test_codec_choice(monkeypatch):
    old = SimpleNamespace(client="/usr/bin/docker", mode="buildkit", server_version="20.10.24+dfsg1")
    new = SimpleNamespace(client="/usr/bin/docker", mode="buildx", server_version="27.3.1")
    monkeypatch.setattr(P.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert P.codec_for("auto", f"{REGISTRY}/a/b:t", old).name == "none"
    assert P.codec_for("auto", "localhost:5000/a/b:t", new).name == "none"
    assert P.codec_for("auto", "ghcr.io/a/b:t", new).name == "zstd"
    assert P.codec_for("auto", "ghcr.io/a/b:t", old).name == "gzip"  # 20.10 cannot pull zstd
    assert P.pusher_for(old, "gzip") == "docker" and P.pusher_for(old, "none") == "envbuild"
    monkeypatch.setattr(P.shutil, "which", lambda name: None)
    assert P.codec_for("auto", "ghcr.io/a/b:t", new).name == "gzip"
    with pytest.raises(InfraError) as e:
        P.pusher_for(new, "zstd")
    assert e.value.cause == "no-zstd-pusher" and "apt-get install zstd" in str(e.value)
    with pytest.raises(InfraError):
        P.codec_for("brotli", "ghcr.io/a/b:t")


def _manifest(ref: str) -> dict:
    repo, tag = V.split_ref(ref)
    host = V.registry_host(repo)
    req = urllib.request.Request(f"http://{host}/v2/{repo[len(host) + 1:]}/manifests/{tag}",
                                 headers={"Accept": P.MANIFEST_TYPES})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as r:
        return json.load(r)


def _image(eng, run: str, layers: int = 2) -> str:
    """A small image of `layers` distinct layers (an import, then steps that each add a file)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = (uuid.uuid4().hex * 2000).encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    local = f"envbuild-test/push:{run}"
    tags = [f"{local}-{i}" for i in range(layers - 1)] + [local]  # each layer its own tag: no dangling image
    p = subprocess.run([eng.client, "import", "-", tags[0]], input=buf.getvalue(), capture_output=True)
    assert p.returncode == 0, p.stderr
    for src, dst in zip(tags, tags[1:]):
        _add_layer(eng, src, dst)
    return tags


def _add_layer(eng, src: str, dst: str) -> None:
    """dst = src plus one layer (COPY of a new file: the image has no shell for a RUN)."""
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as t:
        for name, body in (("Dockerfile", f"FROM {src}\nCOPY f /f-{uuid.uuid4().hex}\n"), ("f", uuid.uuid4().hex * (500 + 100 * _add_layer.n))):
            raw = body.encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))
    _add_layer.n += 1  # layers of distinct sizes: a size shared with a missing layer means a second read
    p = subprocess.run([eng.client, "build", "-q", "--network", "host", "-t", dst, "-"],
                       input=ctx.getvalue(), capture_output=True, env={**eng._env(), "DOCKER_BUILDKIT": "1"})
    assert p.returncode == 0, p.stderr


_add_layer.n = 0


@pytest.mark.docker
def test_streaming_push_sends_what_is_missing_and_pulls_back():
    """none: OCI uncompressed layers whose digests are the diff ids; a second tag sends nothing;
    a second repository mounts; a changed top layer sends one layer; the pushed image pulls and
    its layers equal the daemon's."""
    eng = D.detect()
    run = uuid.uuid4().hex[:8]
    *below, local = _image(eng, run)
    diff_ids = eng.layers(local)
    assert len(diff_ids) == 2
    ref, ref2, other = (f"{REGISTRY}/envbuild-test/push-{run}:a", f"{REGISTRY}/envbuild-test/push-{run}:b",
                        f"{REGISTRY}/envbuild-test/push-{run}-other:a")
    try:
        for r in (ref, ref2, other):
            eng.tag(local, r)
        rep = eng.push_report(ref)  # auto -> none on loopback
        assert (rep.codec, rep.tool) == ("none", "envbuild")
        assert rep.blobs == {"uploaded": 2, "present": 0, "mounted": 0}
        assert rep.read_bytes == rep.sent_bytes > 0
        man = _manifest(ref)
        assert [l["digest"] for l in man["layers"]] == diff_ids
        assert {l["mediaType"] for l in man["layers"]} == {"application/vnd.oci.image.layer.v1.tar"}
        assert man["config"]["digest"] == eng.image_id(local)
        assert rep.digest.split("@")[1] == P.registry_digest(ref)

        again = eng.push_report(ref2)
        assert again.blobs == {"uploaded": 0, "present": 2, "mounted": 0} and again.read_bytes == 0
        assert again.digest == rep.digest.replace(ref.split(":a")[0], ref2.split(":b")[0])
        mounted = eng.push_report(other)
        assert mounted.blobs["mounted"] == 2 and mounted.sent_bytes == mounted.read_bytes == 0

        # one more layer on top: only it is sent; the two below are skipped by size, checked by hash
        top = f"{REGISTRY}/envbuild-test/push-{run}:c"
        _add_layer(eng, local, top)
        grown = eng.push_report(top)
        assert grown.blobs == {"uploaded": 1, "present": 2, "mounted": 0}
        assert 0 < grown.sent_bytes < rep.sent_bytes
        eng.remove(top, force=True)

        eng.remove(ref, ref2, other, local, *below, force=True)
        subprocess.run([eng.client, "pull", "-q", ref], check=True, capture_output=True)
        assert eng.layers(ref) == diff_ids
    finally:
        eng.remove(local, *below, ref, ref2, other, f"{REGISTRY}/envbuild-test/push-{run}:c", force=True)


@pytest.mark.docker
def test_zstd_and_gzip_layers():
    """zstd: OCI zstd layers that decompress to the diff ids; gzip: docker push's Docker layers."""
    if not shutil.which("zstd"):
        pytest.skip("the zstd program is not installed (apt-get install zstd)")
    eng = D.detect()
    run = uuid.uuid4().hex[:8]
    (local,) = _image(eng, run, layers=1)
    refs = {c: f"{REGISTRY}/envbuild-test/compression-{c}:{run}" for c in ("gzip", "zstd")}
    try:
        for comp, ref in refs.items():
            eng.tag(local, ref)
            rep = eng.push_report(ref, compression=comp)
            assert rep.tool == ("envbuild" if comp == "zstd" else "docker")
            assert rep.digest.split("@")[1] == P.registry_digest(ref)
            man = _manifest(ref)
            want = "application/vnd.oci.image.layer.v1.tar+zstd" if comp == "zstd" else \
                "application/vnd.docker.image.rootfs.diff.tar.gzip"
            assert {l["mediaType"] for l in man["layers"]} == {want}
        z = _manifest(refs["zstd"])["layers"][0]
        repo = refs["zstd"].split(":" + run)[0]
        host, name = repo.split("/", 1)
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://{host}/v2/{name}/blobs/{z['digest']}", timeout=30) as r:
            blob = r.read()
        raw = subprocess.run(["zstd", "-d", "-c"], input=blob, capture_output=True, check=True).stdout
        import hashlib
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == eng.layers(local)[0]
    finally:
        eng.remove(local, *refs.values(), force=True)


class _FakeRegistry:
    """Blobs and manifests in memory, the calls stream_push makes."""
    store: dict = {}

    def __init__(self, host, timeout=None, deadline_s=None):
        self.blobs = _FakeRegistry.store

    def blob_size(self, name, digest):
        return len(self.blobs[(name, digest)]) if (name, digest) in self.blobs else None

    def mount_blob(self, name, digest, source):
        if (source, digest) in self.blobs:
            self.blobs[(name, digest)] = self.blobs[(source, digest)]
            return True
        return False

    def upload_stream(self, name, chunks, digest_of):
        data = b"".join(chunks)
        digest, size = digest_of()
        import hashlib
        assert digest == "sha256:" + hashlib.sha256(data).hexdigest() and size == len(data)
        self.blobs[(name, digest)] = data
        return SimpleNamespace(digest=digest, size=size)

    def put_blob(self, name, data, media_type):
        import hashlib
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[(name, d)] = data
        return SimpleNamespace(digest=d, size=len(data))

    def request(self, method, name, path, headers=None, data=None):
        self.blobs[(name, path)] = data
        return SimpleNamespace(status_code=201, headers={}, text="")


def _legacy_save(layers: list[bytes], config: bytes) -> bytes:
    """`docker save` as Docker 20.10 writes it: <v1 id>/layer.tar per layer, in name order."""
    import hashlib
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        members = [(f"{i:064x}/layer.tar", body) for i, body in enumerate(layers)]
        members.append((hashlib.sha256(config).hexdigest() + ".json", config))
        for name, body in sorted(members):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_a_layer_skipped_by_its_size_is_checked_by_its_hash(monkeypatch, tmp_path):
    """The repository holds layer A; layer B has A's size and comes first in the save: the pusher
    skips it as A, finds by its hash that it was not, and reads the image again without skipping."""
    import contextlib
    import hashlib

    from envbuild import registry as R

    monkeypatch.setenv("ENVBUILD_CACHE", str(tmp_path))
    monkeypatch.setattr(R, "Registry", _FakeRegistry)
    _FakeRegistry.store = {}
    a, b = b"A" * 4096, b"B" * 4096
    da, db = ("sha256:" + hashlib.sha256(x).hexdigest() for x in (a, b))
    config = json.dumps({"rootfs": {"diff_ids": [da, db]}}).encode()
    cid = "sha256:" + hashlib.sha256(config).hexdigest()
    _FakeRegistry.store[("envbuild-test/x", da)] = a
    saves = []

    class Eng:
        client, server_version = "docker", "20.10.24"

        def inspect(self, ref):
            return {"Id": cid, "RootFS": {"Layers": [da, db]}}

        @contextlib.contextmanager
        def save_stream(self, ref):
            saves.append(ref)
            yield io.BytesIO(_legacy_save([b, a], config))  # B first: name order, not layer order

    rep = P.stream_push(Eng(), f"{REGISTRY}/envbuild-test/x:t", P.CODECS["none"])
    assert len(saves) == 2  # the second read: the first skipped B as if it were A
    assert ("envbuild-test/x", db) in _FakeRegistry.store
    man = json.loads(_FakeRegistry.store[("envbuild-test/x", "manifests/t")])
    assert [l["digest"] for l in man["layers"]] == [da, db] and man["config"]["digest"] == cid
    assert rep.blobs["present"] == 1
