"""`envbuild publish` + `envbuild verify` + load_table on local files (remote tables: test_table_remote.py)."""

import base64
import json
import time

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.errors import InputError, TrustError
from envbuild.sign import VerifyError, load_public_key, write_keypair
from envbuild.table import publish
from envbuild.trust import load_verified
from envbuild.verify import verify_attestations


TODAY = int(time.time()) // 86400 * 86400  # fixed within a run (reproducible), never expired


@pytest.fixture
def published(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(TODAY))
    res, out = tmp_path / "results", tmp_path / "table"
    a, b, c = combo(), combo(verl="0.5.0"), combo(engine="sglang", ev="0.4.6")
    write_all(res, [
        rec(a, passed("env", "contract"), img=image(a), run=1),
        rec(b, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named 'vllm.worker'")},
            img=image(b), status="fail", run=2),
        rec(c, stage="lock", status="fail", cause="unsatisfiable", run=3),
    ])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    table = publish(res, priv, out)
    return {"res": res, "out": out, "priv": priv, "pub": pub, "table": table, "tmp": tmp_path}


def test_publish_writes_all_views_and_verify_accepts(published, run_cli):
    out = published["out"]
    for name in ("compat.json", "compat.json.dsse", "compat.md", "index.html", "pubkey.json"):
        assert (out / name).is_file(), name
    t = json.loads((out / "compat.json").read_text())
    assert t["schema"] == 2 and t["generated"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(TODAY))
    assert t["serial"] == TODAY and t["expires"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(TODAY + 30 * 86400))
    # Every other published file is listed with its sha256 inside the signed payload.
    assert set(t["files"]) == {"compat.md", "index.html", "pubkey.json", "results.tar.gz"} | {
        f"attestations/{p.name}" for p in (out / "attestations").iterdir()}
    # the records it folds, packed the same way every time (an identical republish keeps its bytes)
    import tarfile
    with tarfile.open(out / "results.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted(str(p.relative_to(published["res"]))
                                                for p in (published["res"] / "records").glob("*/*.json"))
        assert {m.mtime for m in tar.getmembers()} == {0} and all(m.isreg() for m in tar.getmembers())
    assert {r["status"] for r in t["rows"]} == {"verified", "broken"}
    for r in t["rows"]:
        assert set(r) >= {"id", "combo", "image", "levels", "best_level", "history"}
        assert set(r["levels"]) == {"env", "contract", "gpu"}
        assert set(r["levels"]["env"]) >= {"status", "cause", "run_id", "created"}
    env = json.loads((out / "compat.json.dsse").read_text())
    assert base64.b64decode(env["payload"]) == (out / "compat.json").read_bytes()
    # Only rows with a digest get an attestation: 2 images, the lock failure has none.
    assert len(list((out / "attestations").glob("*.dsse.json"))) == 2
    p = run_cli("verify", out / "compat.json", "--pubkey", published["pub"], "--attestations")
    assert p.returncode == 0, p.stderr
    assert "OK" in p.stdout and "2 image attestations" in p.stdout and "6 listed files match" in p.stdout
    assert load_verified(out, published["pub"])[0].to_dict() == t
    assert load_verified(out.as_uri(), published["pub"])[0].to_dict() == t


def test_publish_is_reproducible_with_source_date_epoch(published):
    first = (published["out"] / "compat.json.dsse").read_bytes()
    publish(published["res"], published["priv"], published["out"])
    assert (published["out"] / "compat.json.dsse").read_bytes() == first  # Ed25519 is deterministic


@pytest.mark.parametrize("target", ["compat.json", "compat.json.dsse"])
def test_one_byte_change_is_rejected(published, run_cli, target):
    path = published["out"] / target
    data = bytearray(path.read_bytes())
    # Change one byte inside the content (not whitespace-only JSON structure): a digit or letter.
    i = next(i for i in range(len(data) // 2, len(data)) if chr(data[i]).isalnum())
    data[i] = ord("0") if data[i] != ord("0") else ord("1")
    path.write_bytes(bytes(data))
    p = run_cli("verify", published["out"], "--pubkey", published["pub"])
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0
    with pytest.raises(VerifyError):
        load_verified(published["out"], published["pub"])


def test_many_single_byte_edits_of_the_table_are_all_rejected(published):
    path = published["out"] / "compat.json"
    orig = path.read_bytes()
    for i in range(0, len(orig), max(1, len(orig) // 60)):
        data = bytearray(orig)
        data[i] = (data[i] + 1) % 256
        path.write_bytes(bytes(data))
        with pytest.raises(VerifyError):
            load_verified(published["out"], published["pub"])
    path.write_bytes(orig)
    load_verified(published["out"], published["pub"])


def test_unsigned_and_wrong_key_are_rejected(published, run_cli, tmp_path):
    _, other_pub, _ = write_keypair(tmp_path / "other")
    p = run_cli("verify", published["out"], "--pubkey", other_pub)
    assert p.returncode == 2 and "not signed by key" in p.stderr
    (published["out"] / "compat.json.dsse").unlink()
    p = run_cli("verify", published["out"] / "compat.json", "--pubkey", published["pub"])
    assert p.returncode == 2 and "unsigned" in p.stderr


def test_swapped_pubkey_next_to_table_is_refused_once_a_key_is_pinned(published, tmp_path, capsys):
    # First use pins the key published next to the table, loudly.
    t, info = load_verified(published["out"])
    assert info["keyid"] == load_public_key(published["pub"]).keyid and info["key"] == "trusted on first use"
    assert "FIRST USE" in capsys.readouterr().err
    # The attack: re-sign the table with another key and replace pubkey.json next to it.
    other_priv, other_pub, _ = write_keypair(tmp_path / "other")
    publish(published["res"], other_priv, published["out"])
    with pytest.raises(TrustError, match="key next to the table changed"):
        load_verified(published["out"])
    load_verified(published["out"], other_pub)  # a key passed explicitly is the user's decision


def test_tampered_attestation_is_rejected(published):
    att = next((published["out"] / "attestations").glob("*.dsse.json"))
    env = json.loads(att.read_text())
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = "0" * 64
    env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    att.write_text(json.dumps(env))
    table, info = load_verified(published["out"], published["pub"])
    with pytest.raises(VerifyError):
        verify_attestations(table, info, published["pub"])


def test_bad_key_writes_nothing(tmp_path):
    res = tmp_path / "results"
    write_all(res, [rec(combo(), passed("env"), img=image(combo()), run=1)])
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(InputError):
        publish(res, tmp_path / "bad.key", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="no such directory"):
        publish(tmp_path / "nope", tmp_path / "bad.key", tmp_path / "out")


def test_publish_cli_missing_key_is_one_line(tmp_path, run_cli):
    (tmp_path / "results" / "records").mkdir(parents=True)
    p = run_cli("publish", "--results", tmp_path / "results", "--key", tmp_path / "none.key",
                "--out", tmp_path / "out")
    assert p.returncode == 2 and "envbuild keygen" in p.stderr and "Traceback" not in p.stderr
