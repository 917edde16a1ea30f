"""The gpu level's `verl-step` check: verl's own trainer (`python -m verl.trainer.main_ppo`) runs one
GRPO step on this machine's GPU, offline — the probe's tiny model with a chat template, a tiny
parquet dataset made on the spot, a rule reward through verl's `custom_reward_function`,
rollout.name = the row's engine, rollout.n = 4, KL loss on, Ray started locally without a
dashboard, every hub access off. It records what verl logged for the step (its metrics line) and
fails with verl's own error when verl does.

The overrides differ by verl release; they are the facts in STEP_RULES (read from verl's sources
at its release tags, shared/reference/verl-run.md 1.7), one home for them. What the step ran with
(every override and why) is in the check's detail, so a user can repeat it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from .features import TRAINER_ENTRY
from .verdict import FAIL, NEEDS_GPU, PASS, SKIPPED, Verdict
from .vocab import QUIET

STEP_TIMEOUT = float(os.environ.get("ENVBUILD_VERL_STEP_TIMEOUT", "900"))
# verl's console logger: `step:1 - actor/pg_loss:0.01 - critic/score/mean:0.5 - …` (aggregate_logger.py)
_STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
# What the check's detail shows of verl's metrics, in this order (all of them go into metrics).
SHOWN = ("response_length/mean", "critic/score/mean", "critic/advantages/mean", "actor/pg_loss", "actor/kl_loss",
         "actor/entropy", "actor/grad_norm", "timing_s/gen", "timing_s/update_actor", "timing_s/step")
# ChatML, as Qwen's models (verl's examples) render chats: verl 0.9's single-turn agent loop
# looks up <|im_end|> in the tokenizer and fails every prompt without it.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# (first verl release, overrides from it on, why, keys of earlier rules it replaces).
STEP_RULES: tuple[tuple[str, tuple[str, ...], str, tuple[str, ...]], ...] = (
    ("0.0", ("custom_reward_function.path={reward}", "custom_reward_function.name=score",
             "actor_rollout_ref.actor.use_torch_compile=False"),
     "the reward key and torch.compile switch of the legacy workers", ()),
    ("0.5.0", ("actor_rollout_ref.rollout.agent.num_workers=1", "data.dataloader_num_workers=0"),
     "8 prompts on one GPU: one agent-loop worker and the data loader in the trainer's own process (verl's "
     "defaults start 8 of each, every one importing verl and torch on the node's CPUs before the step)", ()),
    ("0.6.1", ("+ray_kwargs.ray_init.include_dashboard=False",), "ray_kwargs.ray_init reaches ray.init from 0.6.1", ()),
    ("0.7.1", ("reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=score"),
     "the reward function moved under reward. at 0.7.1",
     ("custom_reward_function.path", "custom_reward_function.name")),
    ("0.7.1", ("reward.num_workers=1",), "one reward-loop worker for 32 responses (verl's default starts 8)", ()),
    ("0.8.0", ("actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
               "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False"),
     "the engine workers read torch.compile from fsdp_config from 0.8.0", ()),
)
NO_FLASH_ATTN = ("actor_rollout_ref.model.use_remove_padding=False",
                 "+actor_rollout_ref.model.override_config.attn_implementation=sdpa")
FLASH_ATTN_OPTIONAL_FROM = "0.6.1"  # before it verl hard-codes flash_attention_2 (fsdp_workers.py)


def _release(v: str) -> tuple:
    nums = [int(x) for x in re.findall(r"\d+", str(v).split("+")[0])[:3]]
    return tuple(nums + [0] * (3 - len(nums)))


def overrides(verl: str, engine: str, paths: dict, flash_attn: bool) -> list[tuple[str, str]]:
    """[(override, why)] for one GRPO step of verl `verl` on one GPU (why: the rule that adds it)."""
    common = [
        "algorithm.adv_estimator=grpo", f"data.train_files={paths['train']}", f"data.val_files={paths['val']}",
        "data.train_batch_size=8", "data.max_prompt_length=64", "data.max_response_length=32",
        "data.prompt_key=prompt", f"actor_rollout_ref.model.path={paths['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "algorithm.use_kl_in_reward=False", f"actor_rollout_ref.rollout.name={engine}",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.enforce_eager=True",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_training_steps=1", "trainer.total_epochs=1",
        "trainer.logger=['console']", "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.resume_mode=disable", "trainer.project_name=envbuild", "trainer.experiment_name=verl-step",
        f"trainer.default_local_dir={paths['ckpt']}",
    ]
    out: dict[str, tuple[str, str]] = {o.split("=", 1)[0]: (o, "one GRPO step on one GPU (verl-run.md 1.7)")
                                       for o in common}
    have = _release(verl)
    for since, ovs, why, drops in STEP_RULES:
        if have >= _release(since):
            for k in drops:  # a key that moved: the old spelling goes
                out.pop(k, None)
            for o in ovs:
                o = o.format(**paths)
                out[o.split("=", 1)[0].lstrip("+")] = (o, why)
    if not flash_attn and have >= _release(FLASH_ATTN_OPTIONAL_FROM):
        for o in NO_FLASH_ATTN:
            out[o.split("=", 1)[0].lstrip("+")] = (o, "flash-attn is not installed: sdpa, no remove-padding")
    return list(out.values())


def write_inputs(work: str) -> dict:
    """The tiny model (with a chat template verl accepts), train/val parquet and the reward file."""
    from . import tiny_model

    model = os.path.join(work, "model")
    tiny_model.build(model)
    cfg_path = os.path.join(model, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["chat_template"] = CHAT_TEMPLATE  # verl renders prompts with apply_chat_template
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    import pyarrow as pa  # verl needs it (datasets reads the parquet): present wherever verl is
    import pyarrow.parquet as pq

    def rows(split: str, n: int) -> "pa.Table":
        recs = [{"data_source": "envbuild", "prompt": [{"role": "user", "content": tiny_model.PROMPTS[i % 8]}],
                 "ability": "text", "reward_model": {"style": "rule", "ground_truth": "alpha"},
                 "extra_info": {"split": split, "index": i}} for i in range(n)]
        return pa.Table.from_pylist(recs)
    paths = {"model": model, "train": os.path.join(work, "train.parquet"), "val": os.path.join(work, "val.parquet"),
             "reward": os.path.join(work, "reward.py"), "ckpt": os.path.join(work, "ckpt")}
    pq.write_table(rows("train", 16), paths["train"])
    pq.write_table(rows("test", 8), paths["val"])
    with open(paths["reward"], "w") as f:
        f.write("def score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
                "    # varied scores, so a GRPO group has non-zero advantages\n"
                "    return float(len(solution_str) % 3) / 2.0\n")
    return paths


def parse_metrics(log: str) -> dict[int, dict[str, float]]:
    """{step: {metric: value}} from verl's console lines."""
    out: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        m = _STEP_LINE.search(line)
        if not m:
            continue
        d = out.setdefault(int(m.group(1)), {})
        for part in m.group(2).split(" - "):
            k, sep, val = part.rpartition(":")
            if not sep:
                continue
            try:
                d[k.strip()] = float(val)
            except ValueError:
                continue
    return out


def verl_error(log: str) -> str:
    """verl's own error: the last exception line of its output (Ray re-raises a worker's)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    pat = re.compile(r"^(?:\S+\.)?[A-Z]\w*(?:Error|Exception|Exit)\b.*|^AssertionError.*")
    errs = [ln for ln in lines if pat.match(ln)]
    return (errs[-1] if errs else (lines[-1] if lines else "no output"))[:500]


def step_env(work: str) -> dict:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "WANDB_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
                "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "HOME": env.get("HOME") or work, "RAY_TMPDIR": os.path.join(work, "ray")})
    # verl's async rollout servers answer on the node's address; a proxy must not take that traffic.
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(k, None)
    env.pop("RAY_ADDRESS", None)  # a local Ray of its own, never a cluster this host belongs to
    return env


def _verl_version() -> str | None:
    import importlib.metadata as md
    try:
        return md.version("verl")
    except md.PackageNotFoundError:
        return None


def _flash_attn() -> bool:
    """Whether transformers can use FlashAttention 2 here: verl asks it for flash_attention_2, and
    transformers decides. A `flash_attn` module alone is not enough: flash-attn-4 installs
    `flash_attn.cute` (SGLang 0.5.13+ pulls it in) without FlashAttention 2."""
    try:
        from transformers.utils import is_flash_attn_2_available
        return bool(is_flash_attn_2_available())
    except Exception:  # a transformers without the helper: the distribution FlashAttention 2 comes in
        import importlib.metadata as md
        try:
            return md.version("flash-attn") is not None
        except md.PackageNotFoundError:
            return False


def run_verl_step(v: Verdict, engine: str, *, gpu: bool, python: str | None = None, timeout: float | None = None,
                  scratch: str | None = None) -> None:
    """One GRPO step through verl's trainer, as the check `verl-step` (a level-gpu check)."""
    verl = _verl_version()
    if verl is None:
        v.add("verl-step", SKIPPED, "verl is not installed")
        return
    if not gpu:
        v.add("verl-step", NEEDS_GPU, "verl's trainer needs a GPU (FSDP on CUDA); none is visible", "needs-gpu")
        return
    if any(c.name.startswith("gpu:") and c.status == FAIL for c in v.checks):
        v.add("verl-step", SKIPPED, "engine-step (the gpu:* checks) failed first: verl's step would meet the same break")
        return
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix="envbuild-verl-step-", dir=scratch)
    paths = write_inputs(work)
    fa = _flash_attn()
    ovs = overrides(verl, engine, paths, fa)
    cmd = [python or sys.executable, "-m", TRAINER_ENTRY, *[o for o, _ in ovs]]
    log_path = os.path.join(work, "verl-step.log")
    timed_out = False
    with open(log_path, "w") as log:
        try:
            p = subprocess.run(cmd, cwd=work, env=step_env(work), stdout=log, stderr=subprocess.STDOUT,
                               timeout=timeout or STEP_TIMEOUT, start_new_session=True)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
    _stop_ray(python or sys.executable, work)
    with open(log_path, errors="replace") as f:
        out = f.read()
    secs = time.perf_counter() - t0
    steps = parse_metrics(out)
    how = (f"verl {verl}: python -m {TRAINER_ENTRY} " + " ".join(o for o, _ in ovs)
           .replace(work, "$WORK") + f"\nflash-attn {'installed' if fa else 'not installed'}")
    v.metrics["verl_step"] = {"verl": verl, "seconds": round(secs, 2), "returncode": rc, "flash_attn": fa,
                              "overrides": [o.replace(work, "$WORK") for o, _ in ovs],
                              "why": sorted({w for _, w in ovs}), "steps": steps}
    v.timings["verl_step"] = round(secs, 3)
    if rc == 0 and 1 in steps:
        m = steps[1]
        shown = ", ".join(f"{k} {m[k]:.4g}" for k in SHOWN if k in m)
        v.add("verl-step", PASS, f"one GRPO step through verl's trainer: {shown}\n{how}", seconds=secs)
        return
    why = "timed out" if timed_out else f"exit {rc}" if rc else "exited 0 without logging step 1"
    head = f"verl's trainer {why}: {verl_error(out)}"
    # first and last: readers that keep a detail's tail (the table) still show verl's own error
    v.add("verl-step", FAIL, f"{head}\n{how}\nlog tail:\n{out[-1200:]}\n{head}",
          "verl-step-timeout" if timed_out else "verl-step-failed", secs)


def engine_step_summary(v: Verdict, seconds: float) -> None:
    """`engine-step`: envbuild's own step through the engine's API (the gpu:* checks), in one line."""
    mine = [c for c in v.checks if c.name.startswith("gpu:")]
    if not mine:
        return
    bad = [c for c in mine if c.status not in QUIET]
    if not bad:
        v.add("engine-step", PASS, f"{len(mine)} checks of envbuild's own GRPO step through the engine's API",
              seconds=seconds)
    elif all(c.status == NEEDS_GPU for c in bad):
        v.add("engine-step", NEEDS_GPU, bad[0].detail, "needs-gpu", seconds)
    else:
        v.add("engine-step", FAIL, "; ".join(f"{c.name}: {c.status}" for c in bad[:6]),
              bad[0].cause or "engine-step-failed", seconds)


def _stop_ray(python: str, work: str) -> None:
    """The step's own Ray (verl's ray.init, its temp dir under `work`) must not outlive it. Only
    processes whose command line names `work` are ended: `ray stop --force` would end every Ray on
    the host, a user's cluster on a shared node included."""
    import signal

    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if work.encode() in cmd:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
