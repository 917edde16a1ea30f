"""doctor, fsdp group: offload settings."""

from __future__ import annotations


from ..verl_config import VerlConfig
from .common import (PASS, SKIP, WARN, Options, Result, _truthy)


def check_fsdp(cfg: VerlConfig, opt: Options) -> list[Result]:
    strategy = str(cfg.get("actor_rollout_ref.actor.strategy"))
    if strategy not in ("fsdp", "fsdp2"):
        return [Result("fsdp", "fsdp.offload", SKIP, f"actor.strategy={strategy}: not FSDP")]
    a = "actor_rollout_ref.actor.fsdp_config."
    r = "actor_rollout_ref.ref.fsdp_config."
    a_param, a_opt = _truthy(cfg.get(a + "param_offload")), _truthy(cfg.get(a + "optimizer_offload"))
    a_policy = _truthy(cfg.get(a + "offload_policy"))
    r_param = _truthy(cfg.get(r + "param_offload"))
    needs_ref = (_truthy(cfg.get("actor_rollout_ref.actor.use_kl_loss"))
                 or _truthy(cfg.get("algorithm.use_kl_in_reward")))
    out = []
    if not needs_ref:
        out.append(Result("fsdp", "fsdp.ref_offload", SKIP, "no KL term: the reference model is not used"))
    elif a_param and not r_param:
        out.append(Result("fsdp", "fsdp.ref_offload", WARN,
                          "actor params are offloaded to CPU but the reference model's stay on the GPU: the "
                          "memory the actor offload frees is taken by the reference weights",
                          f"set {r}param_offload=True (the reference is only used for log-probs)"))
    elif r_param and not a_param:
        out.append(Result("fsdp", "fsdp.ref_offload", PASS,
                          "reference offloaded, actor on GPU (the layout verl's GRPO examples use)"))
    else:
        out.append(Result("fsdp", "fsdp.ref_offload", PASS, f"actor and reference param_offload agree ({a_param})"))

    safer = ("smaller actor.ppo_micro_batch_size_per_gpu, actor_rollout_ref.model.enable_gradient_checkpointing=True"
             " or use_dynamic_bsz with a lower ppo_max_token_len_per_gpu")
    if a_policy and strategy != "fsdp2":
        out.append(Result("fsdp", "fsdp.offload", WARN,
                          "offload_policy=True only applies to strategy=fsdp2; with fsdp it is ignored",
                          f"set actor_rollout_ref.actor.strategy=fsdp2 or use {a}param_offload/optimizer_offload"))
    elif a_param and not a_opt and not a_policy:
        # Not a WARN: a memory/speed trade-off verl's own examples make (Qwen3-32B, Seed-OSS-36B),
        # with nothing measured here to say it is the wrong one.
        out.append(Result("fsdp", "fsdp.offload", PASS,
                          "actor param_offload=True, optimizer_offload=False: parameters move to CPU and back "
                          "every step while the Adam state (2 x fp32 params, the larger part) stays on the GPU; "
                          f"if memory is still short: {a}optimizer_offload=True, or {safer}"))
    elif a_param or a_opt or a_policy:
        out.append(Result("fsdp", "fsdp.offload", PASS,
                          f"actor offload: param={a_param} optimizer={a_opt} policy={a_policy} (slower steps; "
                          f"alternatives: {safer})"))
    else:
        out.append(Result("fsdp", "fsdp.offload", PASS, "no actor offload"))
    return out
