"""Matrix loading, validation, expansion and selectors (offline: recorded metadata)."""

import json
import re
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.errors import EnvbuildError, InputError
from envbuild.index import Metadata
from envbuild.matrix import Combo, Selectors, load_matrix, plan, selectors_from_args
from envbuild.paths import default_matrix

OFFLINE = Metadata(online=False)

SMALL = """\
schema: 1
python: ["3.11"]
cuda:
  cu124: {toolkit: "12.4", base: "nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04", glibc: "2.35", torch: ">=2.4,<2.7"}
  cu126: {toolkit: "12.6", base: "nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04", glibc: "2.35", torch: ">=2.6"}
engines:
  vllm: ["0.8.4", "0.9.1"]
verl: ["0.4.1", "0.6.0"]
exclude:
  - {verl: "<0.6", vllm: ">0.8.5", reason: "too new for old verl"}
"""


def write(tmp_path, text, name="m.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_default_matrix_covers_the_landscape():
    pl = plan(load_matrix(default_matrix()), meta=OFFLINE)
    ids = [c.id for c in pl.combos]
    assert len(ids) == len(set(ids)) and len(ids) > 40
    verls = {c.verl for c in pl.combos}
    assert {"0.4.1", "0.9.1"} <= verls
    assert {c.engine for c in pl.combos} == {"vllm", "sglang", "hf"}
    # the README's headline example and the one the default index can serve
    assert "verl0.4.1-vllm0.8.4-torch2.6.0-cu126-py3.11" in ids
    assert "verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11" in ids
    # every exclusion says why
    assert pl.excluded and all(e.reason.strip() for e in pl.excluded)


def test_torch_comes_from_the_engine_pin_not_from_the_yaml():
    pl = plan(load_matrix(default_matrix()), Selectors(cuda="cu124", engine="vllm", engine_version="0.8.4"), meta=OFFLINE)
    assert pl.combos and {c.torch for c in pl.combos} == {"2.6.0"}

    class Fake(Metadata):
        def torch_pin(self, engine, version):
            return "2.6.1" if version == "0.8.4" else super().torch_pin(engine, version)

        def requires_python(self, name, version):
            return "" if name == "torch" else super().requires_python(name, version)

    pl = plan(load_matrix(default_matrix()), Selectors(cuda="cu124", engine="vllm", engine_version="0.8.4"), meta=Fake(online=False))
    assert {c.torch for c in pl.combos} == {"2.6.1"}


def test_plan_json_has_the_documented_fields(run_cli):
    p = run_cli("plan", "--cuda", "cu124", "--vllm", "0.8.4", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows and all(r["torch"] == "2.6.0" and r["cuda"] == "cu124" for r in rows)
    for k in ("id", "cuda", "python", "torch", "engine", "engine_version", "verl", "tag"):
        assert all(k in r for r in rows)


def test_tag_format():
    c = Combo(verl="0.4.1", engine="vllm", engine_version="0.8.4", torch="2.6.0", cuda="cu124", python="3.11")
    assert c.tag == "verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11"
    assert c.hashed_tag("ab" * 32) == c.tag + "-" + "ab" * 6
    h = Combo(verl="0.9.1", engine="hf", engine_version="", torch="2.11.0", cuda="cu130", python="3.11")
    assert h.tag == "verl0.9.1-hf-torch2.11.0-cu130-py3.11"
    assert re.fullmatch(r"[\w][\w.-]{0,127}", c.tag)


def test_excluded_with_reason_and_line(tmp_path):
    pl = plan(load_matrix(write(tmp_path, SMALL)), meta=OFFLINE)
    ex = {e.combo.id: e.reason for e in pl.excluded}
    assert "too new for old verl (m.yaml:10)" in ex["verl0.4.1-vllm0.9.1-torch2.7.0-cu126-py3.11"]
    # a fact from metadata, not a rule: torch 2.7.0 has no cu124 build
    assert "no cu124 build" in ex["verl0.6.0-vllm0.9.1-torch2.7.0-cu124-py3.11"]
    assert [c.id for c in pl.combos] == [
        "verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11", "verl0.4.1-vllm0.8.4-torch2.6.0-cu126-py3.11",
        "verl0.6.0-vllm0.8.4-torch2.6.0-cu124-py3.11", "verl0.6.0-vllm0.8.4-torch2.6.0-cu126-py3.11",
        "verl0.6.0-vllm0.9.1-torch2.7.0-cu126-py3.11"]


def test_selectors_narrow_and_empty_selection_fails(tmp_path, run_cli):
    m = load_matrix(write(tmp_path, SMALL))
    assert {c.verl for c in plan(m, Selectors(verl="0.6.0"), meta=OFFLINE).combos} == {"0.6.0"}
    # nothing left, and not asked for by name: exit 2, naming the rule and how to ask anyway
    p = run_cli("plan", "--matrix", tmp_path / "m.yaml", "--vllm", "0.9.1", "--cuda", "cu124")
    assert p.returncode == 2, p.stderr
    assert "too new for old verl" in p.stderr or "no cu124 build" in p.stderr
    assert "name its verl and engine versions" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_an_excluded_pair_asked_for_by_name_is_planned_with_the_rule_as_a_note(tmp_path, run_cli):
    p = write(tmp_path, SMALL)
    p = run_cli("plan", "--matrix", tmp_path / "m.yaml", "--vllm", "0.9.1",
                "--verl", "0.4.1", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["id"] for r in rows] == ["verl0.4.1-vllm0.9.1-torch2.7.0-cu126-py3.11"]
    assert "too new for old verl" in rows[0]["note"] and rows[0]["note"].startswith("outside the matrix")
    assert "excluded by a matrix rule" in p.stderr
    # a fact (no torch 2.7.0 build for cu124) is never overridden
    p = run_cli("plan", "--matrix", tmp_path / "m.yaml", "--vllm", "0.9.1", "--verl", "0.4.1", "--cuda", "cu124")
    assert p.returncode == 2 and "no cu124 build" in p.stderr


def test_one_selector_grammar_cuda_spellings_and_version_prefixes(tmp_path):
    from envbuild.selector import version_matches

    m = load_matrix(write(tmp_path, SMALL))
    by_cu = plan(m, selectors_from_args(SimpleNamespace(cuda="12.6")), meta=OFFLINE).combos
    assert by_cu and {c.cuda for c in by_cu} == {"cu126"}
    assert by_cu == plan(m, selectors_from_args(SimpleNamespace(cuda="cu126")), meta=OFFLINE).combos
    prefix = plan(m, selectors_from_args(SimpleNamespace(vllm="0.8")), meta=OFFLINE).combos
    assert {c.engine_version for c in prefix} == {"0.8.4"}
    assert selectors_from_args(SimpleNamespace(engine="vllm", vllm="0.8.4")).engine_version == "0.8.4"
    with pytest.raises(InputError):
        selectors_from_args(SimpleNamespace(engine="sglang", vllm="0.8.4"))
    with pytest.raises(InputError):
        selectors_from_args(SimpleNamespace(cuda="12"))
    assert version_matches("0.8", "0.8.5.post1") and version_matches("2.6", "2.6.0")
    assert not version_matches("0.8.5", "0.8.5.post1") and not version_matches("0.8", "0.9.1")


def test_explicit_torch_overrides_the_pin_so_lock_can_judge_it(tmp_path):
    pl = plan(load_matrix(write(tmp_path, SMALL)), Selectors(engine="vllm", engine_version="0.8.4", torch="2.7.0", cuda="cu126"),
              meta=OFFLINE)
    assert [c.torch for c in pl.combos] == ["2.7.0", "2.7.0"]


BAD = [
    ("python: [3.11\n", "yaml", "malformed YAML"),
    (SMALL + "colour: red\n", "colour", "unknown key"),
    (SMALL.replace('["0.4.1", "0.6.0"]', '["0.4.1", "banana"]'), "verl.1", "PEP 440"),
    (SMALL.replace('["0.4.1", "0.6.0"]', '["0.4.1", 0.10]'), "verl.1", "quote it"),
    (SMALL.replace("cu126:", "cuda126:"), "cuda.cuda126", "cuNNN"),
    (SMALL.replace('"0.9.1"]', '"0.9.1; rm -rf /"]'), "engines.vllm.1", "not allowed"),
    (SMALL.replace('reason: "too new for old verl"', 'reason: ""'), "exclude.0.reason", "reason"),
    (SMALL.replace('glibc: "2.35", torch: ">=2.6"', 'glibc: "2.35", torch: ">=2.6", extra: 1'), "cuda.cu126.extra",
     "unknown key"),
]


@pytest.mark.parametrize("text,field,why", BAD)
def test_bad_input_one_clear_line(tmp_path, text, field, why):
    with pytest.raises(InputError) as ei:
        load_matrix(write(tmp_path, text))
    msg = str(ei.value)
    assert "\n" not in msg and str(tmp_path / "m.yaml") in msg and field in msg and why in msg
    assert re.search(r"m\.yaml:\d+:", msg), msg


def test_bad_input_through_the_cli_has_no_traceback(tmp_path, run_cli):
    p = run_cli("plan", "--matrix", write(tmp_path, BAD[2][0]))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "verl.1" in p.stderr
    p = run_cli("plan", "--vllm", "0.8.4$(id)")
    assert p.returncode == 2 and "--vllm" in p.stderr and "Traceback" not in p.stderr


_fuzz_value = st.one_of(st.text(max_size=12), st.integers(), st.floats(allow_nan=False), st.none(), st.booleans(),
                        st.lists(st.text(max_size=5), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["verl", "engines.vllm", "cuda.cu124.toolkit", "cuda.cu124.base", "python",
                              "exclude.0.verl", "exclude.0.reason", "image", "grace_days", "cuda.cu124.torch"]),
       value=_fuzz_value)
def test_fuzzed_values_give_clean_errors_only(tmp_path, field, value):
    import yaml

    data = yaml.safe_load(SMALL)
    node = data
    keys = field.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    node[keys[-1]] = value
    p = tmp_path / "fuzz.yaml"
    p.write_text(yaml.safe_dump(data))
    try:
        m = load_matrix(p)
        plan(m, meta=OFFLINE)
    except InputError as e:
        assert "\n" not in str(e) and "fuzz.yaml" in str(e)
    except EnvbuildError:
        pass  # e.g. a fuzzed version that is not on the index: still a clean, expected error
