"""`envbuild doctor` config checks: GRPO, KL, advantage normalisation, batch vs GPU memory, FSDP offload."""

import json

import pytest

from envbuild.doctor import FAIL, PASS, SKIP, WARN, Options, check_config, check_fsdp, check_grpo
from envbuild.verl_config import build_config

GiB = 1 << 30
GOOD_GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=8",
             "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
             "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "algorithm.norm_adv_by_std_in_grpo=True"]
NO_GPU = Options(gpus=lambda: [])


def by_name(results):
    return {r.name: r for r in results}


def grpo(*overrides, opt=NO_GPU):
    return by_name(check_grpo(build_config(None, list(overrides)), opt))


def test_good_grpo_config_passes():
    r = grpo(*GOOD_GRPO)
    assert {k: v.status for k, v in r.items()} == {
        "grpo.n": PASS, "grpo.kl_loss": PASS, "grpo.norm_adv": PASS, "grpo.responses": PASS}
    assert "8192 responses per step (1024 prompts x n=8)" in r["grpo.responses"].reason


@pytest.mark.parametrize("n", [1, 0])
def test_grpo_without_grouped_sampling_fails(n):
    r = grpo(*GOOD_GRPO, f"actor_rollout_ref.rollout.n={n}")
    assert r["grpo.n"].status == FAIL and f"rollout.n={n}" in r["grpo.n"].reason
    assert "rollout.n=4" in r["grpo.n"].fix


def test_group_estimators_other_than_grpo_need_n_too_but_not_grpo_kl():
    r = grpo("algorithm.adv_estimator=rloo")
    assert r["grpo.n"].status == FAIL and "grpo.kl_loss" not in r
    assert grpo("algorithm.adv_estimator=gae")["grpo.n"].status == SKIP


def test_kl_loss_left_at_default_fails_but_explicit_false_is_a_choice():
    base = [o for o in GOOD_GRPO if "use_kl_loss" not in o]
    assert grpo(*base)["grpo.kl_loss"].status == FAIL
    r = grpo(*base, "actor_rollout_ref.actor.use_kl_loss=False")
    assert r["grpo.kl_loss"].status == PASS and "explicitly" in r["grpo.kl_loss"].reason


@pytest.mark.parametrize("override,needle", [
    ("actor_rollout_ref.actor.kl_loss_coef=0", "kl_loss_coef=0"),
    ("actor_rollout_ref.actor.kl_loss_coef=null", "kl_loss_coef=None"),
    ("actor_rollout_ref.actor.kl_loss_type=lowvar", "kl_loss_type='lowvar'"),
])
def test_kl_loss_needs_a_coefficient_and_a_known_type(override, needle):
    r = grpo(*GOOD_GRPO, override)["grpo.kl_loss"]
    assert r.status == FAIL and needle in r.reason


def test_k3_plus_is_a_known_kl_type():
    assert grpo(*GOOD_GRPO, "actor_rollout_ref.actor.kl_loss_type=k3+")["grpo.kl_loss"].status == PASS


def test_norm_adv_left_at_verls_default_is_no_warning():
    """Issue 50: a WARN here fired on all of verl's own GRPO examples, teaching users to ignore WARN."""
    base = [o for o in GOOD_GRPO if "norm_adv" not in o]
    r = grpo(*base)["grpo.norm_adv"]
    assert r.status == PASS and "verl's default" in r.reason and "Dr. GRPO" in r.reason
    assert grpo(*base, "algorithm.norm_adv_by_std_in_grpo=False")["grpo.norm_adv"].status == PASS


# A config shaped like verl's GRPO example scripts (examples/grpo_trainer: batch 1024, mini 256, micro 40
# per GPU, TP 2, n=5 on 8 GPUs): every start-up check passes and nothing warns.
VERL_EXAMPLE = ["algorithm.adv_estimator=grpo", "data.train_batch_size=1024", "data.max_prompt_length=512",
                "data.max_response_length=1024", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40", "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
                "algorithm.use_kl_in_reward=False", "trainer.n_gpus_per_node=8", "trainer.nnodes=1"]


def config(*overrides):
    return by_name(check_config(build_config(None, list(overrides)), NO_GPU))


def test_a_config_shaped_like_verls_examples_passes_every_start_up_check_and_warns_nothing():
    r = {**config(*VERL_EXAMPLE), **grpo(*VERL_EXAMPLE)}
    assert r["config.batches"].status == PASS and r["config.parallel"].status == PASS
    assert not [k for k, v in r.items() if v.status in (WARN, FAIL)], {k: v.reason for k, v in r.items()
                                                                     if v.status in (WARN, FAIL)}


@pytest.mark.parametrize("override,name,needle", [
    ("actor_rollout_ref.actor.ppo_mini_batch_size=2048", "config.batches", "larger than data.train_batch_size=1024"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size=320", "config.batches", "both actor_rollout_ref.actor.ppo_micro_batch_size and"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=48", "config.batches", "not a multiple of"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=16", "config.parallel", "does not divide the 8 GPU(s)"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=3", "config.parallel", "does not divide"),
])
def test_what_verl_refuses_at_start_up_fails_before_the_job_queues(override, name, needle):
    """Issue 50: errors verl raises only after the job waited in the queue."""
    r = config(*VERL_EXAMPLE, override)[name]
    assert r.status == FAIL and needle in r.reason, r.reason


def test_kl_in_reward_and_loss_warns():
    r = grpo(*GOOD_GRPO, "algorithm.use_kl_in_reward=True")
    assert r["kl.double"].status == WARN and "twice" in r["kl.double"].reason
    assert "kl.double" not in grpo(*GOOD_GRPO)


def _model(tmp_path, weights_bytes, layers=28, hidden=3584, heads=28, kv_heads=4):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": hidden,
                                               "num_attention_heads": heads, "num_key_value_heads": kv_heads}))
    with open(d / "model.safetensors", "wb") as f:  # sparse file: its size is what counts
        f.truncate(weights_bytes)
    return d


def test_responses_against_gpu_memory(tmp_path):
    # 7B-like: 28 layers, 4 KV heads of 128 -> 57344 B/token KV; 15 GB bf16 weights, TP 2
    model = _model(tmp_path, 15 * 10**9)
    gpus = Options(gpus=lambda: [{"name": "FakeGPU", "total": 80 * GiB}] * 8)
    common = [*GOOD_GRPO, f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=8",
              "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "data.max_prompt_length=1024",
              "data.max_response_length=3072"]
    small = grpo(*common, "data.train_batch_size=32", opt=gpus)["grpo.responses"]
    assert small.status == PASS and "8 x FakeGPU 80.0 GiB" in small.reason
    assert small.details["kv_needed_per_gpu"] == 32 * 8 * 4096 * 57344 / 8
    big = grpo(*common, "data.train_batch_size=1024", opt=gpus)["grpo.responses"]
    assert big.status == WARN and "waves" in big.reason
    # weights that do not fit in the rollout's share at all
    huge = grpo(*common, "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.1", opt=gpus)["grpo.responses"]
    assert huge.status == FAIL and "does not fit" in huge.reason


def test_responses_without_gpu_or_torch_are_info_only():
    assert "no GPU visible" in grpo(*GOOD_GRPO)["grpo.responses"].reason
    assert "torch not installed" in grpo(*GOOD_GRPO, opt=Options(gpus=lambda: None))["grpo.responses"].reason


def fsdp(*overrides):
    return by_name(check_fsdp(build_config(None, list(overrides)), Options()))


A = "actor_rollout_ref.actor.fsdp_config."
R = "actor_rollout_ref.ref.fsdp_config."
KL = "actor_rollout_ref.actor.use_kl_loss=True"


def test_fsdp_offload_layouts():
    # verl's GRPO examples: actor on GPU, reference offloaded
    r = fsdp(KL, f"{R}param_offload=True")
    assert r["fsdp.ref_offload"].status == PASS and r["fsdp.offload"].status == PASS
    # actor offloaded, reference not: the freed memory is eaten by the reference
    r = fsdp(KL, f"{A}param_offload=True", f"{A}optimizer_offload=True")
    assert r["fsdp.ref_offload"].status == WARN and f"{R}param_offload=True" in r["fsdp.ref_offload"].fix
    assert fsdp(f"{A}param_offload=True", f"{A}optimizer_offload=True")["fsdp.ref_offload"].status == SKIP


def test_param_offload_without_optimizer_offload_says_the_trade_off_without_a_warning():
    """Issue 50: it warned on verl's own Qwen3-32B and Seed-OSS-36B examples with no evidence that
    the choice is wrong; the trade-off and the alternatives are said in a PASS."""
    r = fsdp(KL, f"{A}param_offload=True", f"{R}param_offload=True")["fsdp.offload"]
    assert r.status == PASS and "optimizer_offload=True" in r.reason
    assert "gradient_checkpointing" in r.reason and "micro_batch" in r.reason
    assert fsdp("actor_rollout_ref.actor.strategy=fsdp2", f"{A}param_offload=True",
                f"{A}offload_policy=True")["fsdp.offload"].status == PASS
    assert fsdp(f"{A}offload_policy=True")["fsdp.offload"].status == WARN  # fsdp1 ignores it
    assert fsdp("actor_rollout_ref.actor.strategy=megatron")["fsdp.offload"].status == SKIP


def test_unknown_override_key_fails_in_one_line():
    r = check_config(build_config(None, ["trainer.n_gpu_per_node=8"]), Options())[0]
    assert r.status == FAIL and "did you mean trainer.n_gpus_per_node?" in r.reason and "\n" not in r.reason
    assert check_config(build_config(None, ["trainer.n_gpus_per_node=8"]), Options())[0].status == PASS


def test_quoted_booleans_and_numbers_warn(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("actor_rollout_ref:\n  actor:\n    use_kl_loss: 'False'\n    entropy_coeff: 0.001\n"
                 "trainer:\n  nnodes: '2'\n  logger: console\n")
    r = {x.name: x for x in check_config(build_config(str(f), ["data.train_batch_size=64"]), Options())}
    assert r["config.types"].status == WARN
    assert r["config.types"].details["values"] == ["actor_rollout_ref.actor.use_kl_loss='False' (expects true/false)",
                                                   "trainer.nnodes='2' (expects a number)"]
    ok = check_config(build_config(None, ["actor_rollout_ref.actor.entropy_coeff=0.001", "trainer.nnodes=2",
                                        "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=2"]), Options())
    # verl's defaults leave every micro batch size unset, which verl itself refuses (config.batches)
    assert {x.name: x.status for x in ok} == {"config.keys": PASS, "config.unset": FAIL, "config.types": PASS,
                                              "config.choices": PASS, "config.batches": FAIL, "config.parallel": PASS,
                                              "config.token_limit": SKIP, "config.verl_validate": SKIP}


@pytest.mark.parametrize("verl,override,ok", [
    ("0.9.1", "algorithm.adv_estimator=grpo", True),
    ("0.9.1", "algorithm.adv_estimator=gdpo", True),
    ("0.4.1", "algorithm.adv_estimator=gdpo", False),  # registered from a later release on
    ("0.9.1", "algorithm.adv_estimator=grp0", False),
    ("0.9.1", "actor_rollout_ref.rollout.name=vllm", True),
    ("0.9.1", "actor_rollout_ref.rollout.name=hf", False),  # no hf in 0.9.1's rollout registry
    ("0.4.1", "actor_rollout_ref.rollout.name=hf", True),
])
def test_enum_values_are_the_ones_that_verl_releases_code_accepts(verl, override, ok):
    """Issue 50: an unknown adv_estimator or rollout.name stops verl only after the job queued.
    The accepted values are read from each release's own code (recorded beside its config)."""
    cfg = build_config(None, [override], verl=verl)
    r = by_name(check_config(cfg, NO_GPU))["config.choices"]
    assert r.status == (PASS if ok else FAIL), r.reason
    if not ok:
        key, value = override.split("=")
        assert f"{key}={value} is not one verl {verl}" in r.reason and ("core_algos.py:" in r.reason or "rollout" in r.reason)
