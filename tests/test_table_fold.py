"""Folding records into rows: what counts as verified, and what never may."""

from table_fixtures import combo, image, passed, rec, verdict

from envbuild.fold import fold
from envbuild.table import build_table, image_statement
from envbuild.views import render_markdown
from envbuild.fold import fold_combo as fold_row


def fold_combo(records) -> dict:
    """The row as compat.json holds it: the typed Row through its one serialiser."""
    return fold_row(records).to_dict()

C = combo()


def test_pass_is_verified_with_best_level_and_digest():
    img = image(C)
    row = fold_combo([rec(C, passed("env", "contract"), img=img, run=1)])
    assert row["status"] == "verified"
    assert row["best_level"] == "contract"
    assert row["image"]["pinned"] == img["digest"]
    assert row["image"]["digest"] == "sha256:" + img["digest"].split("sha256:")[1]
    assert row["levels"]["gpu"]["status"] == "not-run"
    assert row["failure"] is None


def test_infrastructure_error_after_pass_keeps_the_pass():
    img = image(C)
    rows = [rec(C, passed("env", "contract"), img=img, run=1),
            rec(C, {"env": verdict("error", "daemon-error"), "contract": verdict("error", "daemon-error")},
                img=img, status="error", cause="daemon-error", run=2)]
    row = fold_combo(rows)
    assert row["status"] == "verified" and row["best_level"] == "contract"
    assert row["levels"]["contract"]["run_id"].startswith("20261201T000001")
    assert [h["status"] for h in row["history"]] == ["error", "ok"]  # kept, newest first


def test_needs_gpu_after_pass_keeps_the_pass_and_alone_is_no_verdict():
    img = image(C)
    row = fold_combo([rec(C, passed("env", "contract"), img=img, run=1),
                      rec(C, {"contract": verdict("needs-gpu", "no-driver")}, img=img, run=2)])
    assert row["levels"]["contract"]["status"] == "pass"
    only = fold_combo([rec(C, {"env": verdict("pass"), "contract": verdict("needs-gpu", "no-driver")}, img=img, run=1)])
    assert only["levels"]["contract"]["status"] == "needs-gpu"
    assert only["best_level"] == "env" and only["status"] == "verified"  # env only: pick's default refuses it


def test_fail_after_pass_breaks_the_row():
    img = image(C)
    row = fold_combo([rec(C, passed("env", "contract"), img=img, run=1),
                      rec(C, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named x")},
                          img=img, status="fail", run=2)])
    assert row["status"] == "broken"
    assert row["failure"] == {"level": "contract", "cause": "import-error",
                              "detail": "import verl.workers.rollout: No module named x"}


def test_pass_after_fail_is_verified_again():
    img = image(C)
    row = fold_combo([rec(C, {"env": verdict("fail", "cuda-mismatch")}, img=img, status="fail", run=1),
                      rec(C, passed("env", "contract"), img=img, run=2)])
    assert row["status"] == "verified"


def test_only_only_error_records_are_untested_never_broken():
    row = fold_combo([rec(C, stage="lock", status="error", cause="index-unreachable", run=1),
                      rec(C, {"env": verdict("error", "probe-crashed")}, img=image(C), status="error", run=2)])
    assert row["status"] == "untested"
    assert row["best_level"] is None and row["failure"] is None


def test_unknown_or_malformed_verdict_counts_as_error_not_pass():
    row = fold_combo([rec(C, {"env": {"status": "PASSED"}, "contract": "garbage", "weird": verdict("pass")},
                          img=image(C), run=1)])
    assert row["levels"]["env"]["status"] == "error"
    assert row["levels"]["contract"]["status"] == "error"
    assert "weird" not in row["levels"] and row["status"] == "untested"


def test_a_failed_higher_level_makes_the_row_broken_even_if_lower_levels_pass():
    row = fold_combo([rec(C, {**passed("env", "contract"), "gpu": verdict("fail", "logprob-mismatch")},
                          img=image(C), status="fail", run=1)])
    assert row["status"] == "broken" and row["best_level"] == "contract"
    assert row["failure"]["level"] == "gpu"


def test_timeout_is_not_a_pass():
    row = fold_combo([rec(C, {**passed("env", "contract"), "gpu": verdict("timeout", "timeout")},
                          img=image(C), run=1)])
    assert row["status"] == "broken" and row["failure"]["cause"] == "timeout"


def test_level_order_is_strict_no_skipping_env():
    # The run's own env verdict wins over what its contract verdict implies about env.
    row = fold_combo([rec(C, {"env": verdict("needs-gpu", "needs-gpu"), "contract": verdict("pass")},
                          img=image(C), run=1)])
    assert row["levels"]["env"]["status"] == "needs-gpu"
    assert row["best_level"] is None and row["status"] == "untested"


def _probe_verdict(level, checks):
    """A verdict as envbuild.probe writes it (the real class), for `level` with these checks."""
    from envbuild.probe.verdict import Verdict

    v = Verdict(level=level, engine="vllm")
    for name, status, cause in checks:
        # The probe stamps each check with the level running it (Verdict.at_level); "probe" (the
        # probe itself broke, between levels) has none.
        own = None if name == "probe" else "gpu" if name.startswith("gpu:") else "contract" \
            if name.startswith(("import:", "api:", "native")) or name == "verl-modules" else "env"
        with (v.at_level(own) if own else _nothing()):
            v.add(name, status, f"{name} said {status}", cause)
    return v.to_dict()


def _nothing():
    import contextlib
    return contextlib.nullcontext()


ENV_OK = [("python", "pass", None), ("import-torch", "pass", None), ("torch-cuda", "pass", None),
          ("pip-check", "pass", None)]
CONTRACT_OK = [("import:verl.workers.rollout", "pass", None), ("api:LLM.generate", "pass", None),
               ("native:vllm._C", "pass", None), ("verl-modules", "not-applicable", None)]


def test_real_probe_verdict_at_contract_level_covers_env():
    v = _probe_verdict("contract", ENV_OK + CONTRACT_OK)
    row = fold_combo([rec(C, {"contract": v}, img=image(C), run=1)])
    assert row["best_level"] == "contract" and row["status"] == "verified"
    assert row["levels"]["env"]["status"] == row["levels"]["contract"]["status"] == "pass"


def test_real_contract_failure_is_attributed_to_contract():
    v = _probe_verdict("contract", ENV_OK + [("import:verl.workers.rollout.vllm_rollout", "fail", "import-error")])
    row = fold_combo([rec(C, {"contract": v}, img=image(C), run=1)])
    assert row["levels"]["env"]["status"] == "pass"
    assert row["levels"]["contract"]["status"] == "fail"
    assert row["failure"]["cause"] == "import-error" and "vllm_rollout" in row["failure"]["detail"]
    assert row["status"] == "broken" and row["best_level"] == "env"


def test_real_env_failure_inside_a_contract_verdict_breaks_env():
    v = _probe_verdict("contract", [("torch-cuda", "fail", "cuda-mismatch")] + CONTRACT_OK)
    row = fold_combo([rec(C, {"contract": v}, img=image(C), run=1)])
    assert row["levels"]["env"]["status"] == "fail" and row["failure"]["level"] == "env"
    assert row["best_level"] is None and row["status"] == "broken"


def test_real_needs_gpu_contract_leaves_env_verified_only():
    v = _probe_verdict("contract", ENV_OK + [("import:verl.workers.rollout.vllm_rollout", "needs-gpu", "needs-gpu")])
    row = fold_combo([rec(C, {"contract": v}, img=image(C), run=1)])
    assert row["levels"]["contract"]["status"] == "needs-gpu" and row["best_level"] == "env"
    assert row["failure"] is None


def test_a_check_without_a_level_counts_against_every_level_whatever_its_name():
    """The fold reads the level a check carries, never one guessed from its name (issue 51): a
    failing `gpu:` check that came without one proves nothing about which level failed."""
    v = _probe_verdict("gpu", ENV_OK + CONTRACT_OK + [("gpu:rollout", "fail", "rollout-failed")])
    row = fold_combo([rec(C, {"gpu": v}, img=image(C), run=1)])
    assert row["levels"]["env"]["status"] == "pass" and row["levels"]["gpu"]["status"] == "fail"
    for c in v["checks"]:
        if c["name"] == "gpu:rollout":
            del c["level"]
    row = fold_combo([rec(C, {"gpu": v}, img=image(C), run=1)])
    assert row["levels"]["env"]["status"] == row["levels"]["contract"]["status"] == "fail"
    assert row["best_level"] is None and row["status"] == "broken"


def test_probe_crash_counts_against_every_level_but_is_no_verdict():
    v = _probe_verdict("contract", ENV_OK + [("probe", "error", "probe-error")])
    row = fold_combo([rec(C, {"contract": v}, img=image(C), run=1)])
    assert row["levels"]["env"]["status"] == row["levels"]["contract"]["status"] == "error"
    assert row["status"] == "untested" and row["failure"] is None


def test_gpu_verdict_pass_covers_all_levels_and_timeout_without_checks_covers_none():
    img = image(C)
    row = fold_combo([rec(C, {"gpu": _probe_verdict("gpu", ENV_OK + CONTRACT_OK + [("gpu:logprob-match", "pass", None)])},
                          img=img, run=1, machine={"gpu": "NVIDIA H200"})])
    assert row["best_level"] == "gpu" and row["levels"]["gpu"]["gpu"] == "NVIDIA H200"
    row = fold_combo([rec(C, {"contract": {"status": "timeout", "cause": "timeout", "level": "contract"}},
                          img=img, run=1)])
    assert row["levels"]["env"]["status"] == "timeout" and row["status"] == "broken"


def test_image_without_digest_is_never_verified():
    row = fold_row([rec(C, passed("env", "contract", "gpu"), img=image(C, pushed=False), run=1)])
    assert row.status == "unpinned" and row.image.pinned is None
    assert image_statement(row) is None


def test_built_but_never_probed_is_untested():
    row = fold_combo([rec(C, None, img=image(C), stage="build", run=1)])
    assert row["status"] == "untested" and row["build"]["status"] == "pass"


def test_rebuild_whose_probe_errored_leaves_the_probed_image():
    old, new = image(C, 1), image(C, 2)
    row = fold_combo([rec(C, passed("env", "contract"), img=old, run=1),
                      rec(C, {"env": verdict("error", "daemon-error")}, img=new, status="error", run=2)])
    assert row["image"]["pinned"] == old["digest"] and row["status"] == "verified"
    assert row["history"][0]["image"] == new["digest"]


def test_rebuild_that_fails_replaces_the_verified_image():
    old, new = image(C, 1), image(C, 2)
    row = fold_combo([rec(C, passed("env", "contract"), img=old, run=1),
                      rec(C, {"env": verdict("pass"), "contract": verdict("fail", "undefined-symbol")},
                          img=new, status="fail", run=2)])
    assert row["image"]["pinned"] == new["digest"] and row["status"] == "broken"


def test_a_pass_on_one_image_never_verifies_another():
    old, new = image(C, 1), image(C, 2)
    row = fold_combo([rec(C, passed("env", "contract", "gpu"), img=old, run=1),
                      rec(C, {"env": verdict("pass")}, img=new, run=2)])
    assert row["image"]["pinned"] == new["digest"]
    assert row["best_level"] == "env"  # the new image has only env; old passes do not carry over
    assert row["levels"]["gpu"]["status"] == "not-run"


def test_reprobe_of_a_pushed_image_without_digest_is_the_same_image():
    img = image(C)
    local = {k: v for k, v in img.items() if k != "digest"}  # same local id, not pushed this time
    row = fold_combo([rec(C, passed("env", "contract"), img=img, run=1),
                      rec(C, {"env": verdict("pass"), "gpu": verdict("pass")}, img=local, run=2)])
    assert row["image"]["pinned"] == img["digest"] and row["status"] == "verified"
    row = fold_combo([rec(C, passed("env"), img=local, run=1), rec(C, passed("env", "contract"), img=img, run=2),
                      rec(C, {"env": verdict("pass"), "contract": verdict("fail", "import-error")}, img=local, run=3)])
    assert row["status"] == "broken" and row["image"]["pinned"] == img["digest"]


def test_build_failure_without_image_is_broken_with_cause():
    row = fold_combo([rec(C, stage="lock", status="fail", cause="unsatisfiable", detail="no solution", run=1)])
    assert row["status"] == "broken" and row["image"] is None
    assert row["failure"] == {"level": "build", "cause": "unsatisfiable", "detail": "no solution"}


def test_later_build_failure_keeps_the_working_image_but_says_so():
    img = image(C)
    row = fold_row([rec(C, passed("env", "contract"), img=img, run=1),
                    rec(C, stage="build", status="fail", cause="missing-wheel", run=2)])
    assert row.status == "verified" and row.image.pinned == img["digest"]
    assert row.build.status == "fail" and row.build.stage == "build"
    assert "rebuild fails: missing-wheel" in render_markdown(build_table([row]))


def test_record_order_on_disk_does_not_matter():
    img = image(C)
    a = rec(C, passed("env", "contract"), img=img, run=1)
    b = rec(C, {"env": verdict("pass"), "contract": verdict("fail", "import-error")}, img=img, run=2)
    assert fold_combo([b, a])["status"] == fold_combo([a, b])["status"] == "broken"


def test_records_without_a_combination_are_skipped():
    from envbuild.record import Record
    odd = [Record(combo="x", stage="probe", status="ok"), Record(combo={}, stage="probe", status="ok")]
    assert fold(odd + [rec(C, passed("env"), img=image(C), run=1)])[0].id == C["id"]
    assert len(fold(odd)) == 0


def test_fold_groups_by_combination_and_sorts():
    c2 = combo(verl="0.5.0")
    rows = fold([rec(c2, passed("env"), img=image(c2), run=1), rec(C, passed("env"), img=image(C), run=2)])
    assert [r.id for r in rows] == sorted([C["id"], c2["id"]])
    assert rows[0].combo.verl in ("0.4.1", "0.5.0") and "id" not in rows[0].combo.to_dict()


def test_statement_result_follows_levels():
    img = image(C)
    full = fold_row([rec(C, passed("env", "contract", "gpu"), img=img, run=1)])
    st = image_statement(full)
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    assert st["subject"] == [{"name": "127.0.0.1:5000/envbuild", "digest": {"sha256": img["digest"].split(":")[-1]}}]
    assert st["predicate"]["result"] == "PASSED"
    partial = fold_row([rec(C, passed("env", "contract"), img=img, run=1)])
    assert image_statement(partial)["predicate"]["result"] == "WARNED"
    broken = fold_row([rec(C, {"env": verdict("fail", "cuda-mismatch")}, img=img, run=1)])
    s = image_statement(broken)["predicate"]
    assert s["result"] == "FAILED" and s["failedTests"] == ["envbuild-probe/env"]


def test_a_row_says_how_it_was_made_outside_the_matrix_era_lifts_and_sdists():
    c = {**combo(verl="0.9.1", ev="0.8.4"), "note": "outside the matrix: verl 0.9.1 pins vllm==0.24.0 (verl.yaml:44)"}
    r = rec(c, passed("env", "contract"), img=image(c))
    r.lock_notes = {"relaxed": ["sgl-kernel taken from 2025-07-01: no earlier release on the index satisfies it"],
                    "built_from_source": ["pylatexenc==2.10"]}
    row = fold_row([r])
    assert row.notes[0].startswith("outside the matrix") and "sgl-kernel taken from 2025-07-01" in row.notes[1]
    assert row.notes[2].endswith("pylatexenc==2.10")
    assert type(row).from_dict(row.to_dict()).notes == row.notes  # survives the table's JSON
    assert fold_row([rec(combo(), passed("env"), img=image(combo()))]).notes == []


def test_caveats_reach_the_row_and_are_not_failures():
    c = combo()
    probe = passed("env", "contract")
    probe["contract"]["caveats"] = [{"kind": "needs-network", "check": "import:verl.x", "module": "verl.x",
                                     "what": "fetches https://huggingface.co/gpt2/resolve/main/vocab.json at import"}]
    probe["contract"]["checks"] = [{"name": "import:verl.x", "status": "needs-network", "level": "contract"}]
    row = fold_row([rec(c, probe, img=image(c))])
    assert row.status == "verified"
    assert row.hardware["caveats"][0]["kind"] == "needs-network" and "vocab.json" in row.hardware["caveats"][0]["what"]


def test_a_combination_with_only_infrastructure_errors_is_not_a_row():
    """Issue 28: an index that did not answer on a first try left 'untested' rows in the table."""
    from envbuild.fold import fold
    a, b = combo(verl="0.4.1"), combo(verl="0.5.0")
    rows = fold([rec(a, stage="lock", status="error", cause="index-unreachable", run=1),
                 rec(b, stage="lock", status="error", cause="index-unreachable", run=2),
                 rec(b, passed("env"), img=image(b), run=3)])
    assert [r.id for r in rows] == [b["id"]]


def test_a_probe_only_record_counts_only_for_an_image_a_build_record_of_its_row_made():
    """Issue 49: a GPU runner's record (`ci probe`: it probed an image, built nothing) cannot give
    a row a digest nobody built, nor verify a row whose image it never saw."""
    from envbuild.record import Record

    def gpu_record(c, img, run):  # what probe_run.record_probe writes: the probe's timing only
        r = rec(c, passed("env", "contract", "gpu"), img=img, run=run)
        r.timings = {"probe": 30.0}
        return r

    built = rec(C, passed("env", "contract"), img=image(C), run=1)
    refused: list[str] = []
    (row,) = fold([built, gpu_record(C, image(C), 2)], refused)
    assert row.best_level == "gpu" and row.image.pinned == image(C)["digest"] and not refused
    # the same record naming an image no build of this row made: refused, the row is as built
    other = image(combo(verl="0.5.0"))
    (row,) = fold([built, gpu_record(C, other, 3)], refused)
    assert row.best_level == "contract" and row.image.pinned == image(C)["digest"]
    assert len(refused) == 1 and "which no build record of" in refused[0] and other["digest"].split("@")[1] in refused[0]
    # a probe-only record of a row nothing built makes no row at all
    assert fold([gpu_record(combo(verl="0.6.1"), image(combo(verl="0.6.1")), 4)], refused) == []
    # a pipeline record that found its image built (reused: lock and render, no build) made it too
    reused = Record(combo=C, stage="probe", status="ok", image=image(C), probe=passed("env"),
                    timings={"lock": 1.0, "render": 0.2}, run_id="20261201T000009-abcdef",
                    created="2026-12-01T00:00:09Z")
    (row,) = fold([reused, gpu_record(C, image(C), 10)])
    assert row.best_level == "gpu"
