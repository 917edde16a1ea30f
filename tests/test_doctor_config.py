"""verl config handling for `envbuild doctor`: verl's own composed config, Hydra overrides, OmegaConf
YAML and interpolation, unknown keys refused as verl refuses them."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from envbuild.doctor import FAIL, PASS, WARN, Options, check_config
from envbuild.errors import InputError
from envbuild.matrix import load_matrix
from envbuild.paths import default_matrix
from envbuild import verl_config
from envbuild.verl_config import base_config, build_config, compose_trainer_config, recorded_releases

NEW = "0.9.1"


def cfg_of(*overrides, config=None, verl=NEW):
    return build_config(config, list(overrides), verl=verl)


@pytest.mark.parametrize("text,want", [
    ("4", 4), ("-3", -3), ("0.5", 0.5), ("1e-6", 1e-6), ("-2.5E3", -2500.0),
    ("true", True), ("False", False), ("null", None),
    ("None", "None"),  # Hydra has one null spelling; None is a string there
    ("grpo", "grpo"), ("'~/data/x.parquet'", "~/data/x.parquet"), ("'a,b'", "a,b"), ('"1"', "1"), ("", ""),
    ("[]", []), ("[a,b]", ["a", "b"]), ("[1, 2.5, null, true]", [1, 2.5, None, True]),
    ("{a:1,b:[x,y]}", {"a": 1, "b": ["x", "y"]}), ("/data/train.parquet", "/data/train.parquet"),
])
def test_override_values_follow_hydras_grammar(text, want):
    got = cfg_of(f"+extra.v={text}").get("extra.v")
    assert got == want and type(got) is type(want)


def test_override_inf():
    assert cfg_of("+extra.v=inf").get("extra.v") == math.inf


@pytest.mark.parametrize("bad,why", [
    ("trainer.nnodes=1,2", "sweep"), ("trainer.logger=[a,b", "no viable alternative"),
    ("trainer.nnodes", "missing EQUAL"),
    ("data.train_files=~/x.parquet", "'~' at position 18 is not allowed unquoted"),  # Hydra refuses it too
    ("trainer.logger=" + "[" * 3000 + "]" * 3000, "nested 3000 deep"),
])
def test_bad_override_is_one_input_error(bad, why):
    with pytest.raises(InputError) as e:
        cfg_of(bad)
    assert why in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("command line:")


def test_yaml_file_reads_numbers_as_omegaconf_does_and_overrides_win(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("defaults:\n  - ppo_trainer\n  - _self_\n"
                 "algorithm:\n  adv_estimator: grpo\n"
                 "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-6\n"
                 "  rollout:\n    n: 2\n"
                 "trainer:\n  project_name: proj\n  experiment_name: e1\n  n_gpus_per_node: 4\n"
                 "data:\n  train_batch_szie: 8\n")
    cfg = cfg_of("actor_rollout_ref.rollout.n=5", "trainer.experiment_name=e2",
                 "+ray_kwargs.ray_init.address=127.0.0.1:6379", "~data.val_files",
                 "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4", config=str(f))
    assert cfg.get("actor_rollout_ref.actor.optim.lr") == 1e-6  # YAML 1.2: a float, not the string '1e-6'
    assert cfg.get("algorithm.adv_estimator") == "grpo"
    assert cfg.get("actor_rollout_ref.rollout.n") == 5  # the override wins over the file
    assert cfg.get("actor_rollout_ref.actor.rollout_n") == 5  # verl's own ${oc.select:...rollout.n,1}
    assert cfg.get("actor_rollout_ref.rollout.n_gpus_per_node") == 4
    assert cfg.get("trainer.default_local_dir") == "checkpoints/proj/e2"  # embedded interpolations
    assert cfg.get("data.val_files") is None and "data.val_files" in cfg.deleted
    assert cfg.get("ray_kwargs.ray_init.address") == "127.0.0.1:6379"
    assert cfg.get("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space") == 4
    assert cfg.is_explicit("actor_rollout_ref.rollout.n") and not cfg.is_explicit("algorithm.norm_adv_by_std_in_grpo")
    # a key only in the file: Hydra adds it, verl never reads it -> reported, not refused
    assert [(u.key, u.source, u.suggestion) for u in cfg.unknown] == [
        ("data.train_batch_szie", str(f), "data.train_batch_size")]
    keys = check_config(cfg, Options())[0]
    # verl never reads a key only the file has and runs with its default: FAIL, as for an override
    assert keys.status == FAIL and "data.train_batch_szie (did you mean data.train_batch_size?)" in keys.reason
    types = {r.name: r for r in check_config(cfg, Options())}["config.types"]
    assert types.status == PASS, types.reason


def test_unknown_override_keys_fail_as_verl_refuses_them():
    cfg = cfg_of("actor_rollout_ref.rollout.nn=3", "actor_rollout_ref.actor.use_kl_in_reward=True",
                 "totally.made_up=1", "+my.new_key=1",
                 "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3")
    got = {u.key: u.suggestion for u in cfg.unknown}
    assert got == {"actor_rollout_ref.rollout.nn": "actor_rollout_ref.rollout.n",
                   "actor_rollout_ref.actor.use_kl_in_reward": "algorithm.use_kl_in_reward",
                   "totally.made_up": None,
                   # verl's engine_kwargs.sglang is an empty dict: a new key there needs '+', as in verl's docs
                   "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend":
                       "actor_rollout_ref.rollout.engine_kwargs.sglang"}
    assert cfg.get("my.new_key") == 1  # `+key` adds a key deliberately: not reported
    r = check_config(cfg, Options())[0]
    assert r.status == FAIL and "verl refuses" in r.reason and "\n" not in r.reason


def test_add_of_an_existing_key_and_delete_of_a_missing_one_are_refused():
    cfg = cfg_of("+trainer.nnodes=2", "~trainer.no_such_key")
    assert [x.split(":")[0] for x in cfg.refused] == ["+trainer.nnodes", "~trainer.no_such_key"]
    assert check_config(cfg, Options())[0].status == FAIL
    assert cfg_of("++trainer.nnodes=2").get("trainer.nnodes") == 2  # force-add sets it


def test_keys_follow_the_verl_release():
    assert check_config(cfg_of("ray_init.num_cpus=4", verl="0.4.1"), Options())[0].status == PASS
    r = check_config(cfg_of("ray_init.num_cpus=4", verl=NEW), Options())[0]
    assert r.status == FAIL and "ray_init.num_cpus" in r.reason and f"verl {NEW}" in r.reason
    assert check_config(cfg_of("ray_kwargs.ray_init.num_cpus=4"), Options())[0].status == PASS
    with pytest.raises(InputError, match="no recorded trainer config for this release; recorded: 0.4.1"):
        cfg_of(verl="0.3.0")


def test_oc_env_resolves_with_default_and_fails_without(monkeypatch):
    monkeypatch.delenv("GPU_UTIL", raising=False)
    cfg = cfg_of("actor_rollout_ref.rollout.gpu_memory_utilization=${oc.env:GPU_UTIL,0.5}")
    assert float(cfg.get("actor_rollout_ref.rollout.gpu_memory_utilization")) == 0.5
    assert {r.name: r for r in check_config(cfg, Options())}["config.types"].status == PASS  # not "expects a number"
    monkeypatch.setenv("GPU_UTIL", "0.7")
    assert float(cfg_of("actor_rollout_ref.rollout.gpu_memory_utilization=${oc.env:GPU_UTIL,0.5}")
                 .get("actor_rollout_ref.rollout.gpu_memory_utilization")) == 0.7
    monkeypatch.delenv("HOME")
    with pytest.raises(InputError) as e:
        cfg_of("trainer.default_local_dir=${oc.env:HOME}/x")
    assert "trainer.default_local_dir" in str(e.value) and "HOME" in str(e.value) and "None/x" not in str(e.value)


def test_interpolation_cycles_and_explosions_are_refused_quickly():
    with pytest.raises(InputError, match="interpolation cycle"):
        cfg_of("+a.x=${a.y}", "+a.y=${a.x}")
    with pytest.raises(InputError, match="deeper than"):
        cfg_of(*[f"+c.k{i}=${{c.k{i + 1}}}" for i in range(40)], "+c.k40=end")


def test_every_matrix_release_has_a_recorded_config_composed_by_hydra():
    recorded = recorded_releases()
    assert set(load_matrix(default_matrix()).verl) <= set(recorded)
    for v in recorded:
        rec = json.loads((verl_config.recorded_dir() / f"{v}.json").read_text())
        assert rec["verl"] == v and rec["source"]["wheel"].startswith(f"verl-{v}-") and len(rec["source"]["sha256"]) == 64
        c = rec["configs"]["ppo_trainer"]
        assert c["actor_rollout_ref"]["rollout"]["n"] == 1 and c["algorithm"]["adv_estimator"] == "gae"
        assert isinstance(c["actor_rollout_ref"]["actor"]["optim"]["lr"], float)
        # what --config-name picks in verl's Megatron examples
        assert rec["configs"]["ppo_megatron_trainer"]["actor_rollout_ref"]["actor"]["strategy"] == "megatron"
        # the start-up refusal of verl's synchronous vLLM rollout, read from its code, up to 0.6.1 only
        sync = [r for r in rec["refusals"] if r["selected_by"] == [["vllm", "sync"]]]
        assert bool(sync) == (Version(v) <= Version("0.6.1")), (v, rec["refusals"])
        assert all(r["requires"] == {"enable_chunked_prefill": True} and "max_num_batched_tokens" in r["message"]
                   for r in sync)


def test_installed_verl_is_composed_with_hydra(tmp_path, monkeypatch):
    """A verl installed here wins over the recorded copies; its config is composed with its defaults list."""
    d = tmp_path / "verl" / "trainer" / "config"
    (d / "actor").mkdir(parents=True)
    (d / "actor" / "dp_actor.yaml").write_text("strategy: fsdp\nppo_epochs: 1\n")
    (d / "ppo_trainer.yaml").write_text("defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\n"
                                        "actor_rollout_ref:\n  rollout:\n    n: 1\n    name: vllm\n"
                                        "trainer:\n  nnodes: 1\n")
    monkeypatch.setattr(verl_config, "installed_config_dir", lambda: ("9.9.9", d))
    base, origin, _ = base_config()
    assert origin == "verl 9.9.9, installed"
    assert base == compose_trainer_config(d)
    assert base["actor_rollout_ref"]["actor"] == {"strategy": "fsdp", "ppo_epochs": 1}
    cfg = build_config(None, ["actor_rollout_ref.actor.ppo_epochs=2"])
    assert cfg.get("actor_rollout_ref.actor.ppo_epochs") == 2 and not cfg.unknown
    assert build_config(None, [], verl=NEW).origin == f"verl {NEW}, recorded from its wheel"


def test_bad_yaml_file_names_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("trainer:\n  nnodes: 1\n   n_gpus_per_node: [\n")
    with pytest.raises(InputError) as e:
        cfg_of(config=str(f))
    assert str(e.value).startswith(f"{f}:")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(InputError, match="a verl config is a mapping"):
        cfg_of(config=str(tmp_path / "list.yaml"))
    (tmp_path / "dup.yaml").write_text("trainer:\n  nnodes: 1\n  nnodes: 2\n")
    with pytest.raises(InputError, match="dup.yaml"):
        cfg_of(config=str(tmp_path / "dup.yaml"))
    with pytest.raises(InputError, match="No such file"):
        cfg_of(config=str(tmp_path / "missing.yaml"))


def test_cli_config_file_and_bad_input(tmp_path, run_cli):
    f = tmp_path / "run.yaml"
    f.write_text("algorithm:\n  adv_estimator: grpo\nactor_rollout_ref:\n  rollout:\n    nn: 8\n")
    only_config = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]
    p = run_cli("doctor", "--config", f, *only_config, "--json", "--", "trainer.nnodes=1")
    assert p.returncode == 1, p.stderr
    keys = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "config.keys"][0]
    assert keys["status"] == "fail" and keys["details"]["unknown"] == [
        {"key": "actor_rollout_ref.rollout.nn", "source": str(f), "suggestion": "actor_rollout_ref.rollout.n"}]
    p = run_cli("doctor", *only_config, "--", "actor_rollout_ref.rollout.nn=5")
    assert p.returncode == 1 and "FAIL  config.keys" in p.stdout and "did you mean actor_rollout_ref.rollout.n?" in p.stdout
    p = run_cli("doctor", "--", "data.train_batch_size=1,2")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == ("envbuild doctor: command line: data.train_batch_size='1,2': comma-separated values "
                                "are a Hydra sweep; write a list as [a,b] or quote the string")
    p = run_cli("doctor", "--config", tmp_path / "nope.yaml")
    assert p.returncode == 2 and "nope.yaml" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.network
def test_recorded_config_is_what_the_released_wheel_composes_to():
    """ci/record_verl_config.py --check downloads the wheel again and composes it: no hand edits."""
    script = Path(__file__).resolve().parent.parent / "ci" / "record_verl_config.py"
    p = subprocess.run([sys.executable, str(script), "--check", "0.4.1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "0.4.1: ok" in p.stdout, p.stdout + p.stderr[-2000:]


def test_missing_values_are_present_but_unset(run_cli):
    """Issue 26, class 9: verl 0.6.0-0.9.1 hold actor_rollout_ref.rollout.name as MISSING (???). It
    is a key verl knows (no "unknown key, did you mean itself"); left unset, doctor fails with the
    fix instead of printing ???; reward.reward_model.rollout.name is not needed while the reward
    model is off."""
    for verl in ("0.6.0", "0.9.1"):
        cfg = cfg_of("actor_rollout_ref.rollout.name=vllm", verl=verl)
        assert cfg.unknown == [] and cfg.unset() == []
        r = {x.name: x for x in check_config(cfg, Options())}
        assert r["config.keys"].status == PASS and r["config.unset"].status == PASS
        bare = {x.name: x for x in check_config(cfg_of(verl=verl), Options())}["config.unset"]
        assert bare.status == FAIL and bare.details["unset"] == ["actor_rollout_ref.rollout.name"]
        # the names that release's rollout registry holds (no hf from 0.6 on)
        assert bare.fix == "set actor_rollout_ref.rollout.name=" + {"0.6.0": "sglang|vllm", "0.9.1": "sglang|trtllm|vllm"}[verl]
    on = cfg_of("actor_rollout_ref.rollout.name=vllm", "reward.reward_model.enable=True", verl="0.9.1")
    assert on.unset() == ["reward.reward_model.rollout.name"]
    only_config = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]
    p = run_cli("doctor", "--verl", "0.9.1", *only_config)
    assert p.returncode == 1 and "FAIL  config.unset" in p.stdout and "???" not in p.stdout, p.stdout


SCRIPT = """#!/usr/bin/env bash
set -x
train_prompt_bsz=4 # 2n >= 4
train_prompt_mini_bsz=$((train_prompt_bsz / 2)) # n
n_resp_per_prompt=4
NGPUS=${NGPUS:-2}
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files="${HOME}"/data/gsm8k/train.parquet \\
    data.train_batch_size=${train_prompt_bsz} \\
    actor_rollout_ref.actor.ppo_mini_batch_size=$train_prompt_mini_bsz \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.rollout.n=${n_resp_per_prompt} \\
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa \\
    trainer.n_gpus_per_node=$NGPUS $@
"""


def test_a_launch_scripts_main_ppo_overrides_are_read_with_its_own_variables(tmp_path):
    """Issue 50: doctor could not be handed verl's own launch script. Its assignments and integer
    arithmetic are expanded; a value from the environment is left out and named, never guessed."""
    from envbuild.runscope import script_overrides
    f = tmp_path / "run_grpo.sh"
    f.write_text(SCRIPT)
    got, left = script_overrides(str(f))
    assert got == ["algorithm.adv_estimator=grpo", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                   "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=4", "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                   "trainer.n_gpus_per_node=2"]
    assert left == ["data.train_files"]


def test_doctor_takes_a_launch_script_and_judges_only_what_it_can_read(tmp_path, run_cli):
    f = tmp_path / "run_grpo.sh"
    f.write_text(SCRIPT)
    p = run_cli("doctor", "--skip", "env", "--skip", "ray", "--json", f, "--", "actor_rollout_ref.rollout.name=vllm",
                cwd=tmp_path)
    out = json.loads(p.stdout)
    checks = {c["name"]: c for c in out["checks"]}
    assert checks["config.script"]["status"] == "skip" and "data.train_files" in checks["config.script"]["reason"]
    assert checks["data.train_files"]["status"] == "skip" and "environment" in checks["data.train_files"]["reason"]
    assert out["config"]["actor_rollout_ref.actor.ppo_mini_batch_size"] == 2  # from $((4 / 2))
    assert out["config"]["actor_rollout_ref.rollout.name"] == "vllm"  # the command line's own, after the script's
    assert checks["config.unset"]["status"] == PASS and checks["config.batches"]["status"] == PASS
    # --config names a script the same way; a file without verl's command is one line, exit 2
    q = run_cli("doctor", "--config", f, "--skip", "env", "--skip", "ray", "--json", cwd=tmp_path)
    assert json.loads(q.stdout)["config"]["data.train_batch_size"] == 4
    (tmp_path / "other.sh").write_text("echo hello\n")
    r = run_cli("doctor", "--skip", "env", "--skip", "ray", tmp_path / "other.sh", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "main_ppo" in r.stderr, r.stderr
