"""Every reader names the same variant: for generated tables and selections, `pick`, the page
(its embedded answers and, in a real Chromium, its own script combining the rows' facts),
compat.md and doctor's table check agree on the best variant and its status (issue #25).

The generated rows cover what a table holds: several variants per verl x engine cell (torch,
CUDA, Python, platform), every probe outcome (pass at each level, fail, timeout, needs-gpu,
error, never probed, not pushed), and GPU coverage (read, partial, never read). Versions are whole
releases (x.y.z), the spelling records hold, so that the page's exact filters and pick's
release-prefix selectors select the same rows.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from table_fixtures import combo, image, rec, verdict, write_all

from envbuild.doctor import FAIL, PASS, Options, check_table
from envbuild.fold import fold
from envbuild.pick import pick
from envbuild.query import Ask, answer, cells, exact, scope_hits
from envbuild.selector import Selectors
from envbuild.sign import write_keypair
from envbuild.table import build_table, publish
from envbuild.views import page_data, render_markdown

TRIES = int(os.environ.get("ENVBUILD_AGREEMENT_TRIES", "150"))
PUB = {"keyid": "ab" * 32, "keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": "cd" * 32}}
PLATFORMS = ("linux/amd64", "linux/arm64")
GPUS = (None, "sm_80", "sm_90", "sm_100")
DRIVERS = (None, "525.60.13", "550.54.14", "560.28.03", "580.65.06")
LEVELS = ("env", "contract", "gpu")

# What a row's records can say: the probe's verdicts per level, and whether the image was pushed.
OUTCOMES = {
    "gpu": ({"env": "pass", "contract": "pass", "gpu": "pass"}, True),
    "contract": ({"env": "pass", "contract": "pass"}, True),
    "env": ({"env": "pass"}, True),
    "contract-needs-gpu": ({"env": "pass", "contract": "pass", "gpu": "needs-gpu"}, True),
    "contract-fails": ({"env": "pass", "contract": "fail"}, True),
    "gpu-times-out": ({"env": "pass", "contract": "pass", "gpu": "timeout"}, True),
    "env-error": ({"env": "error"}, True),
    "not-pushed": ({"env": "pass", "contract": "pass"}, False),
    "lock-fails": (None, False),
    # issue 47: verified, and broken only for runs that opt into a scope (a feature, a model type)
    "contract-scoped-quantization": ({"env": "pass", "contract": "pass"}, True),
    "gpu-scoped-qwen3_5": ({"env": "pass", "contract": "pass", "gpu": "pass"}, True),
}
SCOPED = {"contract-scoped-quantization": ("contract", "quantization"),
          "gpu-scoped-qwen3_5": ("contract", "model:qwen3_5,qwen3_5_moe")}
RUN_SCOPES = ((), ("quantization",), ("model:qwen3_5_moe",), ("lora", "model:qwen2"))
COVERAGE = {"none": None, "hopper": ["sm_80", "sm_90"], "all": ["sm_80", "sm_90", "sm_100"]}


def _verdicts(levels: dict[str, str], cover) -> dict:
    out = {}
    for lv, st_ in levels.items():
        v = verdict(st_, None if st_ == "pass" else f"{lv}-{st_}")
        if lv == "env" and cover is not None:
            v["hardware"] = {"gpu_arch": {"supports": cover, "lacking": {}}, "min_shm_bytes": 1 << 30}
        out[lv] = v
    return out


row_spec = st.fixed_dictionaries({
    "verl": st.sampled_from(["0.4.1", "0.5.0", "0.6.0"]),
    "engine": st.sampled_from([("vllm", "0.8.4"), ("vllm", "0.8.5"), ("sglang", "0.4.6"), ("hf", "")]),
    "torch": st.sampled_from(["2.6.0", "2.7.0"]),
    "cuda": st.sampled_from(["cu124", "cu126", "cu128"]),
    "python": st.sampled_from(["3.11", "3.12"]),
    "platform": st.sampled_from(PLATFORMS),
    "outcome": st.sampled_from(sorted(OUTCOMES)),
    "cover": st.sampled_from(sorted(COVERAGE)),
})


def table_of(specs):
    records, seen, run = [], set(), 0
    for s in specs:
        eng, ev = s["engine"]
        c = combo(verl=s["verl"], engine=eng, ev=ev, torch=s["torch"], cuda=s["cuda"], python=s["python"],
                  platform=s["platform"])
        if c["id"] in seen:
            continue
        seen.add(c["id"])
        levels, pushed = OUTCOMES[s["outcome"]]
        run += 1
        if levels is None:
            records.append(rec(c, stage="lock", status="fail", cause="unsatisfiable", detail="no solution", run=run))
            continue
        status = "fail" if any(v in ("fail", "timeout") for v in levels.values()) else \
            "error" if "error" in levels.values() else "ok"
        vs = _verdicts(levels, COVERAGE[s["cover"]])
        if s["outcome"] in SCOPED:
            lv, scope = SCOPED[s["outcome"]]
            vs[lv]["checks"].append({"name": f"static:verl.x@{scope}", "status": "fail", "scope": scope,
                                     "scope_from": "code", "detail": "verl/x.py:1 from y import z: no z"})
        records.append(rec(c, vs, img=image(c, pushed=pushed), status=status, run=run))
    return records, build_table(fold(records))


asks = st.fixed_dictionaries({"level": st.sampled_from(LEVELS), "gpu": st.sampled_from(GPUS),
                              "driver": st.sampled_from(DRIVERS), "platform": st.sampled_from(PLATFORMS + (None,))})


def _label(r) -> str:
    return f"{r.combo.engine} {r.combo.engine_version or ''}".strip()


def _cell_selectors(platform, eng_label, verl) -> Selectors:
    eng, _, ev = eng_label.partition(" ")
    return Selectors(platform=platform, engine=eng, engine_version=ev or None, verl=verl)


def _md_answers(md: str) -> dict[tuple[str, str, str], str]:
    """compat.md's 'The image to use' table: (platform, engine, verl) -> the answer's id ('-': none)."""
    part = md.split("## The image to use, per platform", 1)[1].split("## Every variant", 1)[0]
    out = {}
    for line in part.splitlines():
        cells_ = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells_) == 7 and cells_[0].startswith("linux/"):
            out[(cells_[0], cells_[2], cells_[1])] = cells_[3]
    return out


@settings(max_examples=TRIES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(row_spec, min_size=1, max_size=14))
def test_pick_the_page_data_and_compat_md_name_the_same_answer(specs):
    _, table = table_of(specs)
    data = page_data(table, PUB)
    md = _md_answers(render_markdown(table))
    # The default ask (the page's first view, compat.md, `envbuild pick --platform P` for a cell).
    for pf in PLATFORMS:
        for (p, eng, verl), ans in cells(table, Ask().on(pf)).items():
            row, _ = pick(table, _cell_selectors(p, eng, verl))
            want = row.id if row else None
            assert (ans.best.id if ans.best else None) == want
            assert data["best"][f"{p}|{eng}|{verl}"]["best"] == want
            assert data["best"][f"{p}|{eng}|{verl}"]["shown"] == ans.shown.id
            assert md[(p, eng, verl)] == (want or "-")
            if row:  # the answer's status is verified, in every reader
                assert row.status == "verified" and ans.shown.status == "verified"


def _published(specs, tmp, monkeypatch):
    """The generated table, published and signed in `tmp` (doctor reads it as a user's would)."""
    monkeypatch.delenv("ENVBUILD_PUBKEY", raising=False)
    monkeypatch.setenv("ENVBUILD_STATE", str(tmp / "state"))
    monkeypatch.setenv("ENVBUILD_CONFIG", str(tmp / "config"))
    records, table = table_of(specs)
    write_all(tmp / "results", records)
    priv, pub, _ = write_keypair(tmp / "keys")
    publish(tmp / "results", priv, tmp / "table")
    return table, tmp, pub


def _installed(c) -> dict:
    """What doctor reads of an installed stack that is this row's."""
    return {"python": c.python + ".7", "verl": c.verl, "torch": c.torch + "+" + c.cuda, "torch_variant": c.cuda,
            "vllm": c.engine_version if c.engine == "vllm" else None,
            "sglang": c.engine_version if c.engine == "sglang" else None}


@settings(max_examples=max(20, TRIES // 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(specs=st.lists(row_spec, min_size=1, max_size=8))
def test_doctor_names_the_row_pick_names_with_its_status(specs, tmp_path_factory, monkeypatch):
    """doctor's table check for an installed stack (every axis given, on its platform) finds the row
    the query finds, and says pass exactly for a verified row, fail exactly for a broken one."""
    table, tmp, pub = _published(specs, tmp_path_factory.mktemp("doctor"), monkeypatch)
    for r in table.rows:
        c = r.combo
        got = check_table(Options(table=str(tmp / "table"), pubkey=str(pub), platform=c.platform), c.engine,
                          _installed(c))
        ans = exact(table, verl=c.verl, engine=c.engine, engine_version=c.engine_version, torch=c.torch, cuda=c.cuda,
                    python=c.python, platform=c.platform)
        assert got.details.get("row") == ans.shown.id == r.id
        assert (got.status == PASS) == (r.status == "verified")
        assert (got.status == FAIL) == (r.status == "broken")
        best = answer(table, Ask(Selectors(cuda=c.cuda, python=c.python, torch=c.torch, engine=c.engine,
                                           engine_version=c.engine_version or None, verl=c.verl, platform=c.platform),
                                 level="env")).best
        assert (best is not None) == (r.status == "verified")


@settings(max_examples=max(20, TRIES // 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(specs=st.lists(row_spec, min_size=1, max_size=8), run=st.sampled_from(RUN_SCOPES))
def test_doctor_and_the_query_agree_on_a_runs_scopes(specs, run, tmp_path_factory, monkeypatch):
    """Issue 47, item 5: for a run that enters scopes (a feature, a model type), doctor's table check
    passes exactly where the query answers that row for that run, and fails exactly where the row
    is broken or broken under a scope the run enters; pick's answer (the query with the run's
    scopes) is never a row broken for that run."""
    table, tmp, pub = _published(specs, tmp_path_factory.mktemp("doctor-scopes"), monkeypatch)
    scopes = frozenset(run)
    for r in table.rows:
        c = r.combo
        got = check_table(Options(table=str(tmp / "table"), pubkey=str(pub), platform=c.platform), c.engine,
                          _installed(c), scopes)
        sel = Selectors(cuda=c.cuda, python=c.python, torch=c.torch, engine=c.engine,
                        engine_version=c.engine_version or None, verl=c.verl, platform=c.platform)
        best = answer(table, Ask(sel, level="env", scopes=scopes)).best
        broken_for_run = r.status == "broken" or bool(scope_hits(tuple(r.scopes), scopes))
        assert got.details.get("row") == r.id
        assert (got.status == PASS) == (best is not None) == (r.status == "verified" and not broken_for_run)
        assert (got.status == FAIL) == broken_for_run
        pick_best = answer(table, Ask(Selectors(platform=c.platform, engine=c.engine), scopes=scopes)).best
        if pick_best is not None:
            assert not scope_hits(tuple(pick_best.scopes), scopes) and pick_best.status == "verified"


# ---------------------------------------------------------------- the page's own script, in Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not CHROMIUM and not os.environ.get("CI"), reason="chromium not installed")
def test_the_pages_script_combines_the_facts_as_the_query_does(tmp_path):
    """For generated tables and asks (platform, GPU, driver, level): the answer the page's script
    computes from the rows' facts is the query's, for the selection and for every cell."""
    from cdp import Browser
    from test_page_browser import FLAGS

    from envbuild.views import render_html

    import random

    rng = random.Random(25)  # seeded: the same tables every run
    checked = 0
    b = Browser(CHROMIUM, FLAGS)
    try:
        for t in range(12):
            specs = [{"verl": rng.choice(["0.4.1", "0.5.0", "0.6.0"]),
                      "engine": rng.choice([("vllm", "0.8.4"), ("vllm", "0.8.5"), ("sglang", "0.4.6"), ("hf", "")]),
                      "torch": rng.choice(["2.6.0", "2.7.0"]), "cuda": rng.choice(["cu124", "cu126", "cu128"]),
                      "python": rng.choice(["3.11", "3.12"]), "platform": rng.choice(PLATFORMS),
                      "outcome": rng.choice(sorted(OUTCOMES)), "cover": rng.choice(sorted(COVERAGE))}
                     for _ in range(rng.randint(3, 16))]
            _, table = table_of(specs)
            page = tmp_path / f"t{t}.html"
            page.write_text(render_html(table, PUB))
            b.open(page.as_uri())
            b.wait("document.body && document.body.getAttribute('data-ready') === '1'")
            cases = []
            for _ in range(25):
                a = {"level": rng.choice(LEVELS), "gpu": rng.choice(GPUS), "driver": rng.choice(DRIVERS),
                     "platform": rng.choice(PLATFORMS + (None,)), "scopes": rng.choice(RUN_SCOPES)}
                ask_ = Ask(Selectors(platform=a["platform"]), a["level"], a["gpu"], a["driver"],
                           scopes=frozenset(a["scopes"]))
                js_ask = {"level": a["level"], "gpu": a["gpu"], "driver": a["driver"],
                          "scopes": list(a["scopes"])}
                filters = {"platform": a["platform"]} if a["platform"] else {}
                ans = answer(table, ask_)
                cell_want = {f"{eng}|{verl}": [c.best.id if c.best else None, c.shown.id]
                             for (p, eng, verl), c in _cells_any_platform(table, ask_).items()}
                cases.append({"filters": filters, "ask": js_ask, "want": ans.best.id if ans.best else None,
                              "cells": cell_want})
            got = b.eval("(" + json.dumps(cases) + ").map(c => [envbuildQuery.answerFor(c.filters, c.ask), "
                         "Object.fromEntries(Object.keys(c.cells).map(k => [k, envbuildQuery.cellAnswer("
                         "c.filters, k.split('|')[0], k.split('|')[1], c.ask)]))])")
            for case, (sel_answer, cell_answers) in zip(cases, got):
                assert sel_answer == case["want"], case
                assert cell_answers == case["cells"], case
                checked += 1 + len(case["cells"])
    finally:
        b.close()
    assert checked > 300


def _cells_any_platform(table, a: Ask):
    """The grid's cells for an ask: per (engine label, verl), across platforms when none is asked."""
    if a.selectors.platform:
        return {(p, eng, verl): v for (p, eng, verl), v in cells(table, a).items()}
    from envbuild.query import answer_rows

    groups: dict[tuple, list] = {}
    for r in table.rows:
        groups.setdefault((None, _label(r), r.combo.verl), []).append(r)
    return {k: answer_rows(v, a) for k, v in groups.items()}


def test_generated_tables_cover_every_status():
    """The generator is not vacuous: together, its tables hold every row status and answers both
    found and refused."""
    import random

    rng = random.Random(7)
    statuses, found, refused = set(), 0, 0
    for _ in range(40):
        specs = [{k: rng.choice(v) for k, v in {
            "verl": ["0.4.1", "0.5.0"], "engine": [("vllm", "0.8.4"), ("hf", "")], "torch": ["2.6.0"],
            "cuda": ["cu124", "cu126"], "python": ["3.11"], "platform": list(PLATFORMS),
            "outcome": sorted(OUTCOMES), "cover": sorted(COVERAGE)}.items()} for _ in range(6)]
        _, table = table_of(specs)
        statuses |= {r.status for r in table.rows}
        for (_, _, _), a in cells(table, Ask()).items():
            found += a.best is not None
            refused += a.best is None
    assert statuses == {"verified", "broken", "untested", "unpinned"} and found and refused
