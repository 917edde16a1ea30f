"""doctor, grpo group: grouped sampling, KL in the loss, advantage normalisation, batch size against GPU memory."""

from __future__ import annotations

import re

from ..verl_config import VerlConfig
from .common import (FAIL, PASS, SKIP, WARN, Options, Result, _gib, _num, _truthy,
                     local_gpus, model_facts)

# Advantage estimators that compare the responses of one prompt with each other: n must be > 1.
GROUP_ESTIMATORS = {"grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "gpg",
                    "reinforce_plus_plus_baseline", "optimal_token_baseline"}
GRPO_FAMILY = {"grpo", "grpo_passk", "grpo_vectorized"}
KL_TYPES = re.compile(r"^(kl|k1|abs|mse|k2|low_var_kl|k3|full)\+?$")


def check_grpo(cfg: VerlConfig, opt: Options) -> list[Result]:
    est = str(cfg.get("algorithm.adv_estimator"))
    out: list[Result] = []
    n = cfg.get("actor_rollout_ref.rollout.n")
    use_kl_loss = _truthy(cfg.get("actor_rollout_ref.actor.use_kl_loss"))
    kl_in_reward = _truthy(cfg.get("algorithm.use_kl_in_reward"))

    if est not in GROUP_ESTIMATORS:
        out.append(Result("grpo", "grpo.n", SKIP, f"algorithm.adv_estimator={est}: no grouped sampling needed"))
    elif not isinstance(n, int) or n <= 1:
        out.append(Result("grpo", "grpo.n", FAIL,
                          f"adv_estimator={est} with actor_rollout_ref.rollout.n={n}: each group holds one "
                          "response, so there is no group baseline (verl uses mean 0 / std 1: the advantage is "
                          "the raw score) and training silently degrades",
                          "set actor_rollout_ref.rollout.n=4 or more (verl's examples use 4-8)"))
    else:
        out.append(Result("grpo", "grpo.n", PASS, f"rollout.n={n} responses per prompt"))

    if est in GRPO_FAMILY:
        coef = cfg.get("actor_rollout_ref.actor.kl_loss_coef")
        ktype = cfg.get("actor_rollout_ref.actor.kl_loss_type")
        set_fix = ("set actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 "
                   "actor_rollout_ref.actor.kl_loss_type=low_var_kl")
        if not use_kl_loss:
            if cfg.is_explicit("actor_rollout_ref.actor.use_kl_loss"):
                # Not a WARN: a deliberate choice (DAPO and two of verl's own GRPO examples train
                # KL-free); the trade-off is said, nothing is claimed wrong.
                out.append(Result("grpo", "grpo.kl_loss", PASS,
                                  "use_kl_loss=False chosen explicitly: GRPO without a KL term to the reference "
                                  "(DAPO-style; the policy is not held near the reference)"))
            else:
                out.append(Result("grpo", "grpo.kl_loss", FAIL,
                                  "GRPO puts the KL penalty in the loss, but actor.use_kl_loss is left at its "
                                  "default False: no KL regularisation at all",
                                  set_fix + " (or set use_kl_loss=False explicitly if KL-free is intended)"))
        elif not isinstance(coef, (int, float)) or isinstance(coef, bool) or coef <= 0:
            out.append(Result("grpo", "grpo.kl_loss", FAIL,
                              f"use_kl_loss=True with kl_loss_coef={coef!r}: the KL term contributes nothing",
                              "set actor_rollout_ref.actor.kl_loss_coef to a positive value, e.g. 0.001"))
        elif not isinstance(ktype, str) or not KL_TYPES.match(ktype):
            out.append(Result("grpo", "grpo.kl_loss", FAIL,
                              f"kl_loss_type={ktype!r} is not one verl knows (kl/k1, abs, mse/k2, low_var_kl/k3, "
                              "full, optionally with '+')",
                              "set actor_rollout_ref.actor.kl_loss_type=low_var_kl"))
        else:
            out.append(Result("grpo", "grpo.kl_loss", PASS,
                              f"KL in the loss: kl_loss_coef={coef}, kl_loss_type={ktype}"))

        # Not a WARN: verl's default is standard GRPO and every GRPO example of verl's keeps it (a
        # WARN on all of them taught users to ignore WARN); the choice is said, with the other one.
        key = "algorithm.norm_adv_by_std_in_grpo"
        how = "chosen explicitly" if cfg.is_explicit(key) else "verl's default: standard GRPO"
        out.append(Result("grpo", "grpo.norm_adv", PASS,
                          f"{key}={cfg.get(key)} ({how}; False is Dr. GRPO, which does not divide by the "
                          "group's std)"))

    if use_kl_loss and kl_in_reward:
        out.append(Result("grpo", "kl.double", WARN,
                          "KL is applied twice: algorithm.use_kl_in_reward=True and actor.use_kl_loss=True",
                          "keep one: for GRPO set algorithm.use_kl_in_reward=False"))
    elif est in GRPO_FAMILY and kl_in_reward:
        out.append(Result("grpo", "kl.double", WARN,
                          "GRPO with the KL penalty in the reward: it is folded into the outcome score the "
                          "group is normalised by", "use actor.use_kl_loss=True and algorithm.use_kl_in_reward=False"))
    out.append(_responses_vs_memory(cfg, opt))
    return out


def _responses_vs_memory(cfg: VerlConfig, opt: Options) -> Result:
    bs = cfg.get("data.train_batch_size")
    n = cfg.get("actor_rollout_ref.rollout.n") or 1
    if not isinstance(bs, int) or not isinstance(n, int):
        return Result("grpo", "grpo.responses", WARN, f"train_batch_size={bs!r}, n={n!r} are not integers",
                      "set data.train_batch_size and actor_rollout_ref.rollout.n to integers")
    plen, rlen = cfg.get("data.max_prompt_length"), cfg.get("data.max_response_length")
    responses = bs * n
    seq = (plen or 0) + (rlen or 0)
    msg = f"{responses} responses per step ({bs} prompts x n={n}), up to {responses * seq:,} tokens"
    details: dict = {"responses_per_step": responses, "max_tokens_per_step": responses * seq}
    gpus = (opt.gpus or local_gpus)()
    if gpus is None:
        return Result("grpo", "grpo.responses", PASS, msg + "; torch not installed here, GPU memory not compared",
                      details=details)
    if not gpus:
        return Result("grpo", "grpo.responses", PASS, msg + "; no GPU visible to torch here, memory not compared",
                      details=details)
    per_gpu = min(g["total"] for g in gpus)
    n_gpus = max(1, _num(cfg, "trainer.nnodes", 1) * _num(cfg, "trainer.n_gpus_per_node", len(gpus)))
    util = _num(cfg, "actor_rollout_ref.rollout.gpu_memory_utilization", 0.5, float)
    tp = max(1, _num(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1))
    details.update({"gpus": gpus, "gpu_count_config": n_gpus, "gpu_memory_utilization": util})
    msg += f"; {len(gpus)} x {gpus[0]['name']} {_gib(per_gpu)} here, rollout may use {util} of each"
    facts = model_facts(cfg.get("actor_rollout_ref.model.path"))
    if not facts or not facts.get("kv_per_token"):
        return Result("grpo", "grpo.responses", PASS, msg + " (model not local: KV cache not estimated)",
                      details=details)
    shard = facts["weights"] / tp
    budget = util * per_gpu - shard  # KV room per GPU after this GPU's shard of the weights
    kv_total = responses * seq * facts["kv_per_token"]
    kv_per_gpu = kv_total / n_gpus  # n_gpus/tp replicas split the responses, TP splits each one's KV
    details.update({"weights_per_gpu": shard, "kv_room_per_gpu": budget, "kv_needed_per_gpu": kv_per_gpu})
    if budget <= 0:
        return Result("grpo", "grpo.responses", FAIL,
                      msg + f"; the weights shard ({_gib(shard)}) does not fit in {util} x {_gib(per_gpu)}",
                      "raise rollout.gpu_memory_utilization or rollout.tensor_model_parallel_size", details)
    if kv_per_gpu > budget:
        return Result("grpo", "grpo.responses", WARN,
                      msg + f"; at full length they need {_gib(kv_per_gpu)} KV cache per GPU, "
                      f"{_gib(budget)} available: the engine runs them in waves (slower, not wrong)",
                      "lower data.train_batch_size or rollout.n, or raise rollout.gpu_memory_utilization", details)
    return Result("grpo", "grpo.responses", PASS,
                  msg + f"; KV cache at full length {_gib(kv_per_gpu)} of {_gib(budget)} per GPU", details=details)
