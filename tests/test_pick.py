"""`envbuild pick`: preference, strictness, explanations, and the signature gate."""

import json

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.pick import explain_empty as _explain
from envbuild.pick import pick
from envbuild.query import answer, ask
from envbuild.query import matches as _matches
from envbuild.selector import from_flags
from envbuild.selector import version_matches
from envbuild.probe.hardware import variant_tag
from envbuild.row import Row
from envbuild.sign import write_keypair
from envbuild.fold import fold
from envbuild.table import build_table, publish


def table_of(records):
    return build_table(fold(records))


def explain_empty(t, sel, rejected, level, gpu=None):
    """pick's explanation, asked through the one query (envbuild.query)."""
    a = ask(sel, level, gpu)
    ans = answer(t, a)
    assert [r.id for r in ans.rejected] == [r.id for r in rejected]
    return _explain(t, a, ans)


def matches(row, sel):
    return _matches(row, from_flags(**sel))


V84_041 = combo(verl="0.4.1", ev="0.8.4")
V84_050 = combo(verl="0.5.0", ev="0.8.4")
V84_060 = combo(verl="0.6.0", ev="0.8.4")
V84_0100 = combo(verl="0.10.0", ev="0.8.4")


def test_prefers_highest_level_then_newest_verl():
    t = table_of([
        rec(V84_041, passed("env", "contract", "gpu"), img=image(V84_041), run=1),
        rec(V84_050, passed("env", "contract"), img=image(V84_050), run=2),
        rec(V84_060, passed("env", "contract"), img=image(V84_060), run=3),
    ])
    row, _ = pick(t, {"vllm": "0.8.4"})
    assert row.id == V84_041["id"]  # gpu beats newer verl at contract
    row, _ = pick(t, {"vllm": "0.8.4", "verl": "0.5"})
    assert row.id == V84_050["id"]


def test_newest_verl_compares_versions_not_strings():
    t = table_of([rec(c, passed("env", "contract"), img=image(c), run=i)
                  for i, c in enumerate([V84_060, V84_0100, V84_050])])
    assert pick(t, {"vllm": "0.8.4"})[0].id == V84_0100["id"]


def test_broken_row_is_never_picked_even_with_high_best_level():
    t = table_of([rec(V84_060, {**passed("env", "contract"), "gpu": verdict("fail", "logprob-mismatch")},
                      img=image(V84_060), status="fail", run=1),
                  rec(V84_041, passed("env", "contract"), img=image(V84_041), run=2)])
    assert pick(t, {"vllm": "0.8.4"})[0].id == V84_041["id"]
    row, rejected = pick(t, {"vllm": "0.8.4", "verl": "0.6.0"})
    assert row is None and [r.id for r in rejected] == [V84_060["id"]]
    lines = explain_empty(t, {"vllm": "0.8.4", "verl": "0.6.0"}, rejected, "contract")
    assert "broken at gpu: logprob-mismatch" in "\n".join(lines)


def test_default_level_contract_refuses_env_only_and_explains():
    t = table_of([rec(V84_041, {"env": verdict("pass"), "contract": verdict("needs-gpu", "needs-gpu")},
                      img=image(V84_041), run=1)])
    row, rejected = pick(t, {"vllm": "0.8.4"})
    assert row is None
    text = "\n".join(explain_empty(t, {"vllm": "0.8.4"}, rejected, "contract"))
    assert "verified only up to env" in text and "contract needs-gpu" in text
    assert pick(t, {"vllm": "0.8.4"}, "env")[0].id == V84_041["id"]


def test_unpinned_and_untested_are_never_picked_and_errors_are_not_called_failures():
    a, b = V84_041, V84_050
    t = table_of([rec(a, passed("env", "contract", "gpu"), img=image(a, pushed=False), run=1),
                  rec(b, stage="lock", status="error", cause="index-unreachable", run=2)])
    row, rejected = pick(t, {"vllm": "0.8.4"}, "env")
    # b has only an infrastructure error: not a row of the table (issue 28), so not a candidate
    assert row is None and [r.id for r in rejected] == [a["id"]]
    text = "\n".join(explain_empty(t, {"vllm": "0.8.4"}, rejected, "env"))
    assert "never pushed" in text
    assert "broken" not in text and b["id"] not in text


def test_no_match_lists_what_the_table_has():
    t = table_of([rec(V84_041, passed("env", "contract"), img=image(V84_041), run=1)])
    row, rejected = pick(t, {"vllm": "0.9"})
    text = "\n".join(explain_empty(t, {"vllm": "0.9"}, rejected, "contract"))
    assert row is None and "no combination in the table matches --vllm 0.9" in text and "0.8.4" in text


def test_inconsistent_row_is_refused():
    t = table_of([rec(V84_041, passed("env", "contract"), img=image(V84_041), run=1)])
    r = t.rows[0]
    r.best_level = "gpu"  # claims gpu, but the gpu level never ran
    assert pick(t, {}, "gpu")[0] is None
    r.best_level = "contract"
    r.levels["gpu"].status = "fail"
    row, rejected = pick(t, {})
    assert row is None and "inconsistent" in explain_empty(t, {}, rejected, "contract")[1]
    r.levels["gpu"].status = "not-run"
    r.image.pinned = "repo:latest"  # a tag is not a digest
    assert pick(t, {})[0] is None


def test_long_explanations_are_capped():
    recs = [rec(c, {"env": verdict("fail", "cuda-mismatch")}, img=image(c), run=i)
            for i, c in enumerate(combo(verl=f"0.{i}.0") for i in range(40))]
    t = table_of(recs)
    row, rejected = pick(t, {})
    lines = explain_empty(t, {}, rejected, "contract")
    assert row is None and len(rejected) == 40 and len(lines) == 27 and "15 more" in lines[-1]


def test_gpu_coverage_read_by_the_probe_decides_and_unknown_is_not_yes():
    from envbuild.probe.hardware import parse_gpu

    probe = passed("env", "contract")
    probe["env"]["hardware"] = {"gpu_arch": {"packages": {}, "supports": ["sm_80", "sm_90"],
                                             "lacking": {"sm_100": ["flash_attn"]}}, "min_shm_bytes": 1 << 30}
    probe["env"]["versions"] = {"transformers": "4.51.3", "flash-attn": "2.7.4"}
    t = table_of([rec(V84_041, probe, img=image(V84_041), run=1),
                  rec(V84_050, passed("env", "contract"), img=image(V84_050), run=2)])  # probed before coverage
    row = next(r for r in t.rows if r.id == V84_041["id"])
    assert row.versions["flash-attn"] == "2.7.4" and row.hardware["min_driver"] == "550.54.14"
    got, _ = pick(t, {"vllm": "0.8.4"}, "contract", parse_gpu("H200"))
    assert got.id == V84_041["id"]  # the newer verl has no coverage facts: unknown is not yes
    got, rejected = pick(t, {"vllm": "0.8.4"}, "contract", parse_gpu("B200"))
    text = "\n".join(explain_empty(t, {"vllm": "0.8.4"}, rejected, "contract", "sm_100"))
    assert got is None and "no kernels for sm_100 in flash_attn" in text and "coverage is unknown" in text
    assert pick(t, {"vllm": "0.8.4"})[0].id == V84_050["id"]  # no --gpu: as before


def test_selectors():
    assert variant_tag("cu124") == variant_tag("12.4") == variant_tag("12.4.1") == "cu124"
    assert version_matches("0.8", "0.8.4") and version_matches("0.8.4", "0.8.4")
    assert not version_matches("0.8.4", "0.8.40") and not version_matches("0.8", "0.80.1")
    row = Row.from_dict({"id": "x", "combo": combo(engine="sglang", ev="0.4.6", cuda="12.6", torch="2.7.0")})
    assert matches(row, {"sglang": "0.4", "cuda": "cu126", "torch": "2.7", "python": "3.11"})
    assert not matches(row, {"vllm": "0.4.6"})
    assert not matches(row, {"cuda": "cu124"})


@pytest.fixture
def signed(tmp_path, monkeypatch):
    monkeypatch.delenv("ENVBUILD_PUBKEY", raising=False)
    res = tmp_path / "results"
    write_all(res, [rec(V84_041, passed("env", "contract"), img=image(V84_041), run=1),
                    rec(V84_050, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "x")},
                        img=image(V84_050), status="fail", run=2)])
    priv, pub, _ = write_keypair(tmp_path / "keys")
    publish(res, priv, tmp_path / "table")
    return tmp_path / "table", pub


def test_cli_prints_digest_pinned_reference(signed, run_cli):
    table, pub = signed
    p = run_cli("pick", "--vllm", "0.8.4", "--table", table, "--pubkey", pub)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == image(V84_041)["digest"]


def test_cli_json_has_reference_and_row(signed, run_cli):
    table, pub = signed
    p = run_cli("pick", "--vllm", "0.8.4", "--cuda", "cu124", "--table", table, "--pubkey", pub, "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["ref"] == image(V84_041)["digest"]
    assert out["row"]["id"] == V84_041["id"] and out["verified"] is True and out["level"] == "contract"
    p = run_cli("pick", "--verl", "0.5.0", "--table", table, "--pubkey", pub, "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 1 and out["ref"] is None
    assert out["rejected"][0]["why"].startswith("broken at contract: import-error")


def test_cli_refuses_a_tampered_table_unless_insecure(signed, run_cli):
    table, pub = signed
    path = table / "compat.json"
    t = json.loads(path.read_text())
    for r in t["rows"]:  # the attack: mark the broken row as verified at gpu
        r["status"], r["failure"], r["best_level"] = "verified", None, "gpu"
        for lv in r["levels"].values():
            lv["status"] = "pass"
    path.write_text(json.dumps(t))
    p = run_cli("pick", "--verl", "0.5.0", "--table", table, "--pubkey", pub)
    assert p.returncode == 2 and p.stdout == "" and "tampered" in p.stderr  # a trust failure, not a verdict
    p = run_cli("pick", "--verl", "0.5.0", "--table", table, "--insecure")
    assert p.returncode == 0 and "NOT checked" in p.stderr


def test_cli_default_table_location_trusts_its_key_on_first_use_loudly(signed, run_cli):
    table, _ = signed
    p = run_cli("pick", "--vllm", "0.8.4", cwd=table.parent)
    assert p.returncode == 0 and p.stdout.strip() == image(V84_041)["digest"]
    assert "FIRST USE" in p.stderr and "keyid" in p.stderr
    again = run_cli("pick", "--vllm", "0.8.4", cwd=table.parent)
    assert again.returncode == 0 and "FIRST USE" not in again.stderr


def test_cli_without_a_table_says_what_to_do(tmp_path, run_cli):
    p = run_cli("pick", "--vllm", "0.8.4", cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1
    for hint in ("envbuild publish", "--table URL|PATH", "config.toml", "ENVBUILD_TABLE", "ENVBUILD_PUBKEY"):
        assert hint in p.stderr, hint


def test_configured_table_and_key_make_pick_just_answer(signed, run_cli, tmp_path):
    table, pub = signed
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "config.toml").write_text(f'table = "{table}"\npubkey = "{pub}"\n')
    p = run_cli("pick", "--vllm", "0.8.4", cwd=tmp_path / "keys", env={"ENVBUILD_CONFIG": str(cfg)})
    assert p.returncode == 0 and p.stdout.strip() == image(V84_041)["digest"], p.stderr
    assert "FIRST USE" not in p.stderr  # the configured key, not one found next to the table
    # The environment wins over the file.
    p = run_cli("pick", "--vllm", "0.8.4", cwd=tmp_path / "keys",
                env={"ENVBUILD_CONFIG": str(cfg), "ENVBUILD_TABLE": str(tmp_path / "nowhere")})
    assert p.returncode == 2 and "nowhere" in p.stderr
    # A configured key that did not sign the table is refused (no fallback to pubkey.json).
    _, other, _ = write_keypair(tmp_path / "other")
    (cfg / "config.toml").write_text(f'table = "{table}"\npubkey = "{other}"\n')
    p = run_cli("pick", "--vllm", "0.8.4", env={"ENVBUILD_CONFIG": str(cfg)})
    assert p.returncode == 2 and "not signed by key" in p.stderr


@pytest.mark.parametrize("text, field", [('tabel = "x"\n', "tabel"), ("table = [\n", "config"),
                                         ("fetch_deadline_s = -1\n", "fetch_deadline_s"),
                                         ("pubkey = 3\n", "pubkey")])
def test_bad_config_is_one_line_naming_the_key(tmp_path, run_cli, text, field):
    (tmp_path / "config.toml").write_text(text)
    p = run_cli("pick", "--vllm", "0.8.4", env={"ENVBUILD_CONFIG": str(tmp_path)})
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    assert "config.toml" in p.stderr and field in p.stderr


def test_platform_picks_that_platforms_own_image_and_rows_before_the_axis_are_amd64(signed, run_cli):
    arm = {**V84_041, "id": V84_041["id"] + "-arm64", "platform": "linux/arm64"}
    old = combo(verl="0.5.0", ev="0.8.4")  # recorded before the axis: no platform key
    t = table_of([rec(V84_041 | {"platform": "linux/amd64"}, passed("env", "contract"), img=image(V84_041), run=1),
                  rec(arm, passed("env", "contract"), img=image(arm), run=2),
                  rec(old, passed("env", "contract"), img=image(old), run=3)])
    row, _ = pick(t, {"vllm": "0.8.4", "verl": "0.4.1", "platform": "arm64"})
    assert row.id == arm["id"] and row.pinned.endswith(image(arm)["digest"].split("@")[1])
    row, _ = pick(t, {"vllm": "0.8.4", "verl": "0.4.1", "platform": "linux/amd64"})
    assert row.id == V84_041["id"]
    row, _ = pick(t, {"verl": "0.5.0", "platform": "linux/amd64"})
    assert row.id == old["id"]
    row, rejected = pick(t, {"verl": "0.5.0", "platform": "linux/arm64"})
    assert row is None
    # The CLI defaults to this machine's platform (amd64 here); --platform asks for another.
    table, pub = signed
    p = run_cli("pick", "--vllm", "0.8.4", "--table", table, "--pubkey", pub)
    assert p.returncode == 0 and "@sha256:" in p.stdout, p.stderr
    p = run_cli("pick", "--vllm", "0.8.4", "--platform", "arm64", "--table", table, "--pubkey", pub)
    assert p.returncode == 1 and p.stdout == "" and "linux/arm64" in p.stderr, p.stderr
