"""Matrix loading, validation, expansion and selectors (offline: recorded metadata)."""

import json
import os
import re
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.errors import EnvbuildError, InputError
from envbuild.index import Metadata
from envbuild.matrix import load_matrix
from envbuild.expand import plan
from envbuild.selector import Selectors, selectors_from_args
from envbuild.values import Combo
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
    # the recorded metadata holds every release the matrix names, its includes' too (plan offline)
    m = load_matrix(default_matrix())
    recorded = json.loads((default_matrix().parent / "metadata.json").read_text())["releases"]
    named = {f"{e}=={v}" for e, vs in m.engines.items() for v in vs if v}
    named |= {f"{e}=={inc[e]}" for inc in m.include for e in m.engines if inc.get(e)}
    named |= {f"verl=={inc['verl']}" for inc in m.include}
    assert named <= recorded.keys(), named - recorded.keys()


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
    assert "no cu124 build" in p.stderr
    # Both are facts (no torch build for the variant): naming the versions would not plan them,
    # so the message does not suggest it.
    assert "name its verl and engine versions" not in p.stderr
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


def test_an_include_with_a_reason_is_planned_past_a_rule_and_one_without_is_not(tmp_path):
    base = SMALL + "include:\n"
    # the axes make verl 0.4.1 x vLLM 0.9.1 too, and the rule drops it: a reasoned include decides it
    m = load_matrix(write(tmp_path, base + '  - {verl: "0.4.1", vllm: "0.9.1", cuda: cu126,'
                                             ' reason: "verified on a GPU: see bench"}\n'))
    got = {c.id: c.note for c in plan(m, meta=OFFLINE).combos}
    note = got["verl0.4.1-vllm0.9.1-torch2.7.0-cu126-py3.11"]
    assert note.startswith("included: verified on a GPU") and "too new for old verl" in note
    # a release only an include names is one the matrix declares: selecting it needs no --undeclared
    inc = load_matrix(write(tmp_path, base + '  - {verl: "0.4.1", vllm: "0.8.5.post1", cuda: cu126,'
                                            ' reason: "its own row"}\n'))
    assert {c.engine_version for c in plan(inc, Selectors(engine="vllm", engine_version="0.8.5.post1"),
                                            meta=OFFLINE, undeclared=False).combos} == {"0.8.5.post1"}
    with pytest.raises(EnvbuildError, match="not a release the matrix declares"):
        plan(m, Selectors(engine="vllm", engine_version="0.8.5.post1"), meta=OFFLINE, undeclared=False)
    assert inc.releases("vllm") == ["0.8.4", "0.9.1", "0.8.5.post1"] and m.releases("vllm") == ["0.8.4", "0.9.1"]
    # completion offers what selection accepts
    from envbuild.completion import selector_values
    assert "0.8.5.post1" in selector_values(tmp_path / "m.yaml")["--vllm"]
    # without a reason an include is one more combination for the rules to judge
    m = load_matrix(write(tmp_path, base + '  - {verl: "0.4.1", vllm: "0.9.1", cuda: cu126}\n'))
    p = plan(m, meta=OFFLINE)
    assert "verl0.4.1-vllm0.9.1-torch2.7.0-cu126-py3.11" not in {c.id for c in p.combos}
    assert any(e.combo.id == "verl0.4.1-vllm0.9.1-torch2.7.0-cu126-py3.11" for e in p.excluded)
    # a fact is never overridden: there is no torch 2.7.0 build for cu124
    m = load_matrix(write(tmp_path, base + '  - {verl: "0.4.1", vllm: "0.9.1", cuda: cu124, reason: "x"}\n'))
    assert not [c for c in plan(m, meta=OFFLINE).combos if c.cuda == "cu124" and c.engine_version == "0.9.1"]
    with pytest.raises(EnvbuildError, match=r"include\.0\.reason"):
        load_matrix(write(tmp_path, base + '  - {verl: "0.4.1", vllm: "0.9.1", reason: " "}\n'))


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


# --------------------------------------------------------------------------- hostile input (issue 14)

REAL = default_matrix().read_text()
_HF_INCLUDE = '{verl: "0.4.1", engine: hf, torch: "2.6.0"}'


def _without_include(text):
    return text[:text.index("include:")] + "include: true\n\n" + text[text.index("exclude:"):]


def _alias_bomb(levels):
    rows = ['lol0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    rows += [f"lol{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(rows) + "\n" + REAL


# (name, matrix text, field in the message, why in the message)
HOSTILE = [
    ("alias bomb under an unknown key", _alias_bomb(9), "lol0", "anchors are not allowed"),
    ("alias without anchor", REAL.replace('python: ["3.11"]', "python: *py"), "python", "aliases are not allowed"),
    ("include: true", _without_include(REAL), "include", "expected a list"),
    ("include with an undeclared CUDA variant", REAL.replace(_HF_INCLUDE, _HF_INCLUDE[:-1] + ", cuda: cu999}"),
     "include.0.cuda", "unknown CUDA variant"),
    ("include: an engine without a version", REAL.replace(_HF_INCLUDE, _HF_INCLUDE.replace("hf", "vllm")),
     "include.0.engine", "needs its version"),
    ("merge key", REAL.replace('cu124: {toolkit: "12.4",', 'cu124: {<<: {glibc: "2.35"}, toolkit: "12.4",'),
     "cuda.cu124", "merge keys"),
    ("python object tag", REAL.replace("grace_days: 14", "grace_days: !!python/object/apply:os.system [id]"),
     "grace_days", "tags are not allowed"),
    ("custom tag", REAL.replace("torch: auto", "torch: !auto x"), "torch", "tags are not allowed"),
    ("1,000 nested lists", REAL + "deep: " + "[" * 1000 + "]" * 1000 + "\n", "deep.0.0", "nested deeper"),
    ("5,000-digit integer", REAL.replace("grace_days: 14", "grace_days: 1" + "0" * 5000), "grace_days",
     "number longer"),
    ("hex integer of 20,000 digits", REAL.replace("grace_days: 14", "grace_days: 0x" + "f" * 20000), "grace_days",
     "number longer"),
    ("400-character version", REAL.replace('verl: ["0.4.1",', 'verl: ["0.4.' + "1" * 400 + '",'), "verl.0",
     "longer than"),
    ("100-character version", REAL.replace('verl: ["0.4.1",', 'verl: ["0.4.' + "1" * 100 + '",'), "verl.0",
     "PEP 440"),
    ("version with a trailing newline", REAL.replace('verl: ["0.4.1",', 'verl: ["0.4.1\\n",'), "verl.0",
     "not allowed"),
    ("version with a trailing space", REAL.replace('verl: ["0.4.1",', 'verl: ["0.4.1 ",'), "verl.0", "PEP 440"),
    ("base with a trailing newline", REAL.replace('12.4.1-cudnn-devel-ubuntu22.04"', '12.4.1-cudnn-devel-ubuntu22.04\\n"'),
     "cuda.cu124.base", "not allowed"),
    ("glibc with a trailing newline", REAL.replace('glibc: "2.39"', 'glibc: "2.39\\n"'), "cuda.cu130.glibc",
     "not allowed"),
    ("python with a trailing newline", REAL.replace('python: ["3.11"]', 'python: ["3.11\\n"]'), "python.0",
     "not allowed"),
    ("cuda name in another script's digits", REAL.replace("cu121: {", "cu١٢١: {"), "cuda.cu١٢١", "not allowed"),
    ("timestamp that is no date", REAL.replace("grace_days: 14", "grace_days: 2024-13-45"), "grace_days",
     "cannot read"),
    ("two documents", REAL + "---\nschema: 1\n", "yaml", "single document"),
    ("a list as a key", REAL + "? [a]\n: 1\n", "top", "plain value"),
    ("control character", REAL.replace("grace_days: 14", "grace_days: 1\x074"), "yaml", "not allowed"),
    ("schema: true", REAL.replace("schema: 1", "schema: true"), "schema", "unsupported"),
    ("hf: 1", REAL.replace("hf: true", "hf: 1"), "engines.hf", "no versions"),
    ("axes that expand to 10^7 combinations",
     REAL.replace('verl: ["0.4.1",', "verl: [" + ", ".join(f'"0.{i}.77"' for i in range(1000)) + ', "0.4.1",')
     .replace('vllm: ["0.8.4",', "vllm: [" + ", ".join(f'"1.{i}"' for i in range(2000)) + ', "0.8.4",'),
     "top", "combinations"),
    ("more nodes than a matrix needs", REAL + "x: [" + ", ".join(["1"] * 6000) + "]\n", "x.", "YAML nodes"),
]


@pytest.mark.parametrize("text,field,why", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_matrix_is_one_clean_line(tmp_path, capsys, text, field, why):
    from envbuild.cli import main

    p = write(tmp_path, text)
    assert main(["plan", "--matrix", str(p)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{p}:" in err and f": {field}" in err and why in err, err


def test_latin1_matrix_names_the_line(tmp_path, capsys):
    from envbuild.cli import main

    p = tmp_path / "m.yaml"
    p.write_bytes(REAL.replace("# The default", "# Caf\xe9: the default").encode("latin-1"))
    assert main(["plan", "--matrix", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{p}:1: encoding=" in err and "not UTF-8" in err, err


def test_a_fifo_or_a_huge_file_is_refused_without_reading_it(tmp_path, capsys):
    import os

    from envbuild.cli import main

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: opening it for reading would block forever
    assert main(["plan", "--matrix", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of nothing, never read
    assert main(["plan", "--matrix", str(big)]) == 2
    assert "larger than the limit" in capsys.readouterr().err


def test_alias_bomb_and_deep_nesting_as_a_subprocess_stay_small_and_fast(tmp_path, run_cli):
    """The reported case: 551 bytes that ran past 120 s and 6.4 GB. Under a 1 GiB address-space
    limit and a 60 s timeout it must be refused at once."""
    import resource
    import subprocess
    import sys

    for name, text in (("bomb.yaml", _alias_bomb(9)), ("deep.yaml", "a: " + "[" * 100_000)):
        p = write(tmp_path, text, name)
        r = subprocess.run([sys.executable, "-m", "envbuild", "plan", "--matrix", str(p)], capture_output=True,
                           text=True, timeout=60,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)))
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_yamlsafe_bounds_are_parameters(tmp_path):
    from envbuild import yamlsafe

    assert yamlsafe.load("x.yaml", text="a: {b: [1, 2]}") == ({"a": {"b": [1, 2]}},
                                                               {(): 1, ("a",): 1, ("a", "b"): 1, ("a", "b", 0): 1,
                                                                ("a", "b", 1): 1})
    with pytest.raises(InputError, match="deeper than 2"):
        yamlsafe.load("x.yaml", text="a: {b: [1]}", max_depth=2)
    with pytest.raises(InputError, match="more than 3 YAML nodes"):
        yamlsafe.load("x.yaml", text="[1, 2, 3]", max_nodes=3)
    with pytest.raises(InputError, match="larger than the limit"):
        yamlsafe.load("x.yaml", text="a: 1\n" * 10, max_bytes=20)
    assert yamlsafe.load("x.yaml", text="a: =\nb: '<<'\n")[0] == {"a": "=", "b": "<<"}  # text, not YAML magic
    assert yamlsafe.load("x.yaml", text=b"\xef\xbb\xbfa: 1")[0] == {"a": 1}  # a UTF-8 BOM is fine


# --------------------------------------------------------------------------- index URLs and cache names


@pytest.mark.parametrize("url", ['https://h.example/whl" LABEL x="1', "https://h.example/whl\n", "https://h.example/a b",
                                 "https://h.example/$HOME", "ftp://h.example/whl", "h.example/whl", "https:///whl",
                                 "https://u:p'w@h.example/", "https://[::1/whl"])
def test_pytorch_index_must_be_a_plain_url(monkeypatch, url, capsys):
    from envbuild.index_config import PYTORCH_INDEX_ENV, pytorch_index_root, torch_index_url

    monkeypatch.setenv(PYTORCH_INDEX_ENV, url)
    with pytest.raises(InputError) as ei:
        pytorch_index_root()
    assert PYTORCH_INDEX_ENV in str(ei.value) and "\n" not in str(ei.value)
    assert "p'w" not in str(ei.value)  # a credential is never printed
    with pytest.raises(InputError):
        torch_index_url(url, "cu126")


def test_index_urls_read_from_the_environment_are_checked(monkeypatch):
    from envbuild.index_config import default_index_url, pytorch_index_root

    monkeypatch.setenv("ENVBUILD_PYTORCH_INDEX", "https://user:t%40k@h.example:8443/whl/")
    assert pytorch_index_root() == "https://user:t%40k@h.example:8443/whl"
    default_index_url.cache_clear()
    monkeypatch.setenv("UV_DEFAULT_INDEX", 'http://127.0.0.1:9/simple"')
    try:
        with pytest.raises(InputError, match="UV_DEFAULT_INDEX"):
            default_index_url()
    finally:
        default_index_url.cache_clear()


def test_metadata_cache_names_are_safe_for_any_version(tmp_path, monkeypatch):
    from envbuild.errors import InfraError
    from envbuild.index import Metadata, _cache_name

    monkeypatch.setenv("ENVBUILD_CACHE", str(tmp_path / "cache"))
    assert _cache_name("verl==0.4.1") == "verl==0.4.1.json"
    for hostile in ("verl==" + "1" * 400, "verl==../../x", "verl==0.4.1\n", "verl==a/b"):
        name = _cache_name(hostile)
        assert re.fullmatch(r"sha256-[0-9a-f]{64}\.json", name), name
    meta = Metadata(snapshot=tmp_path / "none.json", online=False)
    with pytest.raises(InfraError, match="metadata-missing"):  # no OSError: file name too long
        meta.get("verl", "0.4." + "1" * 400)
    # a corrupt cache file is read again, never a traceback
    cache = tmp_path / "cache" / "metadata"
    cache.mkdir(parents=True)
    (cache / "verl==0.4.1.json").write_bytes(b"\xff{not json")
    with pytest.raises(InfraError, match="metadata-missing"):
        meta.get("verl", "0.4.1")


def test_a_release_means_its_only_post_release_and_undeclared_versions_are_refused():
    """Issue 26, class 10: `--vllm 0.8.5` plans the matrix's 0.8.5.post1 and says so; a version
    the matrix does not declare is refused with the nearest ones, unless --undeclared."""
    from envbuild.errors import InputError
    from envbuild.selector import release_of

    declared = ["0.8.4", "0.8.5.post1", "0.9.1", "0.10.1.1"]
    assert release_of("0.8.5", declared, "--vllm") == ("0.8.5.post1", "--vllm 0.8.5 means 0.8.5.post1, the matrix's only release of 0.8.5")
    assert release_of("0.8", declared, "--vllm") == ("0.8", None)  # a prefix selects as before
    assert release_of("0.8.4", declared, "--vllm") == ("0.8.4", None)
    with pytest.raises(InputError) as e:
        release_of("0.8.6", declared, "--vllm")
    assert "--vllm='0.8.6'" in str(e.value) and "nearest: 0.8.4, 0.8.5.post1, 0.9.1, 0.10.1.1" in str(e.value)
    assert release_of("0.8.6", declared, "--vllm", undeclared=True)[0] == "0.8.6"
    # two post-releases of one release: no guess
    with pytest.raises(InputError):
        release_of("1.0", ["1.0.post1", "1.0.post2"], "--sglang")


def test_plan_from_the_command_line_maps_and_refuses(run_cli):
    p = run_cli("plan", "--cuda", "cu126", "--vllm", "0.8.5", "--verl", "0.4.1")
    assert p.returncode == 0 and "verl0.4.1-vllm0.8.5.post1-torch2.6.0-cu126-py3.11" in p.stdout
    assert "--vllm 0.8.5 means 0.8.5.post1" in p.stderr
    q = run_cli("plan", "--cuda", "cu126", "--vllm", "0.8.6")
    assert q.returncode == 2 and "nearest: 0.8.4, 0.8.5.post1" in q.stderr and len(q.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("field,dup", [("verl", '["0.4.1", "0.4.1"]'), ("python", '["3.11", "3.11"]'),
                                        ("vllm", '["0.8.4", "0.8.4.0"]')])
def test_a_version_listed_twice_is_refused_with_its_place(tmp_path, field, dup):
    from envbuild.errors import InputError
    from envbuild.matrix import load_matrix
    base = {"verl": '["0.4.1"]', "python": '["3.11"]', "vllm": '["0.8.4"]', field: dup}
    f = tmp_path / "m.yaml"
    f.write_text("cuda:\n  cu124: {toolkit: '12.4', base: 'nvidia/cuda:12.4.1-devel-ubuntu22.04', glibc: '2.35', "
                 "torch: '>=2.4'}\n"
                 f"python: {base['python']}\nengines:\n  vllm: {base['vllm']}\nverl: {base['verl']}\n")
    with pytest.raises(InputError, match="listed twice") as e:
        load_matrix(f)
    assert str(f) in str(e.value)


def test_plan_fits_the_terminal_by_dropping_what_the_id_already_says(run_cli):
    """Issue 50: `plan` on a narrow terminal. The id holds every column, so the others go, right
    to left, until the table fits; a pipe without COLUMNS keeps them all."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    full = run_cli("plan", "--verl", "0.9.1", "--engine", "sglang", env={**env, "COLUMNS": ""})
    assert full.returncode == 0 and full.stdout.splitlines()[0].split()[-1] == "VERL"
    narrow = run_cli("plan", "--verl", "0.9.1", "--engine", "sglang", env={"COLUMNS": "70"})
    lines = narrow.stdout.splitlines()
    assert narrow.returncode == 0 and lines[0].split() == ["ID", "PLATFORM"]
    assert all(len(ln.rstrip()) <= 70 for ln in lines[:-1])  # the summary line is prose
    ids = [ln.split()[0] for ln in full.stdout.splitlines()[1:-1]]
    assert ids == [ln.split()[0] for ln in lines[1:-1]]  # the same rows, nothing lost but columns
