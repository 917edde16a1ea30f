"""The contract level judged in a process of its own beside the gpu level (the gpu level's CPU
rehearsal here): the verdict, its order and its level files are those of the levels run one after
another, read ahead or not, the model's modules imported ahead or not; a failed contract level with --stop-at-failure leaves no gpu level; a
contract process that dies is an error; a hang in it is killed with the probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_probe_timeout import _gone, killed_in_verl_import

from envbuild.probe.vocab import LEVELS
from envbuild.probe_exec import probe_here

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _probe(tmp_path, side: str, *extra: str, site=None, prefetch: str | None = None,
           warm: str | None = None) -> tuple[dict, dict]:
    tag = side + (f"-{warm}" if warm else "")
    out, levels = tmp_path / f"{tag}.json", tmp_path / f"levels-{tag}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (site,) if p)}
    for k in ("ENVBUILD_PROBE_SIDE_BY_SIDE", "ENVBUILD_PROBE_PREFETCH", "ENVBUILD_PROBE_WARM_IMPORT"):
        env.pop(k, None)
    if prefetch:
        env["ENVBUILD_PROBE_PREFETCH"] = prefetch
    if warm:
        env["ENVBUILD_PROBE_WARM_IMPORT"] = warm
    p = subprocess.run([sys.executable, "-m", "envbuild.probe", "--level", "gpu", "--engine", "hf", "--side-by-side",
                        side, "--json", str(out), "--levels-dir", str(levels), *extra],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.exists(), p.stderr
    return json.loads(out.read_text()), {f.stem: json.loads(f.read_text()) for f in levels.glob("*.json")}


def _checks(d: dict) -> list[tuple]:
    return [(c["name"], c["status"], c["level"], c["cause"]) for c in d["checks"]]


def _fake_verl(root, broken: str) -> object:
    site = root / "site"
    (site / "verl" / "workers" / "rollout").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text('__version__ = "0.9.1"\n')
    (site / "verl" / "workers" / "__init__.py").write_text("")
    (site / "verl" / "workers" / "rollout" / "__init__.py").write_text("")
    (site / "verl" / "workers" / "rollout" / "base.py").write_text(broken)
    return site


def test_side_by_side_gives_the_verdict_of_levels_in_a_row(tmp_path):
    # The read-ahead (probe/prefetch.py) changes no verdict either: one side reads ahead; nor do
    # the model's modules imported behind CUDA in its thread (probe/warmup.py, after) rather than
    # beside it (the default).
    one, lv_one = _probe(tmp_path, "no", prefetch="no")
    two, lv_two = _probe(tmp_path, "yes", prefetch="yes")
    three, lv_three = _probe(tmp_path, "yes", warm="after")
    assert three["status"] == "pass" and _checks(three) == _checks(two) and sorted(lv_three) == sorted(lv_two)
    assert "warm_import" in three["timings"]
    assert one["status"] == two["status"] == "pass"
    assert _checks(one) == _checks(two) and len(_checks(two)) > 20
    assert [c[2] for c in _checks(two)] == sorted((c[2] for c in _checks(two)), key=LEVELS.index)
    assert sorted(lv_one) == sorted(lv_two) == ["contract", "env", "gpu"]
    for lv in lv_one:
        assert _checks(lv_one[lv]) == _checks(lv_two[lv]) and lv_two[lv]["level"] == lv
    for k in ("versions", "hardware", "gpu", "caveats"):
        assert one[k] == two[k], k
    assert one["metrics"]["native_extensions"] == two["metrics"]["native_extensions"]
    assert "contract_wait" in two["timings"] and "contract_process" in two["timings"]
    assert "contract_wait" not in one["timings"]
    assert "contract" in one["timings"] and "contract" in two["timings"]
    assert "prefetch" in two["timings"] and "prefetch" not in one["timings"]
    # The tiny model's modules are imported ahead only beside a contract level in another process
    # (probe/warmup.py): the serial side imports them in its own contract level.
    assert "warm_import" in two["timings"] and "warm_import" not in one["timings"]


def test_a_failed_contract_level_beside_the_gpu_level_stops_it(tmp_path):
    site = _fake_verl(tmp_path, "from transformers import NoSuchThingXyz\n")
    one, lv_one = _probe(tmp_path, "no", "--stop-at-failure", site=site)
    two, lv_two = _probe(tmp_path, "yes", "--stop-at-failure", site=site)
    assert one["status"] == two["status"] == "fail" and one["cause"] == two["cause"]
    assert _checks(one) == _checks(two)
    assert not any(c[2] == "gpu" for c in _checks(two)) and sorted(lv_two) == ["contract", "env"]
    # Without --stop-at-failure the gpu level's checks follow, as they would one after another.
    three, lv_three = _probe(tmp_path, "yes", site=site)
    assert any(c[2] == "gpu" for c in _checks(three)) and sorted(lv_three) == ["contract", "env", "gpu"]
    assert three["status"] == "fail"


def test_a_contract_process_that_dies_is_an_error_not_a_pass(tmp_path):
    site = tmp_path / "site"
    (site / "verl").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text("import os\nos._exit(9)\n")
    two, levels = _probe(tmp_path, "yes", site=site)
    assert two["status"] == "error"
    died = [c for c in two["checks"] if c["name"] == "contract-process"]
    assert died and died[0]["level"] == "contract" and "exit 9" in died[0]["detail"]
    assert levels["contract"]["status"] == "error"


@pytest.mark.slow
def test_a_hang_in_the_contract_process_is_killed_with_the_probe(tmp_path):
    pidfile, took = killed_in_verl_import(tmp_path, 15, "gpu", {"ENVBUILD_PROBE_SIDE_BY_SIDE": "yes"})
    assert all(t < limit + 60 for t, limit in zip(took, (15, 30, 60, 120)))
    assert _gone(int(pidfile.read_text()))


def test_the_default_is_the_engine_s_and_the_flag_or_variable_overrides_it(monkeypatch):
    from envbuild.probe.cli import build_parser, side_by_side
    from envbuild.probe.vocab import ENGINE, ENGINES

    monkeypatch.delenv("ENVBUILD_PROBE_SIDE_BY_SIDE", raising=False)
    for e in ENGINES:
        assert side_by_side(build_parser().parse_args(["--engine", e])) == ENGINE[e].side_by_side
    # as measured on GPU nodes (bench/probe_sidebyside_vllm_h200.json, bench/probe_modes_h100.json)
    assert ENGINE["vllm"].side_by_side == ENGINE["hf"].side_by_side == "auto"
    monkeypatch.setenv("ENVBUILD_PROBE_SIDE_BY_SIDE", "no")
    assert side_by_side(build_parser().parse_args(["--engine", "vllm"])) == "no"
    assert side_by_side(build_parser().parse_args(["--engine", "vllm", "--side-by-side", "yes"])) == "yes"
