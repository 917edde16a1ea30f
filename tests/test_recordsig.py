"""Issue 49, item 3: records signed by the job that made them. The nightly's publish folds a record
only where its job's signature (of this run, for that combination, over these bytes) covers it; each
test is an attack on the artifacts between the jobs and publish, run through the real commands."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.cli import main
from envbuild.record import iter_records
from envbuild.recordsig import listed, signed_records
from envbuild.sign import load_public_key, write_keypair

A = combo(verl="0.4.1", ev="0.8.4")
B = combo(verl="0.5.0", ev="0.8.5")
RUN = "123456789"


@pytest.fixture
def keys(tmp_path):
    ci = write_keypair(tmp_path / "keys", "ci")
    other = write_keypair(tmp_path / "keys", "other")
    return {"ci": ci, "other": other}


def _sign(results, key, job, *combos, run=RUN) -> int:
    argv = ["ci", "sign-records", "--results", str(results), "--job", job, "--key", str(key), "--run", run]
    for c in combos:
        argv += ["--combo", c]
    return main(argv)


def _publish(tmp_path, results, key, *more) -> tuple[int, dict]:
    out = tmp_path / "table"
    rc = main(["publish", "--results", str(results), "--key", str(key), "--out", str(out), "--name", "t",
               "--signed-records", "--run", RUN, *more])
    rows = {r["id"]: r for r in json.loads((out / "compat.json").read_text())["rows"]} if rc == 0 else {}
    return rc, rows


def _build_job(results, c, n=1, status="ok"):
    """What a build job leaves: its combination's record, image pushed, cpu probe passed."""
    write_all(results, [rec(c, passed("env", "contract") if status == "ok" else {"contract": verdict("fail", "api")},
                            img=image(c), stage="probe", status=status, run=n)])


def test_signed_records_are_folded_and_unsigned_ones_are_not(tmp_path, keys, capsys):
    res = tmp_path / "results"
    _build_job(res, A)
    assert _sign(res, keys["ci"][0], f"build-{A['id']}", A["id"]) == 0
    # added to the artifacts after the job signed: a row nobody built
    write_all(res, [rec(B, passed("env", "contract"), img=image(B), run=2)])
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rc == 0
    assert set(rows) == {A["id"]}
    err = capsys.readouterr().err
    assert f"records/{B['id']}/" in err and "no signed record set of this run lists it" in err
    # the table's records archive carries only what was folded: the next night cannot launder B
    import tarfile
    with tarfile.open(tmp_path / "table" / "results.tar.gz") as t:
        assert [m.name for m in t.getmembers()] == [f"records/{A['id']}/20261201T000001-abcdef.json"]


def test_a_record_changed_after_signing_is_not_folded(tmp_path, keys, capsys):
    res = tmp_path / "results"
    _build_job(res, A, status="fail")  # the job's honest verdict: broken
    assert _sign(res, keys["ci"][0], "build-a", A["id"]) == 0
    p = next((res / "records" / A["id"]).glob("*.json"))
    d = json.loads(p.read_text())
    d["probe"] = {k: verdict("pass") for k in ("env", "contract")}
    d["status"] = "ok"
    p.write_text(json.dumps(d))
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rc == 0 and rows == {}
    assert "changed after job build-a signed it" in capsys.readouterr().err


def test_a_job_cannot_sign_for_another_combination(tmp_path, keys, capsys):
    res = tmp_path / "results"
    _build_job(res, B)
    assert _sign(res, keys["ci"][0], "probe-a", A["id"]) == 2  # the honest job refuses
    assert "this job speaks for" in capsys.readouterr().err
    assert not (res / "signatures").exists()


def test_a_statement_for_one_combination_does_not_carry_another(tmp_path, keys, capsys):
    """An envelope whose statement lists B's record but speaks for A only (as a hand-made or
    reused one would): B's record is not folded."""
    res = tmp_path / "results"
    _build_job(res, B)
    from envbuild.recordsig import sign_records
    from envbuild.sign import load_signer

    # sign_records itself refuses; make the statement as an attacker with the key but not the
    # tool's checks would, through the same signing call
    got = sign_records(res, load_signer(keys["ci"][0]), job="probe-a", run=RUN)
    env_path = Path(got["envelope"])
    env = json.loads(env_path.read_text())
    st = json.loads(base64.b64decode(env["payload"]))
    st["predicate"]["combos"] = [A["id"]]
    from envbuild.sign import IN_TOTO_PAYLOAD_TYPE, sign_envelope
    env_path.write_text(json.dumps(sign_envelope(json.dumps(st).encode(), IN_TOTO_PAYLOAD_TYPE,
                                                 load_signer(keys["ci"][0]))))
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rc == 0 and rows == {}
    assert f"speaks for {A['id']}, not {B['id']}" in capsys.readouterr().err


def test_another_key_or_another_run_or_a_forged_signature_counts_for_nothing(tmp_path, keys, capsys):
    res = tmp_path / "results"
    _build_job(res, A)
    assert _sign(res, keys["other"][0], "build-a", A["id"]) == 0  # a key publish does not trust
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rows == {}
    assert "not signed by key" in capsys.readouterr().err
    # the same envelope counts once its public key is given as a record key (the GPU runners')
    rc, rows = _publish(tmp_path, res, keys["ci"][0], "--record-pubkey", str(keys["other"][1]))
    assert set(rows) == {A["id"]}

    shutil.rmtree(res / "signatures")
    assert _sign(res, keys["ci"][0], "build-a", A["id"], run="1") == 0  # last week's run, replayed
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rows == {}
    assert "signed for run '1', not this run (123456789)" in capsys.readouterr().err

    shutil.rmtree(res / "signatures")
    assert _sign(res, keys["ci"][0], "build-a", A["id"]) == 0
    p = res / "signatures" / "build-a.dsse.json"
    env = json.loads(p.read_text())
    st = json.loads(base64.b64decode(env["payload"]))
    st["subject"].append({"name": f"records/{B['id']}/x.json", "digest": {"sha256": "0" * 64}})
    env["payload"] = base64.b64encode(json.dumps(st).encode()).decode()  # the old signature kept
    p.write_text(json.dumps(env))
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rows == {}
    assert "does not match the content" in capsys.readouterr().err


def test_the_probe_job_signs_only_what_it_added(tmp_path, keys):
    """The probe job downloads the build's records and envelope, probes, and signs its own record:
    both envelopes then cover their own files, and publish folds both."""
    res = tmp_path / "results"
    _build_job(res, A)
    assert _sign(res, keys["ci"][0], "build-a", A["id"]) == 0
    write_all(res, [rec(A, passed("env", "contract", "gpu"), img=image(A), stage="probe", run=5)])
    # a probe-only record (no render/build timings) of the build's image
    p = sorted((res / "records" / A["id"]).glob("*.json"))[-1]
    d = json.loads(p.read_text())
    d["timings"] = {"probe": 3.0}
    p.write_text(json.dumps(d))
    assert _sign(res, keys["ci"][0], "probe-a", A["id"]) == 0
    probe_env = json.loads((res / "signatures" / "probe-a.dsse.json").read_text())
    names = [s["name"] for s in json.loads(base64.b64decode(probe_env["payload"]))["subject"]]
    assert names == [str(p.relative_to(res))]
    accepted, notes = signed_records(res, [load_public_key(keys["ci"][1])], RUN)
    assert len(accepted) == 2 and notes == []
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rows[A["id"]]["best_level"] == "gpu"
    assert _sign(res, keys["ci"][0], "probe-a", A["id"]) == 2  # a job name signs once per run


def test_without_signed_records_publish_folds_everything_as_before(tmp_path, keys):
    res = tmp_path / "results"
    _build_job(res, A)
    out = tmp_path / "t2"
    assert main(["publish", "--results", str(res), "--key", str(keys["ci"][0]), "--out", str(out), "--name", "t"]) == 0
    assert len(json.loads((out / "compat.json").read_text())["rows"]) == 1
    assert listed(res) == set()
    assert len(list(iter_records(res))) == 1


@pytest.mark.parametrize("hostile", ["fifo", "symlink", "deep", "not-json", "huge", "not-a-statement", "list-subjects"])
def test_hostile_signature_files_are_reasons_not_tracebacks(tmp_path, keys, capsys, hostile):
    """Whatever lies in RESULTS/signatures, publish folds what a good statement covers and says one
    line for the rest: no hang (a FIFO), no file outside read (a link), no traceback."""
    import os

    from envbuild.sign import IN_TOTO_PAYLOAD_TYPE, load_signer, sign_envelope

    res = tmp_path / "results"
    _build_job(res, A)
    assert _sign(res, keys["ci"][0], "build-a", A["id"]) == 0
    sig = res / "signatures" / "x.dsse.json"
    if hostile == "fifo":
        os.mkfifo(sig)
    elif hostile == "symlink":
        sig.symlink_to(res / "signatures" / "build-a.dsse.json")
    elif hostile == "deep":
        sig.write_text("[" * 100000 + "]" * 100000)
    elif hostile == "not-json":
        sig.write_bytes(b"\xff\xfe garbage")
    elif hostile == "huge":
        with open(sig, "wb") as f:
            f.truncate((16 << 20) + 1)
    elif hostile == "not-a-statement":
        sig.write_text(json.dumps(sign_envelope(b'"just a string"', IN_TOTO_PAYLOAD_TYPE, load_signer(keys["ci"][0]))))
    else:
        st = {"_type": "https://in-toto.io/Statement/v1", "subject": {"name": 1}, "predicateType":
              "https://envbuild.invalid/record-set/v1", "predicate": {"run": RUN, "combos": "x", "job": None}}
        sig.write_text(json.dumps(sign_envelope(json.dumps(st).encode(), IN_TOTO_PAYLOAD_TYPE,
                                                load_signer(keys["ci"][0]))))
    rc, rows = _publish(tmp_path, res, keys["ci"][0])
    assert rc == 0 and set(rows) == {A["id"]}
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if hostile not in ("fifo", "symlink", "list-subjects"):
        assert "signatures/x.dsse.json" in err


def test_attach_signs_attestations_only_for_the_images_of_signed_records(tmp_path, keys, monkeypatch, capsys):
    """The publish job's attach step signs test results with the table key and pushes them onto
    each digest its records name: a record added to tonight's artifacts must not get one for an
    image nobody built here (the registry side is stood in for; test_attach covers it)."""
    from types import SimpleNamespace

    from envbuild import attach

    res = tmp_path / "tonight"
    _build_job(res, A)
    assert _sign(res, keys["ci"][0], "build-a", A["id"]) == 0
    write_all(res, [rec(B, passed("env", "contract"), img=image(B), run=2)])
    attached = []
    monkeypatch.setattr(attach, "statements_for", lambda row, recs, results, engine=None: [])
    monkeypatch.setattr(attach, "attach_all", lambda ref, stmts, signer: attached.append(ref) or SimpleNamespace(
        tag="t", referrers=False, kinds=[], bytes_added=0, image=ref))
    assert main(["attach", "--results", str(res), "--key", str(keys["ci"][0]), "--signed-records", "--run", RUN]) == 0
    assert attached == [image(A)["digest"]]
    assert f"not attached: records/{B['id']}/" in capsys.readouterr().err
    attached.clear()
    assert main(["attach", "--results", str(res), "--key", str(keys["ci"][0])]) == 0  # by hand: everything
    assert sorted(attached) == sorted([image(A)["digest"], image(B)["digest"]])
