"""Attestations attached to an image digest: sign, attach, fetch, verify (envbuild.attach).

Against tests/oci_fake.py: a registry with the OCI 1.1 referrers API, the same without it
(the tag-scheme fallback), and one that wants credentials (Docker config.json + token).
The real local registry is exercised in test_attach_registry.py.
"""

from __future__ import annotations

import base64
import json

import pytest

from envbuild import attach, attest, provenance, sbom
from envbuild.errors import InfraError
from envbuild.sign import TEST_RESULT_PREDICATE, VerifyError, statement, write_keypair
from oci_fake import FakeRegistry

LOCK_TORCH = """# torch
torch==2.6.0 \\
    --hash=sha256:{a}
numpy==1.26.4 \\
    --hash=sha256:{b}
""".format(a="a" * 64, b="b" * 64)
LOCK_VERL = """# verl
verl==0.4.1 \\
    --hash=sha256:{c}
numpy==2.0.1 \\
    --hash=sha256:{d} \\
    --hash=sha256:{e}
""".format(c="c" * 64, d="d" * 64, e="e" * 64)
DPKG = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u7
Description: GNU C Library
 continuation line: Version: 9.9

Package: removed-thing
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: python3.11
Status: install ok installed
Architecture: amd64
Version: 3.11.2-6
"""


def statements_for(repo: str, digest: str) -> list[dict]:
    hexd = digest.split(":", 1)[1]
    levels = {"env": {"status": "pass", "created": "2026-12-02T20:00:00Z"},
              "contract": {"status": "pass", "created": "2026-12-02T20:01:00Z"},
              "gpu": {"status": "needs-gpu", "created": "2026-12-02T20:01:00Z"}}
    tr = statement(repo, hexd, TEST_RESULT_PREDICATE, {
        "result": "WARNED", "passedTests": ["envbuild-probe/env", "envbuild-probe/contract"],
        "warnedTests": ["envbuild-probe/gpu"], "failedTests": [],
        "configuration": [{"name": "envbuild-combination", "annotations": {"id": "verl0.4.1-hf-torch2.6.0"}},
                          {"name": "envbuild-probe", "digest": {"sha256": "f" * 64}}],
        "envbuild": {"best_level": "contract", "status": "verified", "levels": levels,
                     "timings": {"build": 12.5, "probe": 3.0}}})
    py = sbom.python_packages([("torch", LOCK_TORCH), ("verl", LOCK_VERL)])
    bom = sbom.cyclonedx(repo, hexd, py, sbom.parse_dpkg_status(DPKG),
                         {"ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"},
                         "2026-12-02T20:00:00Z", "0.1.0")
    pred = provenance.predicate(
        combo={"id": "verl0.4.1-hf-torch2.6.0"}, dockerfile=b"FROM base\n",
        locks={"torch": LOCK_TORCH.encode(), "verl": LOCK_VERL.encode()},
        base={"kind": "bootstrap", "ref": "envbuild/base:bookworm", "digest": "sha256:" + "9" * 64,
              "digest_kind": "image-id"},
        probe_sha256="f" * 64, content_hash="1" * 64, lock_hash="2" * 64,
        builder={"version": {"envbuild": "0.1.0"}}, run_id="r1", started="t0", finished="t1")
    return [tr, statement(repo, hexd, sbom.PREDICATE_TYPE, bom), statement(repo, hexd, provenance.PREDICATE_TYPE, pred)]


@pytest.fixture
def keys(tmp_path):
    priv, pub, _ = write_keypair(tmp_path / "k")
    other, other_pub, _ = write_keypair(tmp_path / "o")
    return priv, pub, other


@pytest.fixture(params=[True, False], ids=["referrers", "tag-fallback"])
def reg(request):
    r = FakeRegistry(referrers=request.param)
    yield r
    r.close()


def _image(reg, name="envbuild/verl"):
    d = reg.put_image(name, "t1")
    return f"{reg.host}/{name}@{d}", d


def test_sbom_is_exact_from_locks_and_dpkg():
    py = {p.name: p for p in sbom.python_packages([("torch", LOCK_TORCH), ("verl", LOCK_VERL)])}
    assert py["numpy"].version == "2.0.1" and py["numpy"].layer == "verl"  # a later layer's pin wins
    assert py["numpy"].hashes == ("d" * 64, "e" * 64)
    bom = sbom.cyclonedx("r", "0" * 64, list(py.values()), [], {}, "t", "0")
    by = {c["name"]: c for c in bom["components"]}
    assert "hashes" not in by["numpy"]  # two allowed artifacts: neither is "the" hash
    assert by["torch"]["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}]
    debs = sbom.parse_dpkg_status(DPKG)
    assert [(d.name, d.version, d.source) for d in debs] == [("libc6", "2.36-9+deb12u7", "glibc"),
                                                             ("python3.11", "3.11.2-6", None)]


def test_attach_then_verify(reg, keys, capsys):
    priv, pub, _ = keys
    ref, digest = _image(reg)
    res = attach.attach_all(ref, statements_for(ref.split("@")[0], digest), priv)
    assert res.referrers is reg.referrers_api
    assert res.tag == digest.replace(":", "-") + ".att"
    att = json.loads(reg.manifests[reg.tags[("envbuild/verl", res.tag)]][0])
    assert [l["mediaType"] for l in att["layers"]] == [attest.DSSE_MEDIA_TYPE] * 3
    assert {l["annotations"]["predicateType"] for l in att["layers"]} == {k.predicate_type for k in attest.KINDS}
    env = json.loads(reg.blobs[att["layers"][0]["digest"]])
    assert env["payloadType"] == "application/vnd.in-toto+json" and env["signatures"][0]["sig"]
    if reg.referrers_api:  # one manifest per statement, subject = the image, artifactType per kind
        subs = [json.loads(reg.manifests[d][0]) for d in reg.subjects[digest]]
        assert {m["artifactType"] for m in subs} == {k.artifact_type for k in attest.KINDS}
        assert all(m["subject"]["digest"] == digest for m in subs)
    else:
        assert not reg.subjects
    # a later attach (a new probe run) supersedes ours: the tag keeps 3 layers, the referrers 3 manifests
    stmts = statements_for(ref.split("@")[0], digest)
    stmts[0]["predicate"]["envbuild"]["levels"]["gpu"] = {"status": "pass", "created": "2026-12-03T00:00:00Z"}
    attach.attach_all(ref, stmts, priv)
    att = json.loads(reg.manifests[reg.tags[("envbuild/verl", res.tag)]][0])
    assert len(att["layers"]) == 3
    assert len(reg.subjects.get(digest, [])) == (3 if reg.referrers_api else 0)
    rep = attest.verify_image(ref, pub)
    assert set(rep.checked) == {"test-result", "sbom", "provenance"}
    text = "\n".join(attest.describe(rep))
    assert "gpu pass (2026-12-03T00:00:00Z)" in text
    assert "best level contract" in text and "env pass" in text
    assert "4 Python packages" not in text and "3 Python packages" in text  # torch, numpy, verl
    assert "2 Debian packages" in text and "torch 2.6.0" in text and "verl 0.4.1" in text
    assert ("OCI referrers" in text) is reg.referrers_api
    assert res.bytes_added > 0


def test_reattach_replaces_ours_and_keeps_foreign_layers(keys):
    priv, pub, _ = keys
    reg = FakeRegistry(referrers=False)
    try:
        ref, digest = _image(reg)
        stmts = statements_for(ref.split("@")[0], digest)
        attach.attach_all(ref, stmts, priv)
        # someone else's cosign attestation in the same tag
        tag = attest.att_tag(digest)
        m = json.loads(reg.manifests[reg.tags[("envbuild/verl", tag)]][0])
        foreign = b'{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[{"keyid":"","sig":"AA=="}]}'
        d = "sha256:" + __import__("hashlib").sha256(foreign).hexdigest()
        reg.blobs[d] = foreign
        m["layers"].append({"mediaType": attest.DSSE_MEDIA_TYPE, "digest": d, "size": len(foreign),
                            "annotations": {"predicateType": "https://example.com/vuln"}})
        body = json.dumps(m).encode()
        md = "sha256:" + __import__("hashlib").sha256(body).hexdigest()
        reg.manifests[md] = (body, attest.OCI_MANIFEST)
        reg.tags[("envbuild/verl", tag)] = md
        attach.attach_all(ref, stmts, priv)
        m2 = json.loads(reg.manifests[reg.tags[("envbuild/verl", tag)]][0])
        assert len(m2["layers"]) == 4 and m2["layers"][0]["annotations"]["predicateType"] == "https://example.com/vuln"
        rep = attest.verify_image(ref, pub)
        assert any("another key" in i for i in rep.ignored)
    finally:
        reg.close()


def _tag_manifest(reg, digest, name="envbuild/verl"):
    tag = attest.att_tag(digest)
    return tag, json.loads(reg.manifests[reg.tags[(name, tag)]][0])


def _store(reg, name, tag, m):
    import hashlib

    body = json.dumps(m).encode()
    md = "sha256:" + hashlib.sha256(body).hexdigest()
    reg.manifests[md] = (body, attest.OCI_MANIFEST)
    reg.tags[(name, tag)] = md


def _replace_layer(reg, digest, index, new_env: bytes):
    import hashlib

    tag, m = _tag_manifest(reg, digest)
    d = "sha256:" + hashlib.sha256(new_env).hexdigest()
    reg.blobs[d] = new_env
    m["layers"][index].update(digest=d, size=len(new_env))
    _store(reg, "envbuild/verl", tag, m)


def test_tampered_statement_is_refused(keys):
    priv, pub, _ = keys
    reg = FakeRegistry(referrers=False)
    try:
        ref, digest = _image(reg)
        attach.attach_all(ref, statements_for(ref.split("@")[0], digest), priv)
        _, m = _tag_manifest(reg, digest)
        env = json.loads(reg.blobs[m["layers"][0]["digest"]])
        st = json.loads(base64.b64decode(env["payload"]))
        st["predicate"]["result"] = "PASSED"  # a WARNED image claiming PASSED
        env["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
        _replace_layer(reg, digest, 0, json.dumps(env).encode())
        with pytest.raises(VerifyError, match="does not match the content"):
            attest.verify_image(ref, pub)
    finally:
        reg.close()


def test_unsigned_statement_is_refused(keys):
    priv, pub, _ = keys
    reg = FakeRegistry(referrers=False)
    try:
        ref, digest = _image(reg)
        attach.attach_all(ref, statements_for(ref.split("@")[0], digest), priv)
        _, m = _tag_manifest(reg, digest)
        env = json.loads(reg.blobs[m["layers"][1]["digest"]])
        env["signatures"] = []
        _replace_layer(reg, digest, 1, json.dumps(env).encode())
        with pytest.raises(VerifyError, match="unsigned"):
            attest.verify_image(ref, pub)
    finally:
        reg.close()


def test_attachment_moved_to_another_digest_is_refused(reg, keys):
    priv, pub, _ = keys
    ref_a, digest_a = _image(reg)
    ref_b, digest_b = _image(reg)
    attach.attach_all(ref_a, statements_for(ref_a.split("@")[0], digest_a), priv)
    # copy A's tag manifest (and, with referrers, A's referrer manifests) over to B
    _, m = _tag_manifest(reg, digest_a)
    _store(reg, "envbuild/verl", attest.att_tag(digest_b), m)
    for d in reg.subjects.get(digest_a, []):
        sub = json.loads(reg.manifests[d][0])
        sub["subject"]["digest"] = digest_b
        body = json.dumps(sub).encode()
        import hashlib
        nd = "sha256:" + hashlib.sha256(body).hexdigest()
        reg.manifests[nd] = (body, attest.OCI_MANIFEST)
        reg.subjects.setdefault(digest_b, []).append(nd)
    with pytest.raises(VerifyError, match="for another image"):
        attest.verify_image(ref_b, pub)
    attest.verify_image(ref_a, pub)  # A itself is still fine


def test_missing_and_other_key_are_refused(reg, keys):
    priv, pub, other = keys
    ref, digest = _image(reg)
    with pytest.raises(VerifyError, match="no valid test-result attestation"):
        attest.verify_image(ref, pub)
    attach.attach_all(ref, statements_for(ref.split("@")[0], digest), other)  # a stranger's key
    with pytest.raises(VerifyError, match="no valid sbom attestation"):
        attest.verify_image(ref, pub)


def test_statement_for_another_digest_is_not_attached(keys):
    priv, _, _ = keys
    reg = FakeRegistry()
    try:
        ref, digest = _image(reg)
        _, other = _image(reg)
        with pytest.raises(Exception, match="does not name this image"):
            attach.attach_all(ref, statements_for(ref.split("@")[0], other), priv)
    finally:
        reg.close()


def test_private_registry_uses_docker_credentials(keys, tmp_path, monkeypatch):
    priv, pub, _ = keys
    reg = FakeRegistry(auth=("alice", "s3cret"))
    try:
        ref, digest = _image(reg)
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.docker/config.json: anonymous
        monkeypatch.delenv("DOCKER_CONFIG", raising=False)
        from envbuild.push import registry_digest

        assert registry_digest(f"{reg.host}/envbuild/verl:t1") is None  # refused = absent: build, never skip
        with pytest.raises(InfraError):
            attach.attach_all(ref, statements_for(ref.split("@")[0], digest), priv)
        cfg = tmp_path / "dockercfg"
        cfg.mkdir()
        (cfg / "config.json").write_text(json.dumps(
            {"auths": {reg.host: {"auth": base64.b64encode(b"alice:s3cret").decode()}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
        assert registry_digest(f"{reg.host}/envbuild/verl:t1") == digest
        attach.attach_all(ref, statements_for(ref.split("@")[0], digest), priv)
        assert set(attest.verify_image(ref, pub).checked) == {"test-result", "sbom", "provenance"}
    finally:
        reg.close()


def test_verify_cli_exit_codes(keys, capsys):
    from envbuild.cli import main

    priv, pub, _ = keys
    reg = FakeRegistry(referrers=False)
    try:
        ref, digest = _image(reg)
        assert main(["verify", ref, "--pubkey", str(pub)]) != 0
        assert "no valid" in capsys.readouterr().err
        attach.attach_all(ref, statements_for(ref.split("@")[0], digest), priv)
        assert main(["verify", ref, "--pubkey", str(pub)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"OK: {ref}") and "tested:" in out and "inside:" in out and "built:" in out
        missing = ref.split("@")[0] + "@sha256:" + "0" * 64
        assert main(["verify", missing, "--pubkey", str(pub)]) != 0
        assert "no such image" in capsys.readouterr().err
    finally:
        reg.close()


def test_pick_verify_attestations(keys, tmp_path, capsys, monkeypatch):
    from table_fixtures import combo, passed, rec, write_all

    from envbuild.cli import main

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # pick's trust store, not the user's
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    priv, pub, _ = keys
    reg = FakeRegistry(referrers=False)
    try:
        ref, digest = _image(reg)
        img = {"ref": ref.split("@")[0] + ":t1", "id": "sha256:" + "1" * 64, "content_hash": "c" * 16,
               "digest": ref, "size": 1}
        write_all(tmp_path / "results", [rec(combo(), passed("env", "contract"), img=img)])
        assert main(["publish", "--results", str(tmp_path / "results"), "--key", str(priv),
                     "--out", str(tmp_path / "table")]) == 0
        args = ["pick", "--table", str(tmp_path / "table"), "--pubkey", str(pub), "--verify-attestations"]
        capsys.readouterr()
        assert main(args) != 0  # the table says verified, but the image carries no attestation
        assert "no valid test-result attestation" in capsys.readouterr().err
        attach.attach_all(ref, statements_for(ref.split("@")[0], digest), priv)
        assert main(args) == 0
        out, err = capsys.readouterr()
        assert out.strip() == ref and "tested:" in err
    finally:
        reg.close()


def test_the_sboms_layer_order_comes_from_the_rendered_model_and_must_match_the_context(tmp_path):
    # The SBOM assigns each package to the layer that installs it last; the order is the model's
    # (saved beside the context), never read back out of the generated Dockerfile.
    from envbuild.values import Base
    from envbuild.errors import InputError
    from envbuild.lockmodel import LayerLock, LockResult
    from envbuild.values import Combo
    from envbuild.render import render_combo

    combo = Combo(verl="0.4.1", engine="hf", engine_version="", torch="2.6.0", cuda="cu124", python="3.11",
                  cuda_toolkit="12.4", base_image="debian", glibc="2.36")
    t, v = "torch==2.6.0 \\\n    --hash=sha256:" + "a" * 64 + "\n", "verl==0.4.1 \\\n    --hash=sha256:" + "b" * 64 + "\n"
    lock = LockResult(combo, "ok", layers=[LayerLock("torch", t, "x", {"torch": "2.6.0"}, "2025-07-11", "k"),
                                           LayerLock("verl", v, "x", {"verl": "0.4.1"}, "2025-07-11", "k")],
                      lock_hash="ab" * 32, era="2025-07-11", full_lock=t + v, tools="")
    ctx = render_combo(combo, lock, Base("image", "debian"), tmp_path).context_dir
    locks = {p.stem: p.read_bytes() for p in (ctx / "locks").glob("*.txt")}
    order = attach._layer_order(ctx, locks)
    assert order[-2:] == ["torch", "verl"] and "tools" not in order
    py = {p.name: p.layer for p in sbom.python_packages([(n, locks[n].decode()) for n in order])}
    assert py == {"torch": "torch", "verl": "verl"}
    with pytest.raises(InputError, match="differs from the build context's locks/verl.txt"):
        attach._layer_order(ctx, {**locks, "verl": b"verl==0.4.2\n"})
    (tmp_path / f"{combo.id}.json").unlink()
    with pytest.raises(InputError, match="missing or unreadable"):
        attach._layer_order(ctx, locks)


def test_an_old_passed_result_cannot_stand_in_for_a_newer_failed_one(keys):
    """Issue 27: the newest test result is chosen by its signed attested serial, not by the
    registry's unsigned `created` annotation or layer order; once a newer one was seen for a
    digest, an older one alone is a rollback."""
    priv, pub, _ = keys
    reg = FakeRegistry(referrers=False)
    try:
        ref, digest = _image(reg)
        stmts = statements_for(ref.split("@")[0], digest)
        attach.attach_all(ref, stmts, priv)
        tag, m = _tag_manifest(reg, digest)
        old_pass = next(l for l in m["layers"] if l["annotations"]["predicateType"] == TEST_RESULT_PREDICATE)
        failed = json.loads(json.dumps(stmts))
        failed[0]["predicate"]["result"] = "FAILED"
        failed[0]["predicate"]["envbuild"]["status"] = "broken"
        attach.attach_all(ref, failed, priv)
        assert attest.verify_image(ref, pub).checked["test-result"].statement["predicate"]["result"] == "FAILED"
        # Someone who can push puts the old, validly signed PASSED back first, dated 2999.
        tag, m = _tag_manifest(reg, digest)
        m["layers"].insert(0, {**old_pass, "annotations": {**old_pass["annotations"], attest.CREATED: "2999-01-01T00:00:00Z"}})
        m["annotations"] = {attest.CREATED: "2999-01-01T00:00:00Z"}
        _store(reg, "envbuild/verl", tag, m)
        assert attest.verify_image(ref, pub).checked["test-result"].statement["predicate"]["result"] == "FAILED"
        # ... and removes the FAILED one: the old PASSED alone is a rollback for a reader that saw it.
        m["layers"] = [l for l in m["layers"] if l["annotations"]["predicateType"] != TEST_RESULT_PREDICATE
                       or l["digest"] == old_pass["digest"]]
        _store(reg, "envbuild/verl", tag, m)
        with pytest.raises(VerifyError, match="older than one seen before"):
            attest.verify_image(ref, pub)
        rep = attest.verify_image(ref, pub, allow_rollback=True)  # forensics
        assert rep.checked["test-result"].statement["predicate"]["result"] == "WARNED"
    finally:
        reg.close()
