"""doctor, config group: keys verl does not know, values of the wrong type."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..probe.vocab import ENGINE_SPECS
from ..verl_choices import ADV_KEY
from ..verl_config import VerlConfig
from ..verl_refusals import BATCHED_TOKENS
from .common import (FAIL, PASS, SKIP, WARN, Options, Result)

# verl's rollout names, from the engine descriptors (vocab.EngineSpec.rollout)
ROLLOUT_NAMES = tuple(dict.fromkeys(p for e in ENGINE_SPECS for p in e.rollout))
# Keys whose verl type is a union (FSDP2's reshard_after_forward: True, False or an int).
MIXED_TYPES = {"reshard_after_forward"}


def check_config(cfg: VerlConfig, opt: Options) -> list[Result]:
    from .verlown import check_verl_validation

    return [_unknown_keys(cfg), _unset(cfg), _value_types(cfg), _choices(cfg), _batches(cfg), _parallel(cfg),
            _token_limit(cfg), check_verl_validation(cfg, opt)]


def _choices(cfg: VerlConfig) -> Result:
    """An enum-valued key set to a value verl's code does not accept (an advantage estimator it
    does not register, a rollout its registry cannot select): verl stops at start-up with
    "Unknown advantage estimator" or "Rollout ... not found"."""
    if not cfg.choices:
        return Result("config", "config.choices", SKIP, f"the accepted values were not recorded for {cfg.origin}")
    bad, fixes = [], []
    for key, c in sorted(cfg.choices.items()):
        v = cfg.get(key)
        if v is None or key in cfg.deleted or (isinstance(v, str) and v.startswith("???")):
            continue  # unset: config.unset says it
        if str(v) not in c["values"]:
            bad.append(f"{key}={v} is not one {cfg.origin} accepts ({c['where']}: {', '.join(c['values'])})")
            fixes.append(f"set {key} to one of {', '.join(c['values'])}")
    if bad:
        custom = (" (a custom advantage estimator must be registered with verl.trainer.ppo.core_algos."
                  "register_adv_est before the trainer starts)") if any(b.startswith(ADV_KEY) for b in bad) else ""
        return Result("config", "config.choices", FAIL, "; ".join(bad), "; ".join(fixes) + custom)
    return Result("config", "config.choices", PASS,
                  f"{', '.join(sorted(cfg.choices))}: values {cfg.origin} accepts")


A = "actor_rollout_ref."
# (per-GPU key, total key) pairs of which verl takes exactly one, and what uses them.
MICRO_PAIRS = ((A + "actor.ppo_micro_batch_size_per_gpu", A + "actor.ppo_micro_batch_size"),
               (A + "rollout.log_prob_micro_batch_size_per_gpu", A + "rollout.log_prob_micro_batch_size"),
               (A + "ref.log_prob_micro_batch_size_per_gpu", A + "ref.log_prob_micro_batch_size"),
               ("critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size"))


def _int(cfg: VerlConfig, key: str) -> int | None:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _batches(cfg: VerlConfig) -> Result:
    """What verl asserts about batch sizes before it trains (after the job waited in the queue):
    train_batch_size >= ppo_mini_batch_size (both count prompts); of a micro batch size, the per-GPU
    or the total form, exactly one where verl uses it; with FSDP, train_batch_size x n divisible by
    the GPUs and the mini batch per GPU (mini x n / (GPUs / sequence parallel))
    divisible by the per-GPU micro batch (fsdp_workers asserts it; Megatron's workers divide by their
    data-parallel size and assert nothing)."""
    bad = []
    train, mini = _int(cfg, "data.train_batch_size"), _int(cfg, A + "actor.ppo_mini_batch_size")
    if train is not None and mini is not None and mini > train:
        bad.append(f"actor.ppo_mini_batch_size={mini} is larger than data.train_batch_size={train} (both count "
                   "prompts; verl asserts train_batch_size >= ppo_mini_batch_size)")
    for per_gpu, total in MICRO_PAIRS:
        if cfg.get(per_gpu) is not None and cfg.get(total) is not None:
            bad.append(f"both {total} and {per_gpu} are set (verl refuses both: remove {total})")
        elif cfg.get(per_gpu) is None and cfg.get(total) is None and _micro_needed(cfg, per_gpu):
            bad.append(f"neither {per_gpu} nor {total} is set (verl asserts one is, without dynamic batch size)")
    n = _int(cfg, A + "rollout.n") or 1
    world = (_int(cfg, "trainer.nnodes") or 1) * (_int(cfg, "trainer.n_gpus_per_node") or 1)
    sp = _int(cfg, A + "actor.ulysses_sequence_parallel_size") or 1
    micro = _int(cfg, A + "actor.ppo_micro_batch_size_per_gpu")
    dynamic = cfg.get(A + "actor.use_dynamic_bsz") is True
    fsdp = str(cfg.get(A + "actor.strategy")) in ("fsdp", "fsdp2")
    if train is not None and fsdp and not dynamic and (train * n) % world:
        # validate_config: real_train_batch_size % minimal_bsz, which is the GPU count for FSDP
        bad.append(f"data.train_batch_size x n = {train} x {n} = {train * n} responses do not split over the "
                   f"{world} GPU(s) (verl asserts real_train_batch_size % GPUs == 0)")
    if mini is not None and micro and fsdp and not dynamic and world % sp == 0:
        per_gpu_mini = mini * n // (world // sp)
        if per_gpu_mini == 0 or per_gpu_mini % micro:
            bad.append(f"the mini batch per GPU is {mini} x n={n} / ({world} GPUs / sp={sp}) = {per_gpu_mini}, "
                       f"not a multiple of actor.ppo_micro_batch_size_per_gpu={micro} (verl asserts it)")
    if bad:
        return Result("config", "config.batches", FAIL, "; ".join(bad),
                      "make train_batch_size >= ppo_mini_batch_size, set exactly one micro batch form (the "
                      "*_per_gpu one), and a per-GPU micro batch that divides the per-GPU mini batch")
    return Result("config", "config.batches", PASS, "batch sizes pass verl's start-up checks")


def _micro_needed(cfg: VerlConfig, key: str) -> bool:
    """Whether verl's start-up validation asks for this micro batch size: the actor's and the
    rollout's log-prob one unless the actor uses dynamic batch sizes, the reference's when a KL
    term needs the reference, the critic's when a critic trains (GAE, or critic.enable) without
    dynamic batch sizes."""
    actor_dynamic = cfg.get(A + "actor.use_dynamic_bsz") is True
    if key.startswith("critic."):
        enable = cfg.get("critic.enable")
        used = bool(enable) if enable is not None else cfg.get("algorithm.adv_estimator") == "gae"
        return used and cfg.get("critic.use_dynamic_bsz") is not True
    if key.startswith(A + "ref."):
        kl = cfg.get(A + "actor.use_kl_loss") is True or cfg.get("algorithm.use_kl_in_reward") is True
        return kl and not actor_dynamic
    return not actor_dynamic


def _parallel(cfg: VerlConfig) -> Result:
    """The rollout's tensor parallel size must divide the GPUs (verl builds world/TP replicas)."""
    tp = _int(cfg, A + "rollout.tensor_model_parallel_size") or 1
    world = (_int(cfg, "trainer.nnodes") or 1) * (_int(cfg, "trainer.n_gpus_per_node") or 1)
    if tp > world or world % tp:
        return Result("config", "config.parallel", FAIL,
                      f"rollout.tensor_model_parallel_size={tp} does not divide the {world} GPU(s) of "
                      "trainer.nnodes x trainer.n_gpus_per_node: verl cannot place the rollout replicas",
                      f"set actor_rollout_ref.rollout.tensor_model_parallel_size to a divisor of {world}")
    return Result("config", "config.parallel", PASS, f"rollout TP {tp} divides the {world} GPU(s)")


def _token_limit(cfg: VerlConfig) -> Result:
    """Long prompts against the engine's batched-token limit, where verl's own rollout refuses them
    when it starts (verl_refusals, read from that verl's code: its synchronous vLLM rollout up to
    0.6 with chunked prefill on): the job has waited in the queue by then."""
    r = A + "rollout."
    name, mode = str(cfg.get(r + "name")), str(cfg.get(r + "mode"))
    limit = _int(cfg, r + "max_num_batched_tokens")
    # as verl computes it: int(config.max_model_len or config.prompt_length + config.response_length)
    model_len = _int(cfg, r + "max_model_len")
    if not model_len:
        p, q = _int(cfg, r + "prompt_length"), _int(cfg, r + "response_length")
        model_len = p + q if p is not None and q is not None else None
    if name.startswith("???") or mode.startswith("???"):
        return Result("config", "config.token_limit", SKIP, "rollout.name or rollout.mode unset (config.unset says it)")
    rules = [x for x in cfg.refusals if x.get("rule") == BATCHED_TOKENS and [name, mode] in x.get("selected_by", [])]
    if not rules:
        return Result("config", "config.token_limit", PASS,
                      f"{cfg.origin}: its {name} rollout in {mode} mode makes no start-up refusal of "
                      "max_num_batched_tokens against max_model_len (the engine gets both)")
    if limit is None or model_len is None:
        return Result("config", "config.token_limit", SKIP,
                      f"max_num_batched_tokens={limit}, max_model_len={model_len}: not both known integers")
    for x in rules:
        off = [f for f, want in (x.get("requires") or {}).items() if bool(cfg.get(r + f)) is not want]
        if not off and limit < model_len:
            return Result("config", "config.token_limit", FAIL,
                          f"rollout.max_num_batched_tokens={limit} is below max_model_len={model_len} (prompt + "
                          f"response length) with {', '.join(f'{f}={v}' for f, v in x['requires'].items()) or 'this'}"
                          f": {cfg.origin} refuses it when the rollout starts ({x['where']}: {x['message']})",
                          # not "disable chunked prefill", as verl's message offers: vLLM then refuses
                          # a batched-token limit below max_model_len itself
                          f"set {r}max_num_batched_tokens={model_len} or more", {"rule": x})
    return Result("config", "config.token_limit", PASS,
                  f"rollout.max_num_batched_tokens={limit} against max_model_len={model_len}: passes the check at "
                  f"{rules[0]['where']}")


def _unset(cfg: VerlConfig) -> Result:
    """A mandatory value (`???` in verl's config) nobody set: verl stops with MissingMandatoryValue
    when it reads it. Sections switched off (`enable: false`) are not read."""
    missing = cfg.unset()
    if not missing:
        return Result("config", "config.unset", PASS, "every mandatory value (??? in verl's config) is set")
    fixes = []
    for key in missing:
        known = (cfg.choices.get(key) or {}).get("values")
        choices = known or (ROLLOUT_NAMES if key.endswith("rollout.name") else None)
        fixes.append(f"set {key}=" + ("|".join(choices) if choices else "VALUE"))
    return Result("config", "config.unset", FAIL,
                  f"{len(missing)} mandatory value(s) unset (verl stops with MissingMandatoryValue): "
                  + ", ".join(missing), "; ".join(fixes), {"unset": missing})


def _value_types(cfg: VerlConfig) -> Result:
    """Booleans and numbers given as something else. A quoted "False" in a YAML file is a non-empty
    string, which verl's `if config.use_kl_loss:` reads as True: silent, and the opposite of intended.
    An interpolation (`${oc.env:GPU_UTIL,0.5}`) resolves to a string; verl's typed configs convert it,
    so a string that reads as the expected type is fine there."""
    bad = []
    for key in cfg.explicit:
        default, v = cfg.default(key), cfg.get(key)
        if (key in cfg.deleted or v is None or default is None or isinstance(default, (str, dict, list))
                or key.rpartition(".")[2] in MIXED_TYPES):
            continue
        interpolated = isinstance(cfg.values.get(key), str) and "${" in cfg.values[key]
        if isinstance(default, bool):
            ok, want = isinstance(v, bool) or (interpolated and str(v).lower() in ("true", "false")), "true/false"
        else:  # int and float defaults take either (entropy_coeff: 0 -> 0.001)
            ok, want = (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
                interpolated and _is_number(v)), "a number"
        if not ok:
            bad.append(f"{key}={v!r} (expects {want})")
    if bad:
        return Result("config", "config.types", WARN, f"{len(bad)} value(s) of the wrong type: " + "; ".join(bad),
                      "write booleans and numbers unquoted (use_kl_loss=True, not 'True')", {"values": bad})
    return Result("config", "config.types", PASS, "booleans and numbers have the types verl expects")


def _is_number(v: Any) -> bool:
    try:
        float(str(v))
    except ValueError:
        return False
    return True


def _unknown_keys(cfg: VerlConfig) -> Result:
    """An override of a key verl's config lacks is refused by verl (Hydra's struct mode): FAIL. A key
    only in the config file is added by Hydra and never read by verl: verl runs with the default
    the user meant to change, silently: FAIL too."""
    from_overrides = [u for u in cfg.unknown if u.source == "override"]
    parts = [f"{u.key}" + (f" (did you mean {u.suggestion}?)" if u.suggestion else "") for u in cfg.unknown]
    details = {"unknown": [asdict(u) for u in cfg.unknown], "refused": cfg.refused, "base": cfg.origin}
    if from_overrides or cfg.refused:
        why = []
        if from_overrides:
            why.append(f"{len(from_overrides)} override(s) of keys not in the trainer config of {cfg.origin}, "
                       "which verl refuses (\"Could not override ... Key ... is not in struct\"): "
                       + "; ".join(p for u, p in zip(cfg.unknown, parts) if u.source == "override"))
        why += cfg.refused
        others = [p for u, p in zip(cfg.unknown, parts) if u.source != "override"]
        if others:
            why.append(f"not read by verl (config file): {'; '.join(others)}")
        return Result("config", "config.keys", FAIL, "; ".join(why),
                      "fix the spelling; write +key=value only to add a key verl's config does not have "
                      "(engine kwargs, override_config); pass --verl VERSION to judge another release", details)
    if cfg.unknown:
        return Result("config", "config.keys", FAIL,
                      f"{len(cfg.unknown)} key(s) in the config file are not in the trainer config of {cfg.origin} "
                      "(Hydra adds them; verl never reads them and runs with its default): " + "; ".join(parts),
                      "fix the spelling, or drop the key", details)
    return Result("config", "config.keys", PASS,
                  f"{len(cfg.explicit)} keys set, all in the trainer config of {cfg.origin}", details=details)
