"""Multi-platform indexes (envbuild.manifest) on the real local registry (127.0.0.1:5000):
two tiny real images, one linux/amd64 and one linux/arm64 (BuildKit `FROM scratch` + COPY with
--platform: nothing runs, so no emulator is needed), pushed by their own tags; push_index writes
the index under the plain tag and `docker pull --platform` gets each. The refusals (an image
filed under the wrong platform, an index as a child, Docker and OCI children mixed) write
nothing. group_for_indexes and the input checks need no registry.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import secrets
import shutil
import tarfile

import pytest

from envbuild.docker import detect
from envbuild.errors import EnvbuildError, InfraError, InputError
from envbuild.values import image_refs
from envbuild.manifest import entry_platform, group_for_indexes, push_index
from envbuild.values import Combo
from envbuild.record import Record
from envbuild.registry import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, Registry, sha256_digest

HOST = "127.0.0.1:5000"
PLATS = ("linux/amd64", "linux/arm64")
REPO = "127.0.0.1:5000/envbuild/verl"
HAS_PLATFORM = "platform" in {f.name for f in dataclasses.fields(Combo)}


def _combo(platform: str | None = None, torch: str = "2.6.0", engine: str = "vllm") -> dict:
    """A combination as a record holds it (Combo.to_dict), on `platform`; None: a record from
    before the platform axis (no platform key: linux/amd64)."""
    kw = {"platform": platform} if HAS_PLATFORM and platform else {}
    c = Combo(verl="0.4.1", engine=engine, engine_version="" if engine == "hf" else "0.8.4", torch=torch,
              cuda="cu124", python="3.11", **kw)
    d = c.to_dict()
    d.pop("platform", None)
    return {**d, **({"platform": platform} if platform else {})}


# ---------------------------------------------------------------- the registry: real images


def _build(eng, ctx, ref: str, platform: str) -> None:
    argv = eng.build_argv(ctx, tags=[ref])  # [client, build..., context]
    eng.cmd(*argv[1:-1], "--platform", platform, argv[-1], timeout=300)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if not shutil.which("docker") and not shutil.which("/usr/bin/docker"):
        pytest.skip("no docker client")
    try:
        eng = detect()
        Registry(HOST, timeout=3).head_manifest("envbuild-test/none", "none")
    except EnvbuildError as e:
        pytest.skip(str(e))
    repo = f"{HOST}/envbuild-test/manifest-{secrets.token_hex(4)}"
    name = repo.split("/", 1)[1]
    pushed: dict[str, str] = {}  # platform -> digest
    local: list[str] = []
    try:
        for plat in PLATS:
            ctx = tmp_path_factory.mktemp("ctx")
            (ctx / "Dockerfile").write_text("FROM scratch\nCOPY f /f\n")
            (ctx / "f").write_bytes(secrets.token_bytes(16))
            tag = f"{repo}:t-{plat.split('/')[1]}"
            _build(eng, ctx, tag, plat)
            local.append(tag)
            pushed[plat] = eng.push(tag, compression="gzip").split("@", 1)[1]  # Docker schema 2 children
        eng.remove(*local, force=True)  # the pulls below come from the registry
        yield eng, repo, name, pushed
    finally:
        reg = Registry(HOST)
        tags = reg.request("GET", name, "tags/list")
        for t in (tags.json().get("tags") or []) if tags.status_code == 200 else []:
            d = reg.head_manifest(name, t)
            if d:
                reg.delete_manifest(name, d.digest)
        for d in pushed.values():
            reg.delete_manifest(name, d)
        eng.remove(*local, *(f"{repo}:{t}" for t in ("multi", "oci")), force=True)


def _index(reg: Registry, name: str, tag: str) -> tuple[str, str, dict]:
    desc, body = reg.get_manifest(name, tag)
    return desc.media_type, desc.digest, json.loads(body)


@pytest.mark.docker
def test_index_under_the_plain_tag_pulls_per_platform(env):
    eng, repo, name, pushed = env
    reg = Registry(HOST)
    ref = f"{repo}:multi"
    # what a run's records say -> the children (the amd64 record carries no platform, as before the axis)
    recs = []
    for plat, digest in pushed.items():
        c = _combo(None if plat == "linux/amd64" else plat, engine="hf")
        content, readable = image_refs(repo, c["tag"], "ab" * 32)
        recs.append({"combo": c, "image": {"ref": content, "tags": [content, readable], "digest": f"{repo}@{digest}",
                                           "content_hash": "ab" * 32}})
    groups = group_for_indexes(recs)
    assert groups == {readable: pushed}

    digest = push_index(ref, groups[readable])
    mt, served, idx = _index(reg, name, "multi")
    assert (mt, served) == (DOCKER_LIST, digest)
    assert idx["mediaType"] == DOCKER_LIST and idx["schemaVersion"] == 2
    assert [m["platform"] for m in idx["manifests"]] == [
        {"architecture": "amd64", "os": "linux"}, {"architecture": "arm64", "os": "linux", "variant": "v8"}]
    for m, plat in zip(idx["manifests"], PLATS):
        child = reg.head_manifest(name, pushed[plat])
        assert (m["digest"], m["mediaType"], m["size"]) == (pushed[plat], DOCKER_MANIFEST, child.size)

    # the docker client reads it as a manifest list (`docker manifest` is experimental in 20.10)
    p = eng.cmd("manifest", "inspect", "--insecure", ref, check=False, timeout=60)
    if p.returncode == 0:
        shown = json.loads(p.stdout)
        assert shown["mediaType"] == DOCKER_LIST
        assert {(m["platform"]["architecture"], m["digest"]) for m in shown["manifests"]} == {
            (plat.split("/")[1], d) for plat, d in pushed.items()}

    for plat in ("linux/arm64", "linux/amd64"):
        eng.cmd("pull", "-q", "--platform", plat, ref, timeout=300)
        info = eng.inspect(ref)
        assert (info["Os"], info["Architecture"]) == ("linux", plat.split("/")[1])
        assert f"{repo}@{digest}" in info["RepoDigests"]
        eng.remove(ref, force=True)


@pytest.mark.docker
def test_same_children_same_bytes_same_digest(env):
    _, repo, name, pushed = env
    first = push_index(f"{repo}:again", pushed)
    reordered = {"arm64": pushed["linux/arm64"], "linux/amd64": pushed["linux/amd64"]}  # other spellings too
    assert push_index(f"{repo}:again", reordered) == first
    assert Registry(HOST).head_manifest(name, "again").digest == first


@pytest.mark.docker
def test_wrong_platform_is_refused_and_nothing_written(env):
    _, repo, name, pushed = env
    reg = Registry(HOST)
    swapped = {"linux/amd64": pushed["linux/arm64"], "linux/arm64": pushed["linux/amd64"]}
    with pytest.raises(InputError) as e:
        push_index(f"{repo}:wrong", swapped)
    assert "linux/amd64" in str(e.value) and "linux/arm64" in str(e.value) and "filed under" in str(e.value)
    assert reg.head_manifest(name, "wrong") is None

    # a tag that holds a good index keeps it
    good = push_index(f"{repo}:kept", pushed)
    with pytest.raises(InputError, match=r"is an image for linux/amd64 .* filed under linux/arm64"):
        push_index(f"{repo}:kept", {"linux/arm64": pushed["linux/amd64"]})
    assert reg.head_manifest(name, "kept").digest == good


@pytest.mark.docker
def test_an_index_is_not_a_child(env):
    _, repo, name, pushed = env
    idx = push_index(f"{repo}:inner", pushed)
    with pytest.raises(InputError, match="itself an index"):
        push_index(f"{repo}:outer", {"linux/amd64": idx})
    assert Registry(HOST).head_manifest(name, "outer") is None


@pytest.mark.docker
def test_a_missing_child_is_a_registry_error(env):
    _, repo, name, _ = env
    with pytest.raises(InfraError, match="push it first"):
        push_index(f"{repo}:missing", {"linux/amd64": "sha256:" + "0" * 64})
    assert Registry(HOST).head_manifest(name, "missing") is None


def _oci_image(reg: Registry, name: str, platform: str) -> str:
    """An OCI image manifest (what envbuild's own pusher writes), put by digest; -> its digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = secrets.token_bytes(16)
        ti = tarfile.TarInfo("f")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    layer = gzip.compress(buf.getvalue(), mtime=0)
    ld = reg.put_blob(name, layer, "application/vnd.oci.image.layer.v1.tar+gzip")
    cfg = {"architecture": platform.split("/")[1], "os": "linux",
           "rootfs": {"type": "layers", "diff_ids": [sha256_digest(buf.getvalue())]}, "config": {}}
    cd = reg.put_blob(name, json.dumps(cfg).encode(), "application/vnd.oci.image.config.v1+json")
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cd.to_dict(),
                       "layers": [ld.to_dict()]}).encode()
    digest = sha256_digest(body)
    reg.put_manifest(name, digest, body, OCI_MANIFEST)
    return digest


@pytest.mark.docker
def test_oci_children_make_an_oci_index_and_mixing_is_refused(env):
    eng, repo, name, pushed = env
    reg = Registry(HOST)
    oci = {p: _oci_image(reg, name, p) for p in PLATS}
    try:
        digest = push_index(f"{repo}:oci", oci)
        mt, served, idx = _index(reg, name, "oci")
        assert (mt, served, idx["mediaType"]) == (OCI_INDEX, digest, OCI_INDEX)
        assert [(m["mediaType"], m["digest"], m["platform"]) for m in idx["manifests"]] == [
            (OCI_MANIFEST, oci[p], entry_platform(p)) for p in PLATS]
        eng.cmd("pull", "-q", "--platform", "linux/arm64", f"{repo}:oci", timeout=300)
        assert eng.inspect(f"{repo}:oci")["Architecture"] == "arm64"
        eng.remove(f"{repo}:oci", force=True)

        with pytest.raises(InputError, match="mixes Docker schema 2 and OCI"):
            push_index(f"{repo}:mixed", {"linux/amd64": pushed["linux/amd64"], "linux/arm64": oci["linux/arm64"]})
        assert reg.head_manifest(name, "mixed") is None
    finally:
        for d in oci.values():
            reg.delete_manifest(name, d)


# ---------------------------------------------------------------- input checks (no registry)

D = "sha256:" + "a" * 64


@pytest.mark.parametrize("ref, children, why", [
    ("127.0.0.1:5000/a/b", {"linux/amd64": D}, "an index is written under a tag"),
    ("127.0.0.1:5000/a/b@" + D, {"linux/amd64": D}, "an index is written under a tag"),
    ("127.0.0.1:5000/a/b:bad tag", {"linux/amd64": D}, "an index is written under a tag"),
    ("a/b:tag", {"linux/amd64": D}, "no registry host"),
    ("127.0.0.1:5000/a/b:t", {}, "at least one"),
    ("127.0.0.1:5000/a/b:t", {"linux/s390x": D}, "not a platform envbuild builds"),
    ("127.0.0.1:5000/a/b:t", {"linux/arm64": D, "aarch64": D}, "given twice"),
    ("127.0.0.1:5000/a/b:t", {"linux/amd64": "latest"}, "sha256:<64 hex>"),
    ("127.0.0.1:5000/a/b:t", {"linux/amd64": "127.0.0.1:5000/a/b@" + D}, "sha256:<64 hex>"),
])
def test_bad_input_is_refused_before_any_request(ref, children, why):
    class NoRegistry:
        def __getattr__(self, _):
            raise AssertionError("no request may be made")

    with pytest.raises(InputError, match=why) as e:
        push_index(ref, children, registry=NoRegistry())
    assert "\n" not in str(e.value)


def test_entry_platform_is_dockers():
    assert entry_platform("linux/amd64") == {"architecture": "amd64", "os": "linux"}
    assert entry_platform("linux/arm64") == {"architecture": "arm64", "os": "linux", "variant": "v8"}


# ---------------------------------------------------------------- group_for_indexes

def _rec(combo: dict, digest: str | None, chash: str = "c" * 64, as_record: bool = False):
    content, readable = image_refs(REPO, combo["tag"], chash)
    image = {"ref": content, "tags": [content, readable], "content_hash": chash, "id": None,
             "digest": f"{REPO}@{digest}" if digest else None, "size": None}
    if as_record:
        return Record(combo=combo, stage="push", status="ok", image=image)
    return {"combo": combo, "stage": "push", "status": "ok", "image": image}


def test_group_pushed_children_under_the_readable_ref():
    amd, arm = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    other = "sha256:" + "3" * 64
    plain = _combo()
    readable = image_refs(REPO, plain["tag"], "")[1]
    recs = [_rec(plain, amd), _rec(_combo("linux/arm64"), arm, chash="d" * 64, as_record=True),
            _rec(_combo(None, torch="2.7.0"), other),  # amd64 only: an index of one
            _rec(_combo("linux/arm64", torch="2.5.1"), None),  # built, not pushed: no index
            {"combo": _combo(None, torch="2.4.0"), "stage": "lock", "status": "fail", "image": None}]
    got = group_for_indexes(recs)
    assert got == {readable: {"linux/amd64": amd, "linux/arm64": arm},
                   image_refs(REPO, _combo(None, torch="2.7.0")["tag"], "")[1]: {"linux/amd64": other}}
    assert readable in _rec(plain, amd)["image"]["tags"]  # the readable tag the build pushes, no other format
    assert list(got) == sorted(got)


def test_group_explicit_default_platform_is_the_same_as_none():
    a = "sha256:" + "1" * 64
    assert group_for_indexes([_rec(_combo("linux/amd64"), a)]) == group_for_indexes([_rec(_combo(), a)])


def test_group_two_digests_for_one_platform_is_an_error():
    c = _combo("linux/arm64")
    with pytest.raises(InputError, match="already"):
        group_for_indexes([_rec(c, "sha256:" + "1" * 64), _rec(c, "sha256:" + "2" * 64)])
    # the same digest twice (the record read twice) is one child
    assert len(group_for_indexes([_rec(c, "sha256:" + "1" * 64)] * 2)) == 1


def test_group_refuses_a_digest_of_another_repository_and_unknown_platforms():
    r = _rec(_combo(), "sha256:" + "1" * 64)
    r["image"]["digest"] = "127.0.0.1:5000/elsewhere@sha256:" + "1" * 64
    with pytest.raises(InputError, match="image.digest"):
        group_for_indexes([r])
    bare = _rec(_combo(), "sha256:" + "1" * 64)
    bare["image"] = {"digest": "sha256:" + "1" * 64}  # no repository named anywhere
    with pytest.raises(InputError, match="image.digest"):
        group_for_indexes([bare])
    bad = _rec(_combo(), "sha256:" + "1" * 64)
    bad["combo"]["platform"] = "windows/amd64"
    with pytest.raises(InputError, match="combo.platform"):
        group_for_indexes([bad])


def test_build_writes_one_index_per_tag_with_several_pushed_platforms(tmp_path, monkeypatch):
    """envbuild build's last step: the latest records in the results (an earlier run's amd64 image
    and tonight's arm64 one) -> one push_index per plain tag with two or more platforms; a tag with
    one platform keeps that image's own manifest; a registry refusal is said, not fatal."""
    from envbuild import build as B
    from envbuild import pipeline as PL
    from envbuild import manifest as M
    from envbuild.record import write_record

    repo = "127.0.0.1:5000/envbuild/verl"
    amd, arm = Combo("0.4.1", "hf", "", "2.6.0", "cu124", "3.11"), Combo("0.4.1", "hf", "", "2.6.0", "cu124", "3.11",
                                                                         platform="linux/arm64")
    solo = Combo("0.5.0", "hf", "", "2.6.0", "cu124", "3.11")
    for n, c in enumerate((amd, arm, solo)):
        d = "sha256:" + f"{n}" * 64
        write_record(tmp_path, Record(combo=c.to_dict(), stage="probe", status="ok",
                                      image={"ref": image_refs(repo, c.id, "abc")[0], "digest": f"{repo}@{d}"}))
    calls = []
    monkeypatch.setattr(M, "push_index", lambda ref, children: calls.append((ref, children)) or "sha256:" + "f" * 64)
    said = []
    opts = PL.Options(results=tmp_path, repo=repo, in_registry=True)
    assert B.write_indexes(opts, say=said.append) == {f"{repo}:{amd.tag}": "sha256:" + "f" * 64}
    assert calls == [(f"{repo}:{amd.tag}", {"linux/amd64": "sha256:" + "0" * 64, "linux/arm64": "sha256:" + "1" * 64})]
    assert arm.id == amd.tag + "-arm64" and image_refs(repo, arm.id, "abc")[1] == f"{repo}:{arm.id}"

    def refuse(ref, children):
        raise InfraError("registry-error", "no")
    monkeypatch.setattr(M, "push_index", refuse)
    said.clear()
    assert B.write_indexes(opts, say=said.append) == {} and "not written" in said[0]
