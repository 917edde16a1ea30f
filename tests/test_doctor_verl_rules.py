"""doctor with verl's own rules (issue 50): the installed verl's start-up validation run as verl
runs it, the start-up refusals read from a release's code, Megatron configs judged against
`ppo_megatron_trainer`, options after `--`, an empty checkpoint folder."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from envbuild.doctor import FAIL, PASS, SKIP, WARN, Options, check_config
from envbuild.errors import InputError
from envbuild.runscope import hydra_flags, script_overrides
from envbuild.verl_config import build_config

A = "actor_rollout_ref."
# What verl's own GRPO example scripts set (examples/grpo_trainer/run_qwen3-8b.sh at v0.7.0).
EXAMPLE = ["algorithm.adv_estimator=grpo", "data.train_batch_size=1024", "data.max_prompt_length=512",
           "data.max_response_length=1024", A + "model.path=Qwen/Qwen3-8B", A + "actor.ppo_mini_batch_size=256",
           A + "actor.ppo_micro_batch_size_per_gpu=32", A + "actor.use_kl_loss=True", A + "actor.kl_loss_coef=0.001",
           A + "actor.kl_loss_type=low_var_kl", A + "rollout.log_prob_micro_batch_size_per_gpu=32",
           A + "rollout.tensor_model_parallel_size=2", A + "rollout.name=vllm", A + "rollout.n=5",
           A + "ref.log_prob_micro_batch_size_per_gpu=32", "algorithm.use_kl_in_reward=False",
           "trainer.n_gpus_per_node=8", "trainer.nnodes=1"]


def checks(*overrides, verl="0.9.1", name="ppo_trainer"):
    return {r.name: r for r in check_config(build_config(None, list(overrides), verl=verl, config_name=name), Options())}


# --------------------------------------------------------------------------- refusals read from verl's code

@pytest.mark.parametrize("verl", ["0.4.1", "0.5.0", "0.6.1"])
def test_long_prompts_against_the_batched_token_limit_fail_where_verls_sync_vllm_rollout_refuses_them(verl):
    long = [*EXAMPLE, "data.max_prompt_length=8192", "data.max_response_length=4096", A + "rollout.mode=sync"]
    r = checks(*long, verl=verl)["config.token_limit"]
    assert r.status == FAIL and "max_num_batched_tokens=8192 is below max_model_len=12288" in r.reason
    assert "vllm_rollout" in r.details["rule"]["where"] and "set actor_rollout_ref.rollout.max_num_batched_tokens=12288" in r.fix
    # enough tokens, chunked prefill off (verl's test needs it on), or rollout.max_model_len: passes
    assert checks(*long, A + "rollout.max_num_batched_tokens=12288", verl=verl)["config.token_limit"].status == PASS
    assert checks(*long, A + "rollout.enable_chunked_prefill=False", verl=verl)["config.token_limit"].status == PASS
    assert checks(*long, A + "rollout.max_model_len=8192", verl=verl)["config.token_limit"].status == PASS


@pytest.mark.parametrize("verl,mode", [("0.6.1", "async"), ("0.7.1", "async"), ("0.9.1", "async")])
def test_releases_and_modes_that_hand_the_limit_to_the_engine_pass(verl, mode):
    r = checks(*EXAMPLE, "data.max_prompt_length=8192", "data.max_response_length=4096", A + f"rollout.mode={mode}",
               verl=verl)["config.token_limit"]
    assert r.status == PASS and "makes no start-up refusal" in r.reason


@pytest.mark.parametrize("verl,mode,ok", [("0.4.1", "token_mean", False), ("0.4.1", "seq-mean-token-sum-norm", True),
                                          ("0.6.1", "token-sum", False), ("0.9.1", "token-sum", True)])
def test_loss_agg_mode_takes_the_values_that_releases_code_accepts(verl, mode, ok):
    """An unknown loss_agg_mode stops verl 0.4/0.5 in agg_loss at the first update (after a whole
    rollout), and 0.6 on in ActorConfig at start-up: the values are read from that code."""
    r = checks(*EXAMPLE, A + f"actor.loss_agg_mode={mode}", verl=verl)["config.choices"]
    assert (r.status == PASS) == ok, r.reason
    if not ok:
        assert f"loss_agg_mode={mode} is not one" in r.reason and "register_adv_est" not in r.fix


def test_batch_rules_follow_verls_validation():
    ok = checks(*EXAMPLE)
    assert ok["config.batches"].status == PASS, ok["config.batches"].reason
    # verl refuses a run that sets neither micro batch form (its defaults leave both unset) ...
    r = checks(*[o for o in EXAMPLE if "actor.ppo_micro_batch_size_per_gpu" not in o])["config.batches"]
    assert r.status == FAIL and "neither actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in r.reason
    # ... unless the actor uses dynamic batch sizes; the reference's only matters with a KL term
    assert checks(*[o for o in EXAMPLE if "micro_batch_size_per_gpu" not in o],
                  A + "actor.use_dynamic_bsz=True")["config.batches"].status == PASS
    no_kl = [o for o in EXAMPLE if "ref.log_prob" not in o and "use_kl_loss" not in o]
    assert checks(*no_kl, A + "actor.use_kl_loss=False")["config.batches"].status == PASS
    # responses that do not split over the GPUs (validate_config's real_train_batch_size assertion)
    r = checks(*EXAMPLE, "data.train_batch_size=3", A + "actor.ppo_mini_batch_size=3", A + "rollout.n=1")
    assert r["config.batches"].status == FAIL and "do not split over the 8 GPU(s)" in r["config.batches"].reason


def test_megatron_configs_are_judged_against_ppo_megatron_trainer():
    """Issue 50: 16 of verl 0.7.0's 48 GRPO examples name --config-name=ppo_megatron_trainer; judged
    against ppo_trainer, their megatron.* keys read as unknown and FSDP's divisibility rule failed
    Moonlight's numbers, which Megatron's workers never assert."""
    mega = [*EXAMPLE, A + "actor.megatron.tensor_model_parallel_size=4", A + "actor.ppo_mini_batch_size=64",
            A + "actor.ppo_micro_batch_size_per_gpu=16", "trainer.n_gpus_per_node=8", "trainer.nnodes=3"]
    r = checks(*mega, verl="0.7.1", name="ppo_megatron_trainer")
    assert r["config.keys"].status == PASS and "(ppo_megatron_trainer)" in r["config.keys"].reason
    assert r["config.batches"].status == PASS, r["config.batches"].reason
    fsdp = checks(*[o for o in mega if ".megatron." not in o], verl="0.7.1")
    assert fsdp["config.batches"].status == FAIL and "not a multiple of" in fsdp["config.batches"].reason
    assert checks(*mega, verl="0.7.1")["config.keys"].status == FAIL  # megatron keys against ppo_trainer


def test_hydra_flags_in_scripts_and_after_the_double_dash(tmp_path, run_cli):
    f = tmp_path / "run_megatron.sh"
    f.write_text(textwrap.dedent("""\
        #!/bin/bash
        NAME=ppo_megatron_trainer
        python3 -m verl.trainer.main_ppo --config-path=config \\
            --config-name="${NAME}.yaml" \\
            actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 trainer.n_gpus_per_node=8 "$@"
        """))
    got, left = script_overrides(str(f))
    assert got == ["--config-path=config", "--config-name=ppo_megatron_trainer.yaml",
                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=8"]
    assert hydra_flags(got) == ({"config-path": "config", "config-name": "ppo_megatron_trainer"}, got[2:])
    assert hydra_flags(["-cn", "x", "a=1"]) == ({"config-name": "x"}, ["a=1"])
    only = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]
    p = run_cli("doctor", f, "--verl", "0.7.1", "--json", *only)
    keys = {c["name"]: c for c in json.loads(p.stdout)["checks"]}["config.keys"]
    assert keys["status"] == PASS and "ppo_megatron_trainer" in keys["reason"], keys
    # doctor's own options after `--` are named, not read as overrides (exit 2, one line)
    p = run_cli("doctor", "--verl", "0.9.1", *only, "--", "data.train_batch_size=8", "--json")
    assert p.returncode == 2 and "'--json'" in p.stderr and "before `--`" in p.stderr and len(p.stderr.splitlines()) == 1
    # a config folder that is not verl's own is said, not silently judged against verl's
    p = run_cli("doctor", "--verl", "0.9.1", *only, "--", "--config-path=/srv/recipe", "--config-name=dapo")
    assert p.returncode == 2 and "--config-path" in p.stderr and "/srv/recipe" in p.stderr
    with pytest.raises(InputError, match="not recorded for verl 0.9.1"):
        build_config(None, [], verl="0.9.1", config_name="dapo_trainer")


# --------------------------------------------------------------------------- output

def test_an_empty_checkpoint_folder_warns_and_a_resumable_one_says_its_step(tmp_path, run_cli):
    only = [g for x in ("config", "grpo", "fsdp", "data", "ray", "env") for g in ("--skip", x)]
    p = run_cli("doctor", "--verl", "0.9.1", "--json", *only, "--", "trainer.default_local_dir=", cwd=tmp_path)
    r = {c["name"]: c for c in json.loads(p.stdout)["checks"]}["trainer.default_local_dir"]
    assert r["status"] == WARN and "is empty" in r["reason"] and str(tmp_path) in r["reason"]
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest_checkpointed_iteration.txt").write_text("40\n")
    p = run_cli("doctor", "--verl", "0.9.1", "--json", *only, "--", f"trainer.default_local_dir={tmp_path / 'ck'}")
    r = {c["name"]: c for c in json.loads(p.stdout)["checks"]}["trainer.default_local_dir"]
    assert r["status"] == PASS and "resumes from global_step_40" in r["reason"]
    p = run_cli("doctor", "--verl", "0.9.1", "--json", *only, "--", f"trainer.default_local_dir={tmp_path / 'ck'}",
                "trainer.resume_mode=disable")
    assert "resumes" not in {c["name"]: c for c in json.loads(p.stdout)["checks"]}["trainer.default_local_dir"]["reason"]


# --------------------------------------------------------------------------- verl's own validation

FAKE_CONFIG = """
def validate_config(config, use_reference_policy, use_critic):
    print("NOTICE: checked", use_reference_policy, use_critic)
    assert config.trainer.n_gpus_per_node <= 8, "at most 8 GPUs per node here"
"""
FAKE_TRAINER = """
class RayPPOTrainer:
    def _validate_config(self):
        n = self.config.trainer.n_gpus_per_node
        if n > 8:
            raise ValueError(f"n_gpus_per_node {n} > 8 (use_critic={self.use_critic})")
"""


def _fake_verl(root, files: dict[str, str]):
    """A stand-in verl package: the trainer config folder doctor composes, plus the given modules."""
    import shutil

    from envbuild.verl_config import recorded_dir

    pkg = root / "verl"
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    cfg = pkg / "trainer" / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    rec = json.loads((recorded_dir() / "0.9.1.json").read_text())
    import yaml
    (cfg / "ppo_trainer.yaml").write_text(yaml.safe_dump(rec["configs"]["ppo_trainer"]))
    dist = root / "verl-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: verl\nVersion: 9.9.9\n")
    return root


@pytest.mark.parametrize("layout", ["utils", "trainer"])
def test_the_installed_verls_validation_runs_in_a_child_and_its_refusal_is_the_verdict(tmp_path, run_cli, layout):
    files = ({"utils/__init__.py": "", "utils/config.py": FAKE_CONFIG} if layout == "utils" else
             {"utils/__init__.py": "", "utils/config.py": "", "trainer/__init__.py": "", "trainer/ppo/__init__.py": "",
              "trainer/ppo/ray_trainer.py": FAKE_TRAINER})
    root = _fake_verl(tmp_path, files)
    only = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]
    env = {"PYTHONPATH": str(root)}
    p = run_cli("doctor", "--json", *only, "--", "actor_rollout_ref.rollout.name=vllm", env=env)
    r = {c["name"]: c for c in json.loads(p.stdout)["checks"]}["config.verl_validate"]
    assert r["status"] == PASS and "verl 9.9.9, installed" in r["reason"], r
    if layout == "utils":  # verl's prints come back; main_ppo's reference rule: no KL here, GAE needs a critic
        assert "NOTICE: checked False True" in r["reason"]
    p = run_cli("doctor", "--json", *only, "--", "actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=16",
                env=env)
    r = {c["name"]: c for c in json.loads(p.stdout)["checks"]}["config.verl_validate"]
    assert p.returncode == 1 and r["status"] == FAIL, r
    assert ("AssertionError: at most 8 GPUs per node here" if layout == "utils" else
            "ValueError: n_gpus_per_node 16 > 8 (use_critic=True)") in r["reason"]
    assert ("verl/utils/config.py:4" if layout == "utils" else "verl/trainer/ppo/ray_trainer.py:6") in r["reason"]


def test_a_verl_that_cannot_import_here_is_not_a_verdict_on_the_config(tmp_path, run_cli):
    root = _fake_verl(tmp_path, {"utils/__init__.py": "", "utils/config.py": "import codetiming_not_here\n"})
    only = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]
    p = run_cli("doctor", "--json", *only, "--", "actor_rollout_ref.rollout.name=vllm", env={"PYTHONPATH": str(root)})
    r = {c["name"]: c for c in json.loads(p.stdout)["checks"]}["config.verl_validate"]
    assert r["status"] == SKIP and "No module named 'codetiming_not_here'" in r["reason"], r
    # a recorded release (no verl here): said, nothing judged
    assert checks(*EXAMPLE)["config.verl_validate"].status == SKIP


@pytest.mark.network
def test_a_real_verls_validate_config_accepts_its_example_and_refuses_what_it_refuses(tmp_path, run_cli):
    """verl 0.7.1 from the index (no dependencies but the few its config classes import), run on this
    venv's CPU torch: its own validate_config and ActorConfig.validate, in verl's words."""
    pytest.importorskip("torch", reason="verl imports torch (ci/test.sh installs a CPU build)")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "verl==0.7.1",
                    "tensordict", "pyvers", "codetiming", "cloudpickle", "orjson", "importlib_metadata"], check=True,
                   capture_output=True)
    only = [g for x in ("grpo", "fsdp", "data", "output", "ray", "env") for g in ("--skip", x)]
    env = {"PYTHONPATH": str(target)}
    p = run_cli("doctor", "--json", *only, "--", *EXAMPLE, env=env)
    out = json.loads(p.stdout)
    r = {c["name"]: c for c in out["checks"]}
    assert r["config.verl_validate"]["status"] == PASS, r["config.verl_validate"]
    assert "verl 0.7.1, installed" in r["config.verl_validate"]["reason"] and p.returncode == 0, p.stdout
    # a rule only verl's validation has: sampled validation at temperature 0
    p = run_cli("doctor", "--json", *only, "--", *EXAMPLE, A + "rollout.val_kwargs.do_sample=True",
                A + "rollout.temperature=0", env=env)
    r = {c["name"]: c for c in json.loads(p.stdout)["checks"]}["config.verl_validate"]
    assert p.returncode == 1 and r["status"] == FAIL and "temperature should be greater than 0" in r["reason"], r
    assert "verl/utils/config.py:" in r["reason"]
