"""Scopes: the runs that reach a finding (core, a verl feature, a model type, a run-time guard),
and the feature descriptors, one per opt-in path of verl's trainer.

Part of the probe's vocabulary (envbuild_probe.vocab has the levels, statuses and engines): standard
library only, because the probe runs inside images where envbuild is not installed. probe.scope
derives a finding's scope from verl's code and falls back on these descriptors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ---------------------------------------------------------------- scopes (where a finding is reached)

# A failing check's scope: the runs that reach the code it found broken. `core` is what every run of
# this engine through verl's trainer with verl's default config reaches; any other scope is opt-in
# (a feature, a model type, a run-time guard), so a row broken only there is not broken: its status
# stands and the scope is listed beside it. A finding whose scope cannot be determined is core.
CORE = "core"
MODEL_SCOPE = "model:"  # + verl's model_type: verl's model patches are selected by it (derived from code)
GUARD_SCOPE = "guard:"  # + what the code tests at run time before it reaches the finding
GUARDS = {
    "gpu-only": "runs only where torch.cuda.is_available() (judged by the gpu level)",
    "runtime-check": "runs only after a run-time check (hasattr, inspect.signature) that this install fails",
    "fallback": "inside try/except: the code takes its fallback when this fails",
    "argument": "runs only when a caller passes an optional argument",
    "accelerator": "runs only on another accelerator's build of torch (torch.version.hip, torch.version.cuda)",
    # probe.reach over-approximates what the entry loads, so a module outside it is one no GRPO run
    # of verl's trainer imports: another entry point's (SFT trainer, model merger, tools)
    "unreached": "in a module verl's trainer entry (main_ppo) never loads: another entry point's",
}
# verl's trainer entry (`python -m verl.trainer.main_ppo`, every release so far): what `core` is
# reached from, and what the gpu level's verl-step runs.
TRAINER_ENTRY = "verl.trainer.main_ppo"
# Where a scope came from: read from verl's code, or from a feature descriptor (data).
SCOPE_FROM_CODE, SCOPE_FROM_DATA, SCOPE_UNDETERMINED = "code", "data", "undetermined"


@dataclass(frozen=True)
class FeatureSpec:
    """One opt-in path of verl's trainer: what switches it on and which of verl's code only it reaches.

    name       the scope's name (`pick --feature NAME`, `doctor`, the page)
    modules    verl modules (fnmatch patterns) that only this feature loads; a finding at module
               level of one counts for the feature only if no module outside it imports it at
               module level (else it is loaded on every run: core)
    config     (key, value) pairs of verl's trainer config that switch it on; value True for a flag,
               a string for an enum value, ">0"/">1" for a size
    guards     attribute or variable names whose test (`if self.multi_stage_wake_up:`) guards code
               reached only with the feature on
    default_from  the first verl release in which it is on by default (there it is core)
    default_until the first verl release in which it is no longer the default (before it: core)
    """

    name: str
    label: str
    modules: tuple[str, ...] = ()
    config: tuple[tuple[str, object], ...] = ()
    guards: tuple[str, ...] = ()
    default_from: str | None = None
    default_until: str | None = None


# From verl's sources at its release tags (shared/reference/verl-run.md, section 3).
FEATURE_SPECS = (
    FeatureSpec("async", "async rollout (rollout.mode=async)",
                ("verl.workers.rollout.async_server", "verl.workers.rollout.*.*async*", "verl.experimental.agent_loop*",
                 "verl.workers.rollout.chat_scheduler*"),
                (("actor_rollout_ref.rollout.mode", "async"),), default_from="0.7.0"),
    FeatureSpec("sync", "in-process rollout (rollout.mode=sync)",
                ("verl.workers.rollout.*.*_rollout_spmd", "verl.workers.sharding_manager.fsdp_vllm",
                 "verl.workers.sharding_manager.fsdp_sglang"),
                (("actor_rollout_ref.rollout.mode", "sync"),), default_until="0.7.0"),
    FeatureSpec("multi_stage_wake_up", "rollout.multi_stage_wake_up=true",
                config=(("actor_rollout_ref.rollout.multi_stage_wake_up", True),), guards=("multi_stage_wake_up",)),
    FeatureSpec("quantization", "QAT / ModelOpt / FP8 quantisation",
                ("verl.utils.qat*", "verl.utils.modelopt*", "verl.utils.vllm.vllm_fp8_utils", "verl.utils.vllm.vllm_fp4_utils",
                 "verl.utils.vllm.vllm_quant_utils"),
                (("actor_rollout_ref.actor.fsdp_config.qat.enable", True), ("actor_rollout_ref.actor.qat.enable", True),
                 ("actor_rollout_ref.rollout.quantization", "fp8")),
                ("qat", "enable_qat", "quantization", "quant_method", "modelopt", "fp8")),
    FeatureSpec("lora", "LoRA (model.lora_rank>0)", ("verl.utils.*lora*",),
                (("actor_rollout_ref.model.lora_rank", ">0"), ("actor_rollout_ref.model.lora.rank", ">0")),
                ("lora_rank", "is_lora", "lora_adapter_path", "enable_lora", "peft_config")),
    FeatureSpec("megatron", "Megatron strategy (actor.strategy=megatron)",
                ("verl.workers.megatron_workers", "verl.workers.engine.megatron*", "verl.*megatron*", "verl.*mcore*"),
                (("actor_rollout_ref.actor.strategy", "megatron"),), ("megatron",)),
    FeatureSpec("sequence_parallel", "Ulysses sequence parallel (ulysses_sequence_parallel_size>1)",
                ("verl.utils.ulysses",),
                (("actor_rollout_ref.actor.ulysses_sequence_parallel_size", ">1"),),
                ("ulysses_sequence_parallel_size", "ulysses_sp_size", "use_ulysses_sp")),
    FeatureSpec("vlm", "vision-language models (a processor, images)",
                ("verl.utils.dataset.vision_utils*", "verl.models.transformers.*_vl", "verl.models.transformers.glm4v"),
                guards=("image_data", "multi_modal_data", "multi_modal_inputs", "processor")),
    FeatureSpec("multi_turn", "multi-turn / tools / agents (rollout.multi_turn.enable)",
                ("verl.tools*", "verl.interactions*", "verl.experimental.agent_loop.tool_agent_loop*"),
                (("actor_rollout_ref.rollout.multi_turn.enable", True),), ("multi_turn", "tool_schemas", "interaction")),
    FeatureSpec("fused_kernels", "model.use_fused_kernels=true",
                ("verl.utils.kernel*", "verl.models.transformers.dense_common"),
                (("actor_rollout_ref.model.use_fused_kernels", True),), ("use_fused_kernels",)),
    FeatureSpec("disaggregation", "prefill/decode disaggregation",
                ("verl.workers.rollout.*_pd_replica",),
                (("actor_rollout_ref.rollout.disaggregation.enabled", True),), ("disaggregation",)),
)
FEATURE = {f.name: f for f in FEATURE_SPECS}
FEATURES = tuple(FEATURE)


def is_core(scope: object) -> bool:
    return scope in (None, "", CORE)


def model_types(scope: object) -> tuple[str, ...]:
    """`model:qwen3_5,qwen3_5_moe` -> ("qwen3_5", "qwen3_5_moe"); () for any other scope."""
    s = str(scope or "")
    return tuple(s[len(MODEL_SCOPE):].split(",")) if s.startswith(MODEL_SCOPE) else ()


def scope_flag(scope: str) -> str:
    """How `envbuild pick` spells a run's scope: `--model-type T` or `--feature F`."""
    types = model_types(scope)
    return f"--model-type {types[0]}" if types else f"--feature {scope}"


def scope_label(scope: object) -> str:
    """`quantization` -> its label; `model:qwen3_5` -> `model_type qwen3_5`; `guard:…` -> the guard."""
    s = str(scope or CORE)
    if s in FEATURE:
        return FEATURE[s].label
    if s.startswith(MODEL_SCOPE):
        return f"model_type {s[len(MODEL_SCOPE):]}"
    if s.startswith(GUARD_SCOPE):
        g = s[len(GUARD_SCOPE):].split(":")[0]
        return GUARDS.get(g, s)
    return s


def _release(text: object) -> tuple:
    nums = re.findall(r"\d+", str(text or "").split("+")[0])[:3]
    return tuple(int(n) for n in nums) + (0,) * (3 - len(nums))


def feature_default_on(name: str, verl: object) -> bool:
    """Whether verl's default config at release `verl` turns the feature on (then it is core)."""
    f = FEATURE.get(name)
    if f is None or not verl:
        return False
    v = _release(verl)
    if f.default_from and v >= _release(f.default_from):
        return True
    return bool(f.default_until and v < _release(f.default_until))


def parse_scope(value: object) -> str | None:
    """A user's spelling of a scope: a feature name (`async`, `multi-stage-wake-up`), `model:T` or
    `model_type=T`; None if unknown."""
    s = str(value or "").strip().lower()
    if s.startswith(("model:", "model_type=", "model_type:", "model-type=")):
        t = re.split(r"[:=]", s, 1)[1].strip()
        return MODEL_SCOPE + t if re.fullmatch(r"[a-z0-9_.\-]+", t) else None
    s = s.replace("-", "_")
    return s if s in FEATURE or s == CORE else None
