"""verl config handling for `envbuild doctor`: Hydra-style values, merging, unknown keys, interpolation."""

import json
import math

import pytest

from envbuild.errors import InputError
from envbuild.verl_config import KNOWN, apply_override, build_config, is_known, parse_value, suggest


@pytest.mark.parametrize("text,want", [
    ("4", 4), ("-3", -3), ("1_000", 1000), ("0.5", 0.5), ("1e-6", 1e-6), ("-2.5E3", -2500.0), (".5", 0.5),
    ("true", True), ("False", False), ("TRUE", True), ("null", None), ("NULL", None),
    ("None", "None"),  # Hydra has one null spelling; None is a string there too
    ("grpo", "grpo"), ("low_var_kl", "low_var_kl"), ("~/data/x.parquet", "~/data/x.parquet"),
    ("'a,b'", "a,b"), ('"1"', "1"), ("", ""),
    ("[]", []), ("[a,b]", ["a", "b"]), ("[1, 2.5, null, true]", [1, 2.5, None, True]),
    ("[[1,2],[3]]", [[1, 2], [3]]), ("{a:1,b:[x,y]}", {"a": 1, "b": ["x", "y"]}), ("{}", {}),
    ("/data/train.parquet", "/data/train.parquet"), ("hdfs://x/y", "hdfs://x/y"),
])
def test_parse_value_like_hydra(text, want):
    got = parse_value(text)
    assert got == want and type(got) is type(want)


def test_parse_value_inf_nan():
    assert parse_value("inf") == math.inf and math.isnan(parse_value("nan"))


@pytest.mark.parametrize("bad,why", [
    ("1,2", "sweep"), ("[a,b", "unterminated list"), ("{a:1", "unterminated dict"), ("'abc", "unterminated quote"),
    ("{a}", "without ':'"),
])
def test_parse_value_rejects_with_one_line(bad, why):
    with pytest.raises(InputError) as e:
        parse_value(bad)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_overrides_merge_over_file_and_defaults(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("defaults:\n  - ppo_trainer\n"
                 "algorithm:\n  adv_estimator: grpo\n"
                 "actor_rollout_ref:\n  rollout:\n    n: 2\n    engine_kwargs:\n      vllm: {swap_space: 4}\n"
                 "trainer:\n  project_name: proj\n  experiment_name: e1\n  n_gpus_per_node: 4\n"
                 "data:\n  train_batch_szie: 8\n")
    cfg = build_config(str(f), ["actor_rollout_ref.rollout.n=5", "trainer.experiment_name=e2",
                                "+ray_kwargs.ray_init.address=127.0.0.1:6379", "~data.val_files"])
    assert cfg.get("algorithm.adv_estimator") == "grpo"  # from the file
    assert cfg.get("actor_rollout_ref.rollout.n") == 5  # the override wins over the file
    assert cfg.get("actor_rollout_ref.actor.rollout_n") == 5  # ${oc.select:actor_rollout_ref.rollout.n,1}
    assert cfg.get("actor_rollout_ref.rollout.n_gpus_per_node") == 4  # ${oc.select:trainer.n_gpus_per_node,8}
    assert cfg.get("trainer.default_local_dir") == "checkpoints/proj/e2"  # embedded interpolations
    assert cfg.get("data.max_prompt_length") == 512  # untouched default
    assert cfg.get("data.val_files") is None and "data.val_files" in cfg.deleted
    assert cfg.get("ray_kwargs.ray_init.address") == "127.0.0.1:6379"
    assert cfg.get("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space") == 4  # open subtree kept whole
    assert cfg.is_explicit("actor_rollout_ref.rollout.n") and not cfg.is_explicit("algorithm.norm_adv_by_std_in_grpo")
    assert [(u.key, u.source, u.suggestion) for u in cfg.unknown] == [
        ("data.train_batch_szie", str(f), "data.train_batch_size")]


def test_unknown_override_keys_are_reported_with_a_suggestion():
    cfg = build_config(None, ["actor_rollout_ref.rollout.nn=3", "actor_rollout_ref.actor.use_kl_in_reward=True",
                              "totally.made_up=1", "+my.new_key=1",
                              "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
                              "actor_rollout_ref.model.override_config.attention_dropout=0.0",
                              "actor_rollout_ref.actor.fsdp_config._target_=x"])
    got = {u.key: u.suggestion for u in cfg.unknown}
    assert got == {"actor_rollout_ref.rollout.nn": "actor_rollout_ref.rollout.n",
                   "actor_rollout_ref.actor.use_kl_in_reward": "algorithm.use_kl_in_reward",
                   "totally.made_up": None}
    assert cfg.get("my.new_key") == 1  # `+key` adds a key deliberately: not reported


def test_known_table_covers_the_keys_the_checks_read():
    for key in ("algorithm.adv_estimator", "actor_rollout_ref.rollout.n", "actor_rollout_ref.actor.use_kl_loss",
                "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type",
                "algorithm.norm_adv_by_std_in_grpo", "algorithm.use_kl_in_reward", "data.train_files",
                "data.prompt_key", "trainer.default_local_dir", "trainer.nnodes", "trainer.n_gpus_per_node",
                "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.ref.fsdp_config.param_offload",
                "ray_init.num_cpus", "ray_kwargs.ray_init.num_cpus"):
        assert key in KNOWN, key
    assert KNOWN["actor_rollout_ref.rollout.n"] == 1 and KNOWN["algorithm.adv_estimator"] == "gae"
    assert is_known("data.custom_cls")  # a whole known subtree
    assert suggest("trainer.n_gpu_per_node") == "trainer.n_gpus_per_node"


def test_bad_override_syntax_names_the_argument():
    cfg = build_config(None, [])
    with pytest.raises(InputError, match="command line: override=.trainer.nnodes.: expected key=value"):
        apply_override(cfg, "trainer.nnodes")
    with pytest.raises(InputError, match="not a dotted config key"):
        apply_override(cfg, "a..b=1")


def test_bad_yaml_file_names_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("trainer:\n  nnodes: 1\n   n_gpus_per_node: [\n")
    with pytest.raises(InputError) as e:
        build_config(str(f), [])
    assert str(f) in str(e.value) and ":" in str(e.value)
    with pytest.raises(InputError, match="a verl config is a mapping"):
        (tmp_path / "list.yaml").write_text("- a\n- b\n")
        build_config(str(tmp_path / "list.yaml"), [])
    with pytest.raises(InputError, match="No such file"):
        build_config(str(tmp_path / "missing.yaml"), [])


def test_cli_config_file_and_bad_input(tmp_path, run_cli):
    f = tmp_path / "run.yaml"
    f.write_text("algorithm:\n  adv_estimator: grpo\nactor_rollout_ref:\n  rollout:\n    nn: 8\n")
    only_config = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]
    p = run_cli("doctor", "--config", f, *only_config, "--json", "--", "trainer.nnodes=1")
    assert p.returncode == 0, p.stderr
    keys = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "config.keys"][0]
    assert keys["status"] == "warn" and keys["details"]["unknown"] == [
        {"key": "actor_rollout_ref.rollout.nn", "source": str(f), "suggestion": "actor_rollout_ref.rollout.n"}]
    p = run_cli("doctor", "--", "data.train_batch_size=1,2")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == ("envbuild doctor: command line: data.train_batch_size='1,2': comma-separated values "
                                "are a Hydra sweep; write a list as [a,b] or quote the string")
    p = run_cli("doctor", "--config", tmp_path / "nope.yaml")
    assert p.returncode == 2 and "nope.yaml" in p.stderr and "Traceback" not in p.stderr
