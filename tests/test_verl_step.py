"""verl's own trainer as the gpu level's `verl-step` check (probe/verl_step.py): the overrides per
verl release, verl's console metrics, and a run against a stand-in `verl.trainer.main_ppo` that
checks what it is handed the way verl's would (the real trainer needs a GPU: bench/README.md)."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap

import pytest

from envbuild.probe import verl_step
from envbuild.probe.verdict import Verdict
from envbuild.verl_config import recorded_releases

PATHS = {"model": "/w/model", "train": "/w/train.parquet", "val": "/w/val.parquet", "reward": "/w/reward.py",
         "ckpt": "/w/ckpt"}


def _ovs(verl, engine="vllm", fa=True):
    return dict(o.lstrip("+").split("=", 1) for o, _ in verl_step.overrides(verl, engine, PATHS, fa))


def test_overrides_follow_verls_releases():
    old = _ovs("0.4.1", "sglang", fa=False)
    assert old["custom_reward_function.path"] == "/w/reward.py" and "reward.custom_reward_function.path" not in old
    assert old["actor_rollout_ref.rollout.name"] == "sglang" and old["actor_rollout_ref.rollout.n"] == "4"
    assert old["algorithm.adv_estimator"] == "grpo" and old["actor_rollout_ref.actor.use_kl_loss"] == "True"
    # before 0.6.1 verl hard-codes flash_attention_2: no sdpa override, verl's own error says so
    assert "actor_rollout_ref.model.override_config.attn_implementation" not in old
    assert "ray_kwargs.ray_init.include_dashboard" not in old
    mid = _ovs("0.6.1", fa=False)
    assert mid["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert mid["actor_rollout_ref.model.use_remove_padding"] == "False"
    assert mid["ray_kwargs.ray_init.include_dashboard"] == "False"
    new = _ovs("0.9.1")
    assert new["reward.custom_reward_function.path"] == "/w/reward.py" and "custom_reward_function.path" not in new
    assert new["actor_rollout_ref.actor.fsdp_config.use_torch_compile"] == "False"
    assert "actor_rollout_ref.model.override_config.attn_implementation" not in new  # flash-attn installed
    assert _ovs("0.7.1")["reward.custom_reward_function.name"] == "score"
    assert "actor_rollout_ref.actor.fsdp_config.use_torch_compile" not in _ovs("0.7.1")
    # GRPO's batch rules on one GPU (verl-run.md 1.4): 8 prompts x 4 = 32, a multiple of the agent workers
    assert int(new["data.train_batch_size"]) * int(new["actor_rollout_ref.rollout.n"]) % \
        int(new["actor_rollout_ref.rollout.agent.num_workers"]) == 0
    # one agent-loop and one reward worker, the data loader in the trainer (not verl's 8 of each)
    assert new["reward.num_workers"] == "1" and new["data.dataloader_num_workers"] == "0"
    assert "actor_rollout_ref.rollout.agent.num_workers" not in old and "reward.num_workers" not in mid
    assert int(new["actor_rollout_ref.actor.ppo_mini_batch_size"]) <= int(new["data.train_batch_size"])


@pytest.mark.parametrize("release", recorded_releases())
def test_every_override_is_a_key_of_that_releases_config(release):
    """verl's Hydra refuses an override of a key its config lacks (struct mode) unless it is written
    with `+`: each release's step must only set keys that release has (its recorded config)."""
    from envbuild.verl_config import build_config

    for fa in (True, False):
        ovs = [o for o, _ in verl_step.overrides(release, "vllm", PATHS, fa)]
        cfg = build_config(None, ovs, verl=release)
        assert not cfg.unknown, (release, [u.key for u in cfg.unknown])


def test_parse_metrics_reads_verls_console_line():
    log = ("(TaskRunner pid=1) step:1 - actor/pg_loss:-0.0123 - actor/kl_loss:0.0 - critic/score/mean:0.5 - "
           "response_length/mean:31.25 - timing_s/step:4.2\nother line\n")
    m = verl_step.parse_metrics(log)
    assert m[1]["actor/pg_loss"] == -0.0123 and m[1]["response_length/mean"] == 31.25 and m[1]["timing_s/step"] == 4.2
    assert verl_step.parse_metrics("no metrics here") == {}


def test_verl_error_is_the_last_exception_line():
    log = "Traceback (most recent call last):\n  File x\nValueError: first\nray.exceptions.RayTaskError: " \
          "(AssertionError) Rollout hf with mode async not found\n"
    assert "Rollout hf with mode async not found" in verl_step.verl_error(log)


FAKE_MAIN = textwrap.dedent('''
    """A stand-in for verl.trainer.main_ppo: checks its inputs the way verl reads them, then logs one step."""
    import json, os, sys
    ov = dict(a.lstrip("+").split("=", 1) for a in sys.argv[1:])
    model = ov["actor_rollout_ref.model.path"]
    tok = json.load(open(os.path.join(model, "tokenizer_config.json")))
    assert tok.get("chat_template"), "tokenizer has no chat template"
    assert os.path.isfile(os.path.join(model, "config.json"))
    import pyarrow.parquet as pq
    t = pq.read_table(ov["data.train_files"]).to_pylist()
    assert len(t) >= int(ov["data.train_batch_size"]) and t[0]["prompt"][0]["role"] == "user"
    ns = {}
    exec(open(ov["reward.custom_reward_function.path"]).read(), ns)
    score = ns[ov["reward.custom_reward_function.name"]](data_source="envbuild", solution_str="abcd",
                                                          ground_truth="alpha", extra_info={}, extra=1)
    if os.environ.get("FAKE_VERL_FAIL"):
        raise ValueError("Rollout hf with mode async not found")
    assert os.environ["HF_HUB_OFFLINE"] == "1" and "http_proxy" not in os.environ
    print(f"step:1 - actor/pg_loss:0.01 - critic/score/mean:{score} - response_length/mean:12.0", flush=True)
''')


def _fake_verl(tmp_path, monkeypatch):
    for mod in ("torch", "transformers", "tokenizers", "pyarrow"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (ci/test.sh installs it)")
    site = tmp_path / "site"
    (site / "verl" / "trainer").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text("")
    (site / "verl" / "trainer" / "__init__.py").write_text("")
    (site / "verl" / "trainer" / "main_ppo.py").write_text(FAKE_MAIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *sys.path]))
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setattr(verl_step, "_verl_version", lambda: "0.9.1")
    monkeypatch.setattr(verl_step, "_stop_ray", lambda python, work: None)


def test_verl_step_passes_with_verls_metrics(tmp_path, monkeypatch):
    _fake_verl(tmp_path, monkeypatch)
    v = Verdict(level="gpu", engine="vllm")
    verl_step.run_verl_step(v, "vllm", gpu=True, scratch=str(tmp_path))
    c = v.checks[-1]
    assert c.name == "verl-step" and c.status == "pass", c.detail
    assert "critic/score/mean 0.5" in c.detail and "actor/pg_loss 0.01" in c.detail
    assert "verl.trainer.main_ppo" in c.detail and "$WORK" in c.detail  # how to repeat it
    m = v.metrics["verl_step"]
    assert m["steps"][1]["response_length/mean"] == 12.0 and m["returncode"] == 0


def test_verl_step_fails_with_verls_own_error(tmp_path, monkeypatch):
    _fake_verl(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VERL_FAIL", "1")
    v = Verdict(level="gpu", engine="hf")
    verl_step.run_verl_step(v, "hf", gpu=True, scratch=str(tmp_path))
    c = v.checks[-1]
    assert c.status == "fail" and c.cause == "verl-step-failed"
    assert "Rollout hf with mode async not found" in c.detail.splitlines()[0]
    assert v.status == "fail"


def test_verl_step_needs_a_gpu_and_follows_the_engine_step(monkeypatch):
    monkeypatch.setattr(verl_step, "_verl_version", lambda: "0.9.1")
    v = Verdict(level="gpu", engine="vllm")
    verl_step.run_verl_step(v, "vllm", gpu=False)
    assert v.checks[-1].status == "needs-gpu" and v.status == "needs-gpu"
    v = Verdict(level="gpu", engine="vllm")
    v.add("gpu:rollout", "fail", "engine broke", "x")
    verl_step.run_verl_step(v, "vllm", gpu=True)
    assert v.checks[-1].status == "skipped"  # the engine broke first: verl's step is not run
    v = Verdict(level="gpu", engine="vllm")
    v.add("gpu:rollout", "fail", "engine broke", "x")
    verl_step.engine_step_summary(v, 1.0)
    assert v.checks[-1].name == "engine-step" and v.checks[-1].status == "fail"


def test_the_steps_ray_is_ended_and_no_other(tmp_path):
    """Only processes that name the step's work folder are ended (verl's local Ray keeps its temp
    dir there); `ray stop --force` would end a user's own cluster on the same node."""
    import subprocess
    import time

    work = str(tmp_path / "envbuild-verl-step-x")
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", work])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / "other")])
    try:
        time.sleep(0.2)
        verl_step._stop_ray(sys.executable, work)
        assert mine.wait(timeout=10) != 0 and other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_the_step_model_renders_chatml_that_verls_agent_loop_accepts(tmp_path):
    """verl 0.9's single-turn agent loop looks up <|im_end|> in the tokenizer; without it every
    prompt failed on the H200 and verl stopped with "no materializable trajectories"."""
    pytest.importorskip("transformers")
    pytest.importorskip("pyarrow")
    from transformers import AutoTokenizer

    paths = verl_step.write_inputs(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(paths["model"])
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>")}
    assert len(set(ids.values())) == 4 and None not in ids.values() and tok.unk_token_id not in ids.values()
    text = tok.apply_chat_template([{"role": "user", "content": "alpha beta"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nalpha beta<|im_end|>\n<|im_start|>assistant\n"
    assert ids["<|im_end|>"] in tok(text)["input_ids"]  # one token, not its characters


def test_flash_attention_2_is_what_transformers_can_use_not_a_flash_attn_module(tmp_path, monkeypatch):
    """SGLang 0.5.14's lock holds flash-attn-4, which installs `flash_attn/cute` without FlashAttention 2:
    a `flash_attn` module was read as FA2, verl was told flash_attention_2 and transformers refused it
    (the H100 run, bench/verl_step/sglang_h100.json)."""
    transformers = pytest.importorskip("transformers")
    import transformers.utils

    # verl hands the choice to transformers: its answer is the probe's
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    assert verl_step._flash_attn() is True
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: False)
    assert verl_step._flash_attn() is False
    # a transformers without the helper: the FlashAttention 2 distribution decides, not the module name
    monkeypatch.delattr(transformers.utils, "is_flash_attn_2_available")
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("")
    (tmp_path / "flash_attn_4-4.0.0b15.dist-info").mkdir()
    (tmp_path / "flash_attn_4-4.0.0b15.dist-info" / "METADATA").write_text("Name: flash-attn-4\nVersion: 4.0.0b15\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.util.find_spec("flash_attn") is not None  # the module is there ...
    assert verl_step._flash_attn() is False  # ... FlashAttention 2 is not
    (tmp_path / "flash_attn-2.8.3.dist-info").mkdir()
    (tmp_path / "flash_attn-2.8.3.dist-info" / "METADATA").write_text("Name: flash-attn\nVersion: 2.8.3\n")
    assert verl_step._flash_attn() is True
