"""Attestations on the real local registry (127.0.0.1:5000, Debian's docker-registry: no
referrers API, so the `sha256-<hex>.att` tag scheme carries them): `envbuild attach` from a
results folder, `envbuild verify IMAGE@sha256:…`, and the refusals (tampered, moved to another
digest, missing). The images are a few kB (`docker import` of a dpkg database and os-release),
pushed to a repository of their own and removed afterwards.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import shutil
import subprocess
import tarfile

import pytest

from envbuild import attest
from envbuild.cli import main
from envbuild.docker import detect
from envbuild.errors import EnvbuildError
from envbuild.record import Record, write_record
from envbuild.registry import Registry
from envbuild.values import Base
from envbuild.lockmodel import LayerLock, LockResult
from envbuild.values import Combo
from envbuild.render import context_hash, render_combo
from envbuild.sign import write_keypair

pytestmark = pytest.mark.docker
HOST = "127.0.0.1:5000"
DPKG = b"""Package: base-files
Status: install ok installed
Architecture: amd64
Version: 12.4+deb12u7

Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u7
"""
OS_RELEASE = b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, data in files.items():
            ti = tarfile.TarInfo(path)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def env():
    if not shutil.which("docker") and not shutil.which("/usr/bin/docker"):
        pytest.skip("no docker client")
    try:
        eng = detect()
    except EnvbuildError as e:
        pytest.skip(str(e))
    if Registry(HOST, timeout=3).referrers("x", "sha256:" + "0" * 64) is not None:
        pass  # a registry with referrers works too; the tag is written either way
    repo = f"{HOST}/envbuild-test/attach-{secrets.token_hex(4)}"
    refs = []
    for i in range(2):
        tag = f"{repo}:img{i}"
        data = _tar({"var/lib/dpkg/status": DPKG, "etc/os-release": OS_RELEASE, f"n{i}": secrets.token_bytes(8)})
        p = subprocess.run([eng.client, "import", "-", tag], input=data, capture_output=True)
        assert p.returncode == 0, p.stderr
        refs.append((tag, eng.push(tag)))
    yield eng, repo, refs
    reg = Registry(HOST)
    name = repo.split("/", 1)[1]
    for tag, pinned in refs:
        digest = pinned.split("@")[1]
        got = reg.get_manifest(name, attest.att_tag(digest))
        if got:
            reg.delete_manifest(name, got[0].digest)
        reg.delete_manifest(name, digest)
        eng.remove(tag, force=True)


def _results(tmp_path, tag, pinned, image_id):
    """A results folder as `envbuild build --push` leaves it for one combination: the build
    context and model rendered by envbuild (render_combo) from a two-layer lock."""
    combo = Combo(verl="0.4.1", engine="hf", engine_version="", torch="2.6.0", cuda="cu124", python="3.11",
                  cuda_toolkit="12.4", base_image=tag, glibc="2.36")
    torch_l, verl_l = (f"{n}=={v} \\\n    --hash=sha256:{h * 64}\n" for n, v, h in (("torch", "2.6.0", "a"), ("verl", "0.4.1", "b")))
    lock = LockResult(combo, "ok", layers=[LayerLock("torch", torch_l, "x", {"torch": "2.6.0"}, "2025-07-11", "k"),
                                           LayerLock("verl", verl_l, "x", {"verl": "0.4.1"}, "2025-07-11", "k")],
                      lock_hash="ab" * 32, era="2025-07-11", full_lock=torch_l + verl_l, tools="")
    ctx = render_combo(combo, lock, Base("image", tag), tmp_path / "results" / "contexts").context_dir
    c = combo.to_dict()
    pv = {"status": "pass", "checks": []}
    rec = Record(combo=c, stage="probe", status="ok", base={"kind": "image", "ref": tag},
                 image={"ref": tag, "id": image_id, "digest": pinned, "content_hash": context_hash(ctx), "size": 1},
                 lock_hash="ab" * 32, probe={"env": pv, "contract": pv},
                 timings={"lock": 1.0, "build": 20.0, "push": 2.0, "probe": 5.0}, machine={"hostname": "t"})
    write_record(tmp_path / "results", rec)
    return tmp_path / "results"


def test_attach_verify_and_refusals(env, tmp_path, capsys):
    eng, repo, refs = env
    (tag_a, pinned_a), (tag_b, pinned_b) = refs
    priv, pub, _ = write_keypair(tmp_path / "keys")
    results = _results(tmp_path, tag_a, pinned_a, eng.image_id(tag_a))

    # missing: nothing attached yet
    assert main(["verify", pinned_a, "--pubkey", str(pub)]) != 0
    assert "no valid test-result attestation" in capsys.readouterr().err

    pem = tmp_path / "cosign.pub"
    assert main(["attach", "--results", str(results), "--key", str(priv), "--cosign-pubkey", str(pem)]) == 0
    out = capsys.readouterr().out
    assert f"attached test-result, sbom, provenance to {pinned_a}" in out
    assert pem.read_text().startswith("-----BEGIN PUBLIC KEY-----")

    assert main(["verify", pinned_a, "--pubkey", str(pub)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "best level contract" in out and "env pass" in out
    assert "2 Python packages (torch 2.6.0, verl 0.4.1), 2 Debian packages (Debian GNU/Linux 12 (bookworm))" in out
    assert "tag sha256-….att" in out

    reg = Registry(HOST)
    name = repo.split("/", 1)[1]
    digest_a, digest_b = pinned_a.split("@")[1], pinned_b.split("@")[1]
    att_desc, body = reg.get_manifest(name, attest.att_tag(digest_a))
    m = json.loads(body)

    # moved: A's attestations copied to B's tag are refused for B
    reg.put_manifest(name, attest.att_tag(digest_b), body)
    assert main(["verify", pinned_b, "--pubkey", str(pub)]) != 0
    assert "for another image" in capsys.readouterr().err

    # tampered: A's test result edited (PASSED where it was WARNED) under the same signature
    layer = next(l for l in m["layers"] if l["annotations"]["predicateType"] == attest.TEST_RESULT_PREDICATE)
    envl = json.loads(reg.get_blob(name, layer["digest"]))
    st = json.loads(base64.b64decode(envl["payload"]))
    assert st["predicate"]["result"] == "WARNED"  # gpu not run
    st["predicate"]["result"] = "PASSED"
    envl["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    new = reg.put_blob(name, json.dumps(envl).encode(), attest.DSSE_MEDIA_TYPE)
    layer.update(digest=new.digest, size=new.size)
    reg.put_manifest(name, attest.att_tag(digest_a), json.dumps(m).encode())
    assert main(["verify", pinned_a, "--pubkey", str(pub)]) != 0
    assert "does not match the content" in capsys.readouterr().err

    # re-attaching repairs it (--json: one object per image, for scripts)
    capsys.readouterr()
    assert main(["attach", "--results", str(results), "--key", str(priv), "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    said = json.loads(line)
    assert said["image"] == pinned_a and said["kinds"] == ["test-result", "sbom", "provenance"] and said["bytes_added"] > 0
    assert main(["verify", pinned_a, "--pubkey", str(pub)]) == 0
