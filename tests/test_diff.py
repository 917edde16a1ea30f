"""`envbuild diff`: real signed tables (publish from records) with planted changes."""

import json

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.diff import check_order
from envbuild.diff import compare as compare_tables
from envbuild.errors import UsageError
from envbuild.row import Table
from envbuild.sign import write_keypair
from envbuild.table import publish

A = combo()  # stays verified
B = combo(verl="0.5.0")  # contract: pass -> fail (the planted regression)
C = combo(engine="sglang", ev="0.4.6.post5")  # contract: fail -> pass (a fix)
D = combo(verl="0.6.0", ev="0.9.1", torch="2.7.0")  # fail with one cause -> another cause
E = combo(verl="0.6.1", ev="0.11.0", torch="2.8.0")  # pass -> infrastructure error: not a regression
F = combo(verl="0.7.1", ev="0.12.0", torch="2.9.0")  # only in OLD
G = combo(verl="0.9.1", ev="0.24.0", torch="2.11.0")  # only in NEW


@pytest.fixture
def tables(tmp_path, monkeypatch):
    monkeypatch.delenv("ENVBUILD_PUBKEY", raising=False)
    priv, pub, _ = write_keypair(tmp_path / "keys")
    old_res, new_res = tmp_path / "old-results", tmp_path / "new-results"
    write_all(old_res, [
        rec(A, passed("env", "contract"), img=image(A), run=1),
        rec(B, passed("env", "contract"), img=image(B), run=2),
        rec(C, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named 'sgl_kernel'")},
            img=image(C), status="fail", run=3),
        rec(D, {"env": verdict("pass"), "contract": verdict("fail", "undefined-symbol", "_ZN3c10...")},
            img=image(D), status="fail", run=4),
        rec(E, passed("env", "contract"), img=image(E), run=5),
        rec(F, passed("env"), img=image(F), run=6),
    ])
    # NEW = the next night: new builds of the same combinations (new images), one new row.
    write_all(new_res, [
        rec(A, passed("env", "contract"), img=image(A, build=1), run=11),
        rec(B, {"env": verdict("pass"),
                "contract": verdict("fail", "import-error", "No module named 'vllm.worker.worker_base'")},
            img=image(B, build=1), status="fail", run=12),
        rec(C, passed("env", "contract"), img=image(C, build=1), run=13),
        rec(D, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named 'x'")},
            img=image(D, build=1), status="fail", run=14),
        rec(E, {"env": verdict("pass"), "contract": verdict("error", "probe-error", "node lost")},
            img=image(E, build=1), status="error", run=15),
        rec(G, passed("env"), img=image(G), run=16),
    ])
    publish(old_res, priv, tmp_path / "old")
    publish(new_res, priv, tmp_path / "new")
    return {"old": tmp_path / "old", "new": tmp_path / "new", "pub": pub, "priv": priv, "tmp": tmp_path}


def test_planted_regression_exits_1_and_is_named(tables, run_cli):
    md = tables["tmp"] / "summary.md"
    p = run_cli("diff", tables["old"], tables["new"], "--pubkey", tables["pub"], "--markdown", md)
    assert p.returncode == 1, (p.stdout, p.stderr)
    out = p.stdout
    reg = out.split("Regressions")[1].split("\n\n")[0]
    assert f"{B['id']} [contract]: pass -> fail (import-error)" in out
    assert "1 regression(s)" in out
    # E went pass -> error: listed as undecided, never as a regression.
    assert E["id"] not in reg.split("Fixed")[0].split("Undecided")[0]
    assert f"{E['id']} [contract]: pass -> error" in out and "not a regression" in out
    assert f"{C['id']} [contract]: fail (import-error) -> pass" in out
    assert f"{D['id']} [contract]: undefined-symbol -> import-error" in out
    assert f"New rows: 1\n  {G['id']}" in out and f"Rows gone: 1\n  {F['id']}" in out
    text = md.read_text()
    assert text.startswith("## envbuild: 1 regression(s)")
    assert f"`{B['id']}` | contract | pass | fail | import-error | import verl.workers.rollout: No module named 'vllm.worker.worker_base' |" in text


def test_json_output_lists_every_kind(tables, run_cli):
    p = run_cli("diff", tables["old"], tables["new"], "--pubkey", tables["pub"], "--json")
    assert p.returncode == 1, p.stderr
    d = json.loads(p.stdout)
    assert [(c["id"], c["level"]) for c in d["regressions"]] == [(B["id"], "contract")]
    assert [c["id"] for c in d["fixed"]] == [C["id"]]
    assert [(c["old_cause"], c["new_cause"]) for c in d["cause_changed"]] == [("undefined-symbol", "import-error")]
    assert [c["id"] for c in d["undecided"]] == [E["id"]]
    assert [r["id"] for r in d["added"]] == [G["id"]] and [r["id"] for r in d["removed"]] == [F["id"]]


def test_same_table_has_no_regression_and_exits_0(tables, run_cli):
    p = run_cli("diff", tables["new"], tables["new"], "--pubkey", tables["pub"])
    assert p.returncode == 0, p.stderr
    assert "no regressions" in p.stdout
    # Read backwards, the fix of C is a regression. Compared directly: the command itself refuses
    # a reversed pair once the serials differ (test_tables_given_out_of_order_...), and two
    # publishes in one test may or may not share a second.
    load = lambda d: Table.from_dict(json.loads((d / "compat.json").read_text()))  # noqa: E731
    d = compare_tables(load(tables["new"]), load(tables["old"]))
    assert [(c.id, c.level, c.old, c.new) for c in d.regressions] == [(C["id"], "contract", "pass", "fail")]


def test_tampered_table_is_refused_not_diffed(tables, run_cli):
    f = tables["new"] / "compat.json"
    f.write_text(f.read_text().replace('"fail"', '"pass"'))
    p = run_cli("diff", tables["old"], tables["new"], "--pubkey", tables["pub"])
    assert p.returncode == 2 and "tampered" in p.stderr and "Traceback" not in p.stderr  # trust, not a verdict
    assert p.stdout == ""


def test_wrong_key_and_key_rotation(tables, run_cli):
    priv2, pub2, _ = write_keypair(tables["tmp"] / "keys2")
    p = run_cli("diff", tables["old"], tables["new"], "--pubkey", pub2)
    assert p.returncode == 2 and "not signed by key" in p.stderr
    # Rotation: NEW re-published with the new key; each side checked against its own key.
    publish(tables["tmp"] / "new-results", priv2, tables["new"])
    p = run_cli("diff", tables["old"], tables["new"], "--old-pubkey", tables["pub"], "--new-pubkey", pub2)
    assert p.returncode == 1 and B["id"] in p.stdout


def test_build_level_regression_and_timeouts():
    row = lambda st, build="pass", cause=None: {  # noqa: E731
        "id": "x", "status": "?", "build": {"status": build, "cause": cause if build == "fail" else None},
        "levels": {"env": {"status": "pass"}, "contract": {"status": st, "cause": cause}, "gpu": {"status": "not-run"}}}
    def compare(old, new):
        return compare_tables(Table.from_dict({"schema": 2, **old}), Table.from_dict({"schema": 2, **new}))

    d = compare({"rows": [row("pass")]}, {"rows": [row("timeout", cause="timeout")]})
    assert [(c.kind, c.level) for c in d.changes] == [("regression", "contract")]
    d = compare({"rows": [row("pass")]}, {"rows": [row("pass", build="fail", cause="unsatisfiable")]})
    assert [(c.kind, c.level, c.new_cause) for c in d.changes] == [("regression", "build", "unsatisfiable")]
    d = compare({"rows": [row("pass")]}, {"rows": [row("needs-gpu")]})
    assert [c.kind for c in d.changes] == ["undecided"] and not d.regressions
    d = compare({"rows": [row("not-run")]}, {"rows": [row("fail", cause="import-error")]})
    assert not d.changes  # never passed: a failure is not a regression


def test_insecure_reads_unsigned(tables, run_cli):
    (tables["new"] / "compat.json.dsse").unlink()
    p = run_cli("diff", tables["old"], tables["new"], "--pubkey", tables["pub"])
    assert p.returncode == 2 and "unsigned" in p.stderr
    md = tables["tmp"] / "insecure.md"
    p = run_cli("diff", tables["old"], tables["new"], "--insecure", "--markdown", md)
    assert p.returncode == 1 and B["id"] in p.stdout
    assert "signatures NOT checked" in md.read_text()


def test_tables_given_out_of_order_are_refused_not_called_fixed(tables, run_cli, monkeypatch):
    """The attack of issue 14: `diff new old` would call the regression of B "Fixed"."""
    # Republish NEW a day later: its serial is now certainly higher than OLD's.
    import time
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(int(time.time()) + 86400))
    publish(tables["tmp"] / "new-results", tables["priv"], tables["new"])
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert run_cli("verify", tables["new"], "--pubkey", tables["pub"]).returncode == 0  # NEW's serial is now known
    p = run_cli("diff", tables["new"], tables["old"], "--pubkey", tables["pub"])
    assert p.returncode == 2 and p.stdout == "" and "Fixed" not in p.stdout
    assert "is newer than NEW" in p.stderr and "swap" in p.stderr and p.stderr.count("\n") == 1
    p = run_cli("diff", tables["old"], tables["new"], "--pubkey", tables["pub"])
    assert p.returncode == 1 and f"{B['id']} [contract]: pass -> fail" in p.stdout


def test_order_of_schema_1_tables_falls_back_to_generated():
    old = Table.from_dict({"schema": 1, "generated": "2026-01-02T00:00:00Z", "rows": []})
    new = Table.from_dict({"schema": 1, "generated": "2026-01-01T00:00:00Z", "rows": []})
    with pytest.raises(UsageError, match="generated"):
        check_order(old, new)
    check_order(new, old)
