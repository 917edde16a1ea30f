"""A row broken only where a run opts in: the fold keeps its status and lists the scope, and every
reader answers per run through the one query (pick --feature/--model-type/--config, compat.md)."""

from __future__ import annotations

from table_fixtures import combo, image, rec

from envbuild.fold import fold_combo
from envbuild.probe.verdict import Verdict
from envbuild.query import Ask, answer, why_not
from envbuild.row import Row, Table
from envbuild.runscope import overrides_of_script, scopes_from_flags, scopes_of, scopes_of_config
from envbuild.selector import Selectors
from envbuild.views import md_row

C = combo(verl="0.9.1", ev="0.24.0", torch="2.11.0", cuda="cu130")


def _contract(scoped: str | None, core_fail: bool = False) -> dict:
    v = Verdict(level="contract", engine="vllm")
    with v.at_level("env"):
        v.add("python", "pass")
    with v.at_level("contract"):
        v.add("import:verl.workers.rollout", "pass")
        if scoped:
            v.add(f"calls:verl.utils.modelopt.vllm_modelopt_patch@{scoped}", "fail",
                  "verl/utils/modelopt/vllm_modelopt_patch.py:435 make_nvfp4_moe_kernel(): no parameter 'shared_experts'",
                  "call-signature-drift", scope=scoped, scope_from="data")
        if core_fail:
            v.add("static:verl.workers.rollout.vllm_rollout.vllm_async_server", "fail", "x.py:1 no name", "static-import-missing")
    return v.to_dict()


def _table(*recs) -> Table:
    return Table(rows=[fold_combo(list(recs))])


def test_a_scoped_failure_keeps_the_row_verified_and_lists_the_scope():
    row = fold_combo([rec(C, {"contract": _contract("quantization")}, img=image(C), run=1)])
    assert row.status == "verified" and row.best_level == "contract"
    s = row.scopes["quantization"]
    assert s["checks"] == ["calls:verl.utils.modelopt.vllm_modelopt_patch@quantization"]
    assert "vllm_modelopt_patch.py:435" in s["detail"] and s["from"] == "data" and s["where"] == "image"
    assert "QAT" in s["label"]
    assert Row.from_dict(row.to_dict()).scopes == row.scopes  # round-trips through compat.json
    assert "broken with QAT" in md_row(row)["scopes"]


def test_a_core_failure_still_breaks_the_row():
    row = fold_combo([rec(C, {"contract": _contract("quantization", core_fail=True)}, img=image(C), run=1)])
    assert row.status == "broken" and row.failure.cause == "static-import-missing"


def test_pick_answers_per_run():
    t = _table(rec(C, {"contract": _contract("quantization")}, img=image(C), run=1))
    sel = Selectors(engine="vllm", engine_version="0.24.0")
    assert answer(t, Ask(sel)).best is not None  # verl's default run: the row answers
    a = Ask(sel, scopes=frozenset({"quantization"}))
    ans = answer(t, a)
    assert ans.best is None and "broken for your run" in why_not(ans.rows[0], a)
    assert answer(t, Ask(sel, scopes=frozenset({"lora", "model:qwen2"}))).best is not None
    assert "--feature quantization" in a.describe()


def test_model_type_scopes_match_any_listed_type():
    v = Verdict(level="contract", engine="vllm")
    with v.at_level("contract"):
        v.add("static:verl.models.transformers.qwen3_5@model:qwen3_5,qwen3_5_moe", "fail", "qwen3_5.py:22",
              "static-import-missing", scope="model:qwen3_5,qwen3_5_moe", scope_from="code")
    t = _table(rec(C, {"contract": v.to_dict()}, img=image(C), run=1))
    sel = Selectors(engine="vllm")
    assert answer(t, Ask(sel, scopes=frozenset({"model:qwen3_5_moe"}))).best is None
    assert answer(t, Ask(sel, scopes=frozenset({"model:qwen3"}))).best is not None


def test_a_run_is_read_from_flags_a_yaml_config_and_a_launch_script(tmp_path):
    assert scopes_from_flags(["multi-stage-wake-up"], ["Qwen3_5"]) == {"multi_stage_wake_up", "model:qwen3_5"}
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "glm4v"}')
    script = tmp_path / "run_grpo.sh"
    script.write_text("set -x\npython3 -m verl.trainer.main_ppo \\\n  algorithm.adv_estimator=grpo \\\n"
                      "  actor_rollout_ref.rollout.mode=async \\\n"
                      f"  actor_rollout_ref.model.path={model} \\\n  actor_rollout_ref.model.lora_rank=64 $@\n")
    assert "actor_rollout_ref.model.lora_rank=64" in overrides_of_script(str(script))
    assert scopes_of_config(str(script)) == {"async", "lora", "model:glm4v"}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("actor_rollout_ref:\n  actor:\n    fsdp_config:\n      qat:\n        enable: true\n"
                   "  model:\n    lora_rank: 0\n")
    assert scopes_of_config(str(cfg)) == {"quantization"}
    assert scopes_of({"actor_rollout_ref.rollout.mode": "sync"}) == {"sync"}


def test_doctor_fails_a_run_that_enters_a_broken_scope_and_passes_one_that_avoids_it(monkeypatch):
    import envbuild.trust as trust
    from envbuild.doctor.common import Options
    from envbuild.doctor.tablecheck import check_table

    t = _table(rec(C, {"contract": _contract("quantization")}, img=image(C), run=1))
    monkeypatch.setattr(trust, "load_verified", lambda *a, **k: (t, {}))
    versions = {"verl": "0.9.1", "vllm": "0.24.0", "torch": "2.11.0+cu130", "torch_variant": "cu130", "python": "3.11.7"}
    opt = Options(table="t", pubkey="k", platform="linux/amd64")
    ok = check_table(opt, "vllm", versions, frozenset({"lora"}))
    assert ok.status == "pass" and "broken only with quantization, which this run does not use" in ok.reason
    bad = check_table(opt, "vllm", versions, frozenset({"quantization"}))
    assert bad.status == "fail" and "broken for this run" in bad.reason and "--feature quantization" in bad.fix


def test_diff_reports_a_regression_per_scope():
    from envbuild.diff import compare

    old = _table(rec(C, {"contract": _contract(None)}, img=image(C), run=1))
    new = _table(rec(C, {"contract": _contract("quantization")}, img=image(C), run=2))
    d = compare(old, new)
    assert [(c.kind, c.level) for c in d.changes] == [("regression", "scope quantization")]
    assert [(c.kind, c.level) for c in compare(new, old).changes] == [("fixed", "scope quantization")]


class FakeGitHub:
    def __init__(self):
        self.store: dict[int, dict] = {}
        self.comments: list[tuple[int, str]] = []

    def issues(self):
        return [dict(i) for i in self.store.values()]

    def create(self, title, body):
        n = len(self.store) + 1
        self.store[n] = {"number": n, "title": title, "body": body, "state": "open"}
        return self.store[n]

    def update(self, number, **fields):
        self.store[number].update({k: v for k, v in fields.items() if k in ("title", "body", "state")})
        return self.store[number]

    def comment(self, number, body):
        self.comments.append((number, body))


def test_notify_opens_and_closes_one_issue_per_row_and_scope():
    from envbuild.notify import notify

    gh = FakeGitHub()
    clean = _table(rec(C, {"contract": _contract(None)}, img=image(C), run=1))
    scoped = _table(rec(C, {"contract": _contract("quantization")}, img=image(C), run=2))
    acts = notify(gh, clean, scoped)
    assert [(a.kind, a.id) for a in acts] == [("opened", C["id"] + "@quantization")]
    issue = gh.store[1]
    assert "broken with QAT" in issue["title"] and "runs that do not use it are not affected" in issue["body"]
    assert notify(gh, scoped, scoped) == []  # unchanged: nothing to do
    acts = notify(gh, scoped, _table(rec(C, {"contract": _contract(None)}, img=image(C), run=3)))
    assert [(a.kind, a.id) for a in acts] == [("closed", C["id"] + "@quantization")]
    assert gh.store[1]["state"] == "closed"


CHROMIUM = __import__("shutil").which("chromium") or __import__("shutil").which("chromium-browser")


@__import__("pytest").mark.skipif(not CHROMIUM and not __import__("os").environ.get("CI"), reason="chromium not installed")
def test_the_page_answers_for_the_run_the_user_describes(tmp_path):
    """In a real Chromium: the page's script refuses a row broken under a scope the user's run uses
    (typed into "My run uses" or given in the URL), as pick does, and the printed command says it."""
    import json

    from cdp import Browser
    from test_page_browser import FLAGS

    from envbuild.views import render_html
    from test_query_agreement import PUB

    other = combo(verl="0.9.1", ev="0.20.2", torch="2.11.0", cuda="cu130")
    t = Table(rows=[fold_combo([rec(C, {"contract": _contract("quantization")}, img=image(C), run=1)]),
                    fold_combo([rec(other, {"contract": _contract(None)}, img=image(other), run=2)])])
    page = tmp_path / "index.html"
    page.write_text(render_html(t, PUB))
    b = Browser(CHROMIUM, FLAGS)
    try:
        b.open(page.as_uri())
        b.wait("document.body && document.body.getAttribute('data-ready') === '1'")
        cases = [("", None), ("quantization", "quantization"), ("QAT, Model_Type=Qwen2", "model:qwen2"),
                 ("quantization,model:qwen2", "model:qwen2,quantization")]
        for typed, norm in cases:
            got = b.eval(f"envbuildQuery.parseUses({json.dumps(typed)}).join(',')") if typed else ""
            assert got == (norm or ""), (typed, got)
        for uses in ("", "quantization", "lora"):
            want = answer(t, Ask(Selectors(engine="vllm"), scopes=frozenset(uses.split(",")) - {""})).best
            assert want is not None
            b.open(page.as_uri() + "#engine=vllm" + ("&uses=" + uses if uses else ""))
            b.wait("document.body && document.body.getAttribute('data-ready') === '1'")
            got = b.eval("document.getElementById('answer').getAttribute('data-id')")
            assert got == want.id, uses
            assert (want.id == C["id"]) == (uses != "quantization")  # the scoped row only where the run avoids it
            text = b.eval("document.getElementById('answer').textContent")
            if uses:
                assert f"--feature {uses}" in text
    finally:
        b.close()


def test_first_day_errors_say_what_to_do(run_cli, tmp_path):
    """Issue 50: a private key passed as --pubkey, and `verify IMAGE:tag`, are one-line errors that
    say what to pass instead (exit 2)."""
    keys = tmp_path / "keys"
    assert run_cli("keygen", "--out", keys).returncode == 0
    table = __import__("pathlib").Path(__file__).resolve().parent.parent / "bench" / "h200_rows" / "table"
    p = run_cli("verify", table, "--pubkey", keys / "envbuild.key", env={"ENVBUILD_STATE": str(tmp_path / "s")})
    assert p.returncode == 2 and "a private key: pass the public half" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("verify", "127.0.0.1:5000/envbuild/verl:v1", "--pubkey", keys / "envbuild.pub.json")
    assert p.returncode == 2 and "verify an image by digest" in p.stderr


def test_progress_beats_to_a_pipe_and_keeps_one_live_line_on_a_terminal():
    import io
    import time as _t

    from envbuild.progress import Progress

    class Pipe(io.StringIO):
        def isatty(self):
            return False

    class Tty(io.StringIO):
        def isatty(self):
            return True

    pipe = Pipe()
    with Progress("census", 3, "combinations", stream=pipe, every=0.05) as b:
        b.advance(1, "verl0.9.1-vllm0.24.0: ok")
        _t.sleep(0.3)
    out = pipe.getvalue().splitlines()
    assert out and "census: 1/3 combinations done" in out[-1] and "last: verl0.9.1-vllm0.24.0: ok" in out[-1]
    n = len(out)
    _t.sleep(0.2)
    assert len(pipe.getvalue().splitlines()) == n  # ended with the block
    tty = Tty()
    with Progress("venv", stream=tty, every=0.05) as b:
        b.start("verl0.9.1-vllm0.24.0", "installing")
        _t.sleep(1.3)
    # a terminal gets one live line (redrawn in place, erased at the end), never a beat of lines
    assert "venv: 0 done" in tty.getvalue() and "running verl0.9.1-vllm0.24.0 (installing" in tty.getvalue()
    assert "\x1b[" in tty.getvalue()  # drawn in place
