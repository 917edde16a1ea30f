"""`envbuild doctor` environment checks: the probe run in place and the signed compatibility table."""

import json
import sys

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild import doctor
import envbuild.doctor.env  # noqa: F401 - patched below
from envbuild.doctor import FAIL, PASS, WARN, Options, check_table, installed_versions, run_probe
from envbuild.sign import write_keypair
from envbuild.table import publish

HAVE = {"python": "3.11.7", "verl": "0.6.1", "torch": "2.8.0+cu128", "torch_cuda": "12.8", "vllm": "0.10.2"}


@pytest.fixture
def table(tmp_path, monkeypatch):
    """A real signed table: one verified, one broken combination."""
    monkeypatch.delenv("ENVBUILD_PUBKEY", raising=False)
    ok = combo(verl="0.6.1", ev="0.10.2", torch="2.8.0", cuda="12.8", python="3.11")
    broken = combo(verl="0.6.1", ev="0.11.0", torch="2.8.0", cuda="12.8", python="3.11")
    res = tmp_path / "results"
    write_all(res, [rec(ok, passed("env", "contract"), img=image(ok), run=1),
                    rec(broken, {"env": verdict("pass"), "contract": verdict("fail", "import-error")},
                        img=image(broken), status="fail", run=2)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    out = tmp_path / "table"
    publish(res, priv, out)
    other_priv, other_pub, _ = write_keypair(tmp_path / "other")
    return {"dir": out, "pub": pub, "other_pub": other_pub}


def test_verified_combination_passes(table):
    r = check_table(Options(table=str(table["dir"]), pubkey=str(table["pub"])), "vllm", HAVE)
    assert r.status == PASS, r.reason
    assert "verified in the signed table at ['env', 'contract']" in r.reason
    assert r.details["installed"] == {"verl": "0.6.1", "engine": "vllm", "engine_version": "0.10.2",
                                      "torch": "2.8.0", "cuda": "cu128", "python": "3.11", "platform": "linux/amd64"}


def test_insecure_table_match_is_only_a_warning(table):
    r = check_table(Options(table=str(table["dir"] / "compat.json"), insecure=True), "vllm", HAVE)
    assert r.status == WARN and "NOT checked" in r.reason


def test_broken_and_absent_combinations(table):
    opt = Options(table=str(table["dir"]), pubkey=str(table["pub"]))
    r = check_table(opt, "vllm", {**HAVE, "vllm": "0.11.0"})
    assert r.status == FAIL and "broken at ['contract']" in r.reason
    r = check_table(opt, "vllm", {**HAVE, "torch_cuda": "12.6"})
    assert r.status == WARN and "does not appear" in r.reason and "cu126" in r.reason
    r = check_table(opt, "vllm", {**HAVE, "verl": None})
    assert r.status == FAIL and "not installed here: verl" in r.reason


def test_wrong_key_or_tampered_table_fails(table):
    r = check_table(Options(table=str(table["dir"]), pubkey=str(table["other_pub"])), "vllm", HAVE)
    assert r.status == FAIL and "not verified" in r.reason
    compat = table["dir"] / "compat.json"
    compat.write_text(compat.read_text().replace('"0.10.2"', '"0.10.3"'))
    r = check_table(Options(table=str(table["dir"]), pubkey=str(table["pub"])), "vllm", HAVE)
    assert r.status == FAIL and "not verified" in r.reason


def test_missing_verify_module_degrades_to_a_warning(table, monkeypatch):
    monkeypatch.setitem(sys.modules, "envbuild.trust", None)  # as if envbuild.trust were not installed
    r = check_table(Options(table=str(table["dir"])), "vllm", HAVE)
    assert r.status == WARN and "table verification not available" in r.reason


def test_probe_not_available_is_a_clear_warning(monkeypatch):
    monkeypatch.setattr(doctor.env, "probe_available", lambda: False)
    r = run_probe("vllm", Options())
    assert r.status == WARN and r.reason.startswith("probe not available")
    assert run_probe("trtllm", Options()).reason.startswith("rollout.name=trtllm")


def test_installed_versions_reads_metadata_without_importing_torch():
    before = "torch" in sys.modules
    v = installed_versions("vllm")
    assert v["python"] == "%d.%d" % sys.version_info[:2]
    assert set(v) >= {"verl", "torch", "vllm"}
    assert ("torch" in sys.modules) == before


def test_cli_runs_the_real_probe_and_the_table(table, run_cli):
    """End to end: the probe's own verdict (env + contract, in place) decides env.probe; its versions feed the
    table lookup. What they say depends on this Python's installs, so the test derives the expectation."""
    p = run_cli("doctor", "--json", "--skip", "data", "--skip", "output", "--skip", "ray", "--skip", "grpo",
                "--table", table["dir"], "--pubkey", table["pub"], "--", "actor_rollout_ref.rollout.name=vllm",
                timeout=600)
    out = json.loads(p.stdout)
    checks = {c["name"]: c for c in out["checks"]}
    probe = checks["env.probe"]
    v = probe["details"]["verdict"]
    want = {"pass": PASS, "fail": FAIL, "needs-gpu": WARN, "error": WARN}[v["status"]]
    assert probe["status"] == want and v["level"] == "contract" and v["engine"] == "vllm" and v["checks"]
    tbl = checks["env.table"]
    versions = v["versions"]
    if not versions.get("verl") or not versions.get("vllm"):
        assert tbl["status"] == FAIL and "not installed here" in tbl["reason"]
    else:
        assert tbl["status"] in (PASS, WARN, FAIL) and tbl["details"]["installed"]["verl"] == versions["verl"]
    assert p.returncode == (1 if FAIL in (probe["status"], tbl["status"], checks["config.keys"]["status"]) else 0)
