"""`envbuild census`: every combination judged without an image (issue 28). The fold and the
readers on records; the real thing (a real lock, real wheels, the static contracts) is the
network test at the end."""

import json

import pytest
from table_fixtures import combo, image, passed, rec

from envbuild.census import wheels_for
from envbuild.fold import fold_combo
from envbuild.query import Ask, answer
from envbuild.record import CENSUS
from envbuild.row import Table
from envbuild.table import build_table
from envbuild.views import render_markdown

C = combo(verl="0.4.1", engine="sglang", ev="0.4.6.post5", torch="2.6.0", cuda="cu124", python="3.11")


def _census(status, cause=None, run=5, detail=""):
    r = rec(C, {}, run=run, status=status)
    r.image, r.stage, r.place, r.cause, r.detail = None, "probe", {"kind": CENSUS, "reused": False}, cause, detail
    r.probe = {}
    return r


def test_a_failing_census_condemns_a_row_and_a_passing_one_verifies_nothing():
    ok = fold_combo([_census("ok")])
    assert ok.status == "untested" and ok.census["status"] == "pass" and ok.best_level is None
    bad = fold_combo([rec(C, passed("env", "contract"), img=image(C), run=1),
                      _census("fail", "call-signature-drift", run=2,
                              detail="sglang_rollout.py:140 ReleaseMemoryOccupationReqInput(): no parameter 'tags'")])
    assert bad.status == "broken" and bad.failure.level == "census" and bad.failure.cause == "call-signature-drift"
    assert bad.census["detail"].startswith("sglang_rollout.py:140")
    table = build_table([bad, fold_combo([_census("ok", run=3)])])
    assert answer(table, Ask()).best is None  # nothing verified: the census never verifies
    md = render_markdown(table)
    assert "census: 0 pass, 1 broken" in md or "census: 1 pass, 1 broken" in md
    assert "| broken: call-signature-drift |" in md
    # the newest census counts: a later pass clears an earlier failure
    again = fold_combo([_census("fail", "static-import-missing", run=2), _census("ok", run=4)])
    assert again.status == "untested" and again.census["status"] == "pass"
    assert Table.from_dict(json.loads(json.dumps(table.to_dict()))).rows[0].census["status"] == "broken"


def test_the_census_reads_verl_the_engine_and_transformers():
    from types import SimpleNamespace
    assert wheels_for(SimpleNamespace(engine="sglang")) == ["verl", "sglang", "transformers"]
    assert wheels_for(SimpleNamespace(engine="hf")) == ["verl", "transformers"]


@pytest.mark.network
def test_census_of_a_real_combination(tmp_path, run_cli, isolated_cache):
    """verl 0.4.1 with its pinned SGLang 0.4.6.post5: the lock resolves, and the call-signature
    contract finds verl's wake-up path passing tags= to request classes that have no such field.
    Issue 47: verl passes tags only under `if self.multi_stage_wake_up` (default false), read from
    verl's code: the row passes its core path, and the finding is its multi_stage_wake_up scope."""
    p = run_cli("census", "--verl", "0.4.1", "--sglang", "0.4.6.post5", "--cuda", "cu124", "--platform",
                "linux/amd64", "--results", tmp_path / "r", "--json", "-j", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    out = [json.loads(line) for line in p.stdout.splitlines()]
    assert [o["status"] for o in out] == ["ok"]
    rec_file = next((tmp_path / "r" / "records").rglob("*.json"))
    r = json.loads(rec_file.read_text())
    assert r["place"]["kind"] == "census" and len(r["place"]["wheels"]) == 3
    checks = {c["name"]: c for c in r["probe"]["contract"]["checks"]}
    c = checks["calls:verl.workers.rollout.sglang_rollout.sglang_rollout@multi_stage_wake_up"]
    assert "no parameter 'tags'" in c["detail"] and c["status"] == "fail" and c["scope_from"] == "code"
    assert "fsdp_sglang.py" in c["detail"] and "multi_stage_wake_up" in c["detail"]
    assert checks["registry:rollout"]["status"] == "pass"
    from envbuild.fold import fold
    from envbuild.record import iter_records

    row = fold(list(iter_records(tmp_path / "r")))[0]
    assert row.status != "broken" and "multi_stage_wake_up" in row.scopes
    # warm: the same lock, the same wheels, the same probe code: the verdict is reused
    q = run_cli("census", "--verl", "0.4.1", "--sglang", "0.4.6.post5", "--cuda", "cu124", "--platform",
                "linux/amd64", "--results", tmp_path / "r", "--json", "-j", "1")
    assert json.loads(q.stdout.splitlines()[0])["reused"] is True


def test_a_failing_census_line_says_what_it_found_with_file_and_line():
    """Issue 50: census printed a failure without its file:line."""
    from envbuild.census import _first_finding
    from envbuild.record import Record

    found = Record(combo={"id": "x"}, stage="lock", status="fail", cause="static-import-missing",
                   probe={"contract": {"status": "fail", "level": "contract", "checks": [
                       {"name": "static:verl.a", "status": "fail", "level": "contract",
                        "detail": "verl/a.py:12 from vllm.x import y: no module vllm.x"}]}})
    assert _first_finding(found) == "static:verl.a: verl/a.py:12 from vllm.x import y: no module vllm.x"
    unsat = Record(combo={"id": "x"}, stage="lock", status="fail", cause="unsatisfiable",
                   detail="No solution found when resolving dependencies:\n  Because sglang==0.5.12 ...")
    assert _first_finding(unsat) == "No solution found when resolving dependencies:"
    assert _first_finding(Record(combo={"id": "x"}, stage="lock", status="ok")) == ""
