"""`envbuild doctor`: catch verl's silent pitfalls before a training run starts.

Input is what the user gives verl's trainer: Hydra overrides after `--` and/or a YAML file. They are
merged over verl's own composed trainer config the way verl merges them (envbuild.verl_config) and
every check reads the merged, resolved config. Each check says pass / warn / fail / skip, one line
why, and the fix. Exit 1 when any fails; 2 when the config itself cannot be read (as verl would stop).

Groups: config (unknown keys), grpo (grouped sampling, KL, advantage normalisation, batch size against
GPU memory), fsdp (offload settings), data (parquet files), output (atomic writes, free space),
ray (cluster and GPUs, rollout ports), env (the probe's env+contract levels, the signed table).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import drivers
from .errors import EnvbuildError
from .probe.env_level import MIN_SHM_BYTES
from .probe.fatbin import parse_sm
from .vocab import parse_cuda
from .verl_config import VerlConfig, build_config
from .yamlsafe import read_bounded

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
GROUPS = ("config", "grpo", "fsdp", "data", "output", "ray", "env")

# Advantage estimators that compare the responses of one prompt with each other: n must be > 1.
GROUP_ESTIMATORS = {"grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "gpg",
                    "reinforce_plus_plus_baseline", "optimal_token_baseline"}
GRPO_FAMILY = {"grpo", "grpo_passk", "grpo_vectorized"}
KL_TYPES = re.compile(r"^(kl|k1|abs|mse|k2|low_var_kl|k3|full)\+?$")
# Columns verl's RLHFDataset and default reward managers read, besides the prompt column.
READ_COLUMNS = ("reward_model", "extra_info")
DOMINATED = 0.5
# Keys whose verl type is a union (FSDP2's reshard_after_forward: True, False or an int).
MIXED_TYPES = {"reshard_after_forward"}  # a column more than half null/empty carries no signal for the trainer
GiB = 1 << 30


@dataclass
class Result:
    group: str
    name: str
    status: str
    reason: str
    fix: str = ""
    details: dict = field(default_factory=dict)


@dataclass
class Options:
    table: str | None = None
    pubkey: str | None = None
    insecure: bool = False
    probe_timeout: float = 600.0
    ray_timeout: float = 90.0
    gpus: Callable[[], list[dict] | None] | None = None  # injectable for unit tests
    gpus_smi: Callable[[], list[dict]] | None = None  # nvidia-smi's view (driver, compute capability)


# --------------------------------------------------------------------------- helpers


def _as_list(v: Any) -> list:
    if v is None or v == "":
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _num(cfg: VerlConfig, key: str, default: float, kind=int):
    """A numeric setting; a value of the wrong type falls back to the default (config.keys and verl
    itself report the type; doctor's other checks should still run)."""
    v = cfg.get(key)
    if isinstance(v, bool) or v is None:
        return default
    try:
        return kind(v)
    except (TypeError, ValueError):
        return default


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.lower() == "true")


def local_gpus() -> list[dict] | None:
    """GPUs torch sees here: [{'name', 'total'}]; None when torch is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    # No GPU device node (NVIDIA, ROCm, WSL): skip importing torch, which alone takes seconds.
    if not any(os.path.exists(d) for d in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")):
        return []
    try:
        import torch
    except Exception:
        return None
    try:
        if not torch.cuda.is_available():
            return []
        return [{"name": torch.cuda.get_device_name(i), "total": torch.cuda.get_device_properties(i).total_memory}
                for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def model_facts(path: Any) -> dict | None:
    """Weights size and KV bytes per token from a local HF model folder, None if not local/readable."""
    if not isinstance(path, str) or not path:
        return None
    p = Path(path).expanduser()
    try:  # a regular file, bounded: a FIFO named config.json must not hang doctor
        cfg = json.loads(read_bounded(p / "config.json", 1 << 20, "config.json"))
    except (EnvbuildError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    weights = sum(f.stat().st_size for f in p.glob("*.safetensors")) or sum(f.stat().st_size for f in p.glob("*.bin"))
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return {"weights": weights, "kv_per_token": None}
    return {"weights": weights, "kv_per_token": 2 * layers * kv_heads * head_dim * 2}  # K and V, bf16


# --------------------------------------------------------------------------- config


def check_config(cfg: VerlConfig, opt: Options) -> list[Result]:
    return [_unknown_keys(cfg), _value_types(cfg)]


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
    only in the config file is added by Hydra and never read by verl: a likely typo, WARN."""
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
        return Result("config", "config.keys", WARN,
                      f"{len(cfg.unknown)} key(s) in the config file are not in the trainer config of {cfg.origin} "
                      "(Hydra adds them; verl never reads them): " + "; ".join(parts),
                      "fix the spelling, or drop the key", details)
    return Result("config", "config.keys", PASS,
                  f"{len(cfg.explicit)} keys set, all in the trainer config of {cfg.origin}", details=details)


# --------------------------------------------------------------------------- GRPO


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
                out.append(Result("grpo", "grpo.kl_loss", WARN,
                                  "use_kl_loss=False set explicitly: GRPO without a KL term to the reference "
                                  "(DAPO-style); the policy can drift freely",
                                  set_fix + " unless KL-free training is intended"))
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

        key = "algorithm.norm_adv_by_std_in_grpo"
        if cfg.is_explicit(key):
            out.append(Result("grpo", "grpo.norm_adv", PASS, f"{key}={cfg.get(key)} chosen explicitly"))
        else:
            out.append(Result("grpo", "grpo.norm_adv", WARN,
                              f"{key} left at its default True: with a skewed reward (groups almost all 0 "
                              "or all 1) dividing by the group std inflates tiny differences into full-size "
                              "advantages (the Dr. GRPO bias)",
                              f"choose explicitly: {key}=True (standard GRPO) or {key}=False (Dr. GRPO)"))

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


# --------------------------------------------------------------------------- FSDP


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
    if a_param and not a_opt and not a_policy:
        global_hint = f", or {a}offload_policy=True (FSDP2)" if strategy == "fsdp2" else ""
        out.append(Result("fsdp", "fsdp.offload", WARN,
                          "param_offload=True without optimizer_offload: parameters move to CPU and back every "
                          "step while the Adam state (2 x fp32 params, the larger part) stays on the GPU",
                          f"set {a}optimizer_offload=True{global_hint}; safer first: {safer}"))
    elif a_policy and strategy != "fsdp2":
        out.append(Result("fsdp", "fsdp.offload", WARN,
                          "offload_policy=True only applies to strategy=fsdp2; with fsdp it is ignored",
                          f"set actor_rollout_ref.actor.strategy=fsdp2 or use {a}param_offload/optimizer_offload"))
    elif a_param or a_opt or a_policy:
        out.append(Result("fsdp", "fsdp.offload", PASS,
                          f"actor offload: param={a_param} optimizer={a_opt} policy={a_policy} (slower steps; "
                          f"alternatives: {safer})"))
    else:
        out.append(Result("fsdp", "fsdp.offload", PASS, "no actor offload"))
    return out


# --------------------------------------------------------------------------- data


def check_data(cfg: VerlConfig, opt: Options) -> list[Result]:
    out: list[Result] = []
    prompt_key = cfg.get("data.prompt_key") or "prompt"
    reward_key = cfg.get("data.reward_fn_key") or "data_source"
    for key in ("data.train_files", "data.val_files"):
        files = _as_list(cfg.get(key))
        if not files:
            status = FAIL if key == "data.train_files" else SKIP
            out.append(Result("data", key, status, f"{key} is empty",
                              f"set {key}=/path/to/file.parquet" if status == FAIL else ""))
            continue
        if not cfg.is_explicit(key) and key == "data.train_files":
            out.append(Result("data", key, WARN, f"{key} left at verl's example default {files}",
                              f"set {key} to your dataset"))
        for f in files:
            out.append(check_parquet(str(f), key, prompt_key, reward_key, cfg))
    return out


def check_parquet(path: str, key: str, prompt_key: str, reward_key: str, cfg: VerlConfig) -> Result:
    name = f"{key}[{path}]"
    if re.match(r"^[a-z][a-z0-9+]*://", path):
        return Result("data", name, SKIP, f"remote path {path} not checked here", "")
    p = Path(path).expanduser().absolute()  # verl resolves relative paths against its working directory
    if not p.exists():
        return Result("data", name, FAIL, f"{p} does not exist", f"fix {key} or create the file")
    if p.is_dir():
        return Result("data", name, FAIL, f"{p} is a directory; verl expects parquet files",
                      f"list the files: {key}=[{p}/a.parquet,{p}/b.parquet]")
    if not p.is_file():  # a FIFO would block the reader forever, a device would stream without end
        return Result("data", name, FAIL, f"{p} is not a regular file; verl expects parquet files",
                      f"point {key} at a parquet file")
    if not os.access(p, os.R_OK):
        return Result("data", name, FAIL, f"{p} is not readable by this user (uid {os.getuid()})",
                      f"chmod a+r {p}")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return Result("data", name, WARN, "pyarrow is not installed: parquet content not checked",
                      "pip install pyarrow (verl's datasets need it anyway)")
    try:
        pf = pq.ParquetFile(p)
    except Exception as e:  # ArrowInvalid, OSError: anything that keeps verl from reading it
        return Result("data", name, FAIL, f"{p} is not a readable parquet file: {str(e).splitlines()[0][:200]}",
                      "regenerate it (e.g. with verl's examples/data_preprocess scripts)")
    rows = pf.metadata.num_rows
    cols = pf.schema_arrow.names
    details: dict = {"rows": rows, "columns": cols}
    if rows == 0:
        return Result("data", name, FAIL, f"{p} has 0 rows: training would run zero steps",
                      "regenerate the dataset", details)
    if prompt_key not in cols:
        guess = [c for c in cols if c.lower() in ("prompt", "question", "problem", "query", "messages", "input")]
        fix = f"set data.prompt_key={guess[0]}" if guess else "set data.prompt_key to the prompt column"
        return Result("data", name, FAIL, f"{p} has no column {prompt_key!r} (data.prompt_key); columns: {cols}",
                      fix, details)
    read = [prompt_key] + [c for c in (reward_key, *READ_COLUMNS) if c in cols and c != prompt_key]
    try:
        empty = _empty_fractions(pf, read)
        details["sample"] = _sample(pf, read)
    except Exception as e:  # a valid footer over corrupt pages: verl would fail mid-epoch
        return Result("data", name, FAIL, f"{p}: rows cannot be read: {str(e).splitlines()[0][:200]}",
                      "regenerate the file", details)
    details["empty_fraction"] = empty
    problems = [f"{c} {empty[c]:.0%} null/empty" for c in read if empty[c] > DOMINATED]
    summary = f"{rows} rows, columns {cols}"
    if problems:
        return Result("data", name, FAIL, f"{summary}; dominated by nulls/empty: {', '.join(problems)}",
                      "drop or fix those rows before training", details)
    notes = []
    if empty[prompt_key] > 0:
        notes.append(f"{empty[prompt_key]:.1%} of {prompt_key!r} null/empty")
    missing = [c for c in (reward_key, "reward_model") if c not in cols]
    if missing and key == "data.train_files":
        notes.append(f"no column {missing} (verl's default reward managers read {reward_key!r} and "
                     "reward_model.ground_truth)")
    ptype = str(pf.schema_arrow.field(prompt_key).type)
    if not ptype.startswith(("list", "large_list")):
        notes.append(f"{prompt_key!r} is {ptype}, not a list of chat messages [{{role, content}}] as RLHFDataset "
                     "expects")
    bs = cfg.get("data.train_batch_size")
    if key == "data.train_files" and isinstance(bs, int) and rows < bs:
        return Result("data", name, FAIL,
                      f"{rows} rows < data.train_batch_size={bs}: the dataloader drops the last partial batch, "
                      "so an epoch has zero steps", "lower data.train_batch_size or add rows", details)
    if notes:
        return Result("data", name, WARN, f"{summary}; " + "; ".join(notes),
                      "fix the dataset or point data.prompt_key / data.reward_fn_key at the right columns", details)
    return Result("data", name, PASS, summary, details=details)


def _is_empty(v: Any) -> bool:
    return v is None or (isinstance(v, (str, list, dict, bytes)) and len(v) == 0)


def _empty_fractions(pf, columns: list[str]) -> dict[str, float]:
    """Share of rows whose value is null or empty (string, list, struct with all-null fields)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad = dict.fromkeys(columns, 0)
    total = 0
    for batch in pf.iter_batches(columns=columns, batch_size=65536):
        total += batch.num_rows
        for c in columns:
            arr = batch.column(c)
            t = arr.type
            mask = pc.is_null(arr)
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                mask = pc.or_(mask, pc.equal(pc.utf8_length(pc.fill_null(arr, "")), 0))
            elif pa.types.is_list(t) or pa.types.is_large_list(t):
                mask = pc.or_(mask, pc.equal(pc.fill_null(pc.list_value_length(arr), 0), 0))
            elif pa.types.is_struct(t) and t.num_fields:
                # reward_model: {ground_truth, style}: empty when every field is null/empty
                sub = [pc.struct_field(arr, [i]) for i in range(t.num_fields)]
                allnull = None
                for s in sub:
                    e = pc.is_null(s)
                    if pa.types.is_string(s.type) or pa.types.is_large_string(s.type):
                        e = pc.or_(e, pc.equal(pc.utf8_length(pc.fill_null(s, "")), 0))
                    allnull = e if allnull is None else pc.and_(allnull, e)
                mask = pc.or_(mask, allnull)
            bad[c] += pc.sum(pc.cast(pc.fill_null(mask, True), pa.int64())).as_py() or 0
    return {c: (bad[c] / total if total else 1.0) for c in columns}


def _sample(pf, columns: list[str]) -> dict:
    batch = next(pf.iter_batches(columns=columns, batch_size=1))
    row = batch.to_pylist()[0]
    return {k: (repr(v)[:300]) for k, v in row.items()}


# --------------------------------------------------------------------------- output dirs


def check_output(cfg: VerlConfig, opt: Options) -> list[Result]:
    out = []
    facts = model_facts(cfg.get("actor_rollout_ref.model.path"))
    for key in ("trainer.default_local_dir", "trainer.rollout_data_dir", "trainer.validation_data_dir"):
        d = cfg.get(key)
        if d in (None, ""):
            continue
        d = str(d)
        if re.match(r"^[a-z][a-z0-9+]*://", d):
            out.append(Result("output", key, SKIP, f"remote path {d} not checked here"))
            continue
        # rough size of one FSDP checkpoint: fp32 params + Adam's two fp32 moments = 6 x bf16 weights
        need = 6 * facts["weights"] if facts and facts["weights"] and key == "trainer.default_local_dir" else None
        out.append(check_writable(d, key, need))
    hdfs = cfg.get("trainer.default_hdfs_dir")
    if hdfs:
        out.append(Result("output", "trainer.default_hdfs_dir", SKIP, f"{hdfs}: remote, not checked here"))
    return out


def check_writable(path: str, key: str, need_bytes: int | None = None) -> Result:
    """Create the directory, write + fsync + rename + remove a file there; leave nothing behind."""
    p = Path(path).expanduser().absolute()
    missing = []
    cur = p
    while not cur.exists() and cur != cur.parent:
        missing.append(cur)
        cur = cur.parent
    if not cur.is_dir():
        return Result("output", key, FAIL, f"{cur} exists and is not a directory", f"point {key} elsewhere")
    created: list[Path] = []
    token = f".envbuild-doctor-{os.getpid()}-{secrets.token_hex(4)}"
    tmp, final = p / (token + ".tmp"), p / token
    step = "mkdir"
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        step = "write"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"envbuild doctor write test\n" * 64)
            step = "fsync"
            os.fsync(fd)
        finally:
            os.close(fd)
        step = "rename"
        os.replace(tmp, final)
        dfd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        step = "remove"
        os.unlink(final)
    except OSError as e:
        return Result("output", key, FAIL,
                      f"{p}: {step} failed: {e.strerror or e} (as uid {os.getuid()})",
                      f"make {e.filename or p} writable for this user, or point {key} elsewhere")
    finally:
        for f in (tmp, final):
            try:
                f.unlink()
            except OSError:
                pass
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
    free = shutil.disk_usage(p if p.exists() else cur).free
    details = {"path": str(p), "free": free, "needed_estimate": need_bytes}
    msg = f"{p} writable atomically (write, fsync, rename, remove); {_gib(free)} free"
    if need_bytes and free < need_bytes:
        return Result("output", key, WARN, msg + f", one checkpoint needs roughly {_gib(need_bytes)}",
                      "free space, set trainer.max_actor_ckpt_to_keep, or point it at a larger disk", details)
    if free < GiB:
        return Result("output", key, WARN, msg + " (less than 1 GiB)", "free space or point it elsewhere", details)
    return Result("output", key, PASS, msg, details=details)


# --------------------------------------------------------------------------- Ray and ports


def ray_address(cfg: VerlConfig) -> tuple[str | None, str]:
    for key in ("ray_kwargs.ray_init.address", "ray_init.address"):
        v = cfg.get(key)
        if v:
            return str(v), key
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    return None, ""


_RAY_QUERY = r"""
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
nodes = [{"ip": n.get("NodeManagerAddress"), "gpus": n.get("Resources", {}).get("GPU", 0)}
         for n in ray.nodes() if n.get("Alive")]
print("ENVBUILD-RAY " + json.dumps({"version": ray.__version__, "nodes": nodes,
                                    "gpus": ray.cluster_resources().get("GPU", 0)}))
ray.shutdown()
"""


def check_ray(cfg: VerlConfig, opt: Options) -> list[Result]:
    out: list[Result] = []
    nnodes = _num(cfg, "trainer.nnodes", 1)
    per_node = _num(cfg, "trainer.n_gpus_per_node", 0)
    want = f"trainer.nnodes={nnodes} x n_gpus_per_node={per_node}"
    addr, src = ray_address(cfg)
    if not addr or addr == "local":
        if nnodes > 1:
            out.append(Result("ray", "ray.cluster", FAIL,
                              f"{want} but no Ray address: verl would start a one-machine Ray instance",
                              "start the cluster and set +ray_kwargs.ray_init.address=HOST:PORT (verl <= 0.4: "
                              "+ray_init.address) or RAY_ADDRESS"))
        else:
            out.append(Result("ray", "ray.cluster", SKIP, "no Ray address configured: verl starts Ray on this machine"))
    else:
        out.append(_query_ray(addr, src, nnodes, per_node, want, opt))
    out.append(check_rollout_ports(cfg))
    return out


def _query_ray(addr: str, src: str, nnodes: int, per_node: int, want: str, opt: Options) -> Result:
    m = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", addr)
    if m:  # fail fast when nothing listens, instead of waiting for ray.init's retries
        try:
            socket.create_connection((m.group(1), int(m.group(2))), timeout=3).close()
        except OSError as e:
            return Result("ray", "ray.cluster", FAIL, f"{addr} (from {src}) does not answer: {e.strerror or e}",
                          "start the head (`ray start --head --port PORT`) or fix the address")
    try:
        import importlib.util
        if importlib.util.find_spec("ray") is None:
            return Result("ray", "ray.cluster", FAIL, "ray is not installed in this Python; verl's trainer needs it",
                          "pip install 'ray[default]'")
    except (ImportError, ValueError):
        pass
    try:
        p = subprocess.run([sys.executable, "-c", _RAY_QUERY, addr], capture_output=True, text=True,
                           timeout=opt.ray_timeout, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    except subprocess.TimeoutExpired:
        return Result("ray", "ray.cluster", FAIL, f"{addr} (from {src}): no answer within {opt.ray_timeout:.0f}s",
                      "check the address and that this machine can reach the head's GCS port")
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ENVBUILD-RAY ")), None)
    if p.returncode != 0 or not line:
        err = [ln for ln in (p.stderr or "").splitlines() if ln.strip()]
        why = err[-1][:300] if err else f"exit {p.returncode}"
        return Result("ray", "ray.cluster", FAIL, f"{addr} (from {src}): ray.init failed: {why}",
                      "check the address, and that Ray and Python match the cluster's versions")
    info = json.loads(line.split(" ", 1)[1])
    fits = sum(1 for n in info["nodes"] if n["gpus"] >= per_node)
    total = info["gpus"]
    msg = (f"{addr} answers (Ray {info['version']}, {len(info['nodes'])} node(s), {total:g} GPUs); "
           f"needs {want}")
    if fits < nnodes:
        return Result("ray", "ray.cluster", FAIL,
                      msg + f": only {fits} node(s) have {per_node} GPUs (verl places n_gpus_per_node per node)",
                      "add nodes/GPUs or lower trainer.nnodes / trainer.n_gpus_per_node", info)
    return Result("ray", "ray.cluster", PASS, msg, details=info)


def rollout_ports(cfg: VerlConfig) -> tuple[str, list[int]]:
    """Fixed ports the rollout engine binds on each node. verl's SGLang rollout starts one engine per
    rank at port 30000 + rank; vLLM and HF rollouts pick free ports at run time."""
    name = str(cfg.get("actor_rollout_ref.rollout.name") or "")
    if name.startswith("sglang"):
        per_node = max(1, _num(cfg, "trainer.n_gpus_per_node", 1))
        return name, list(range(30000, 30000 + per_node))
    return name, []


def port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def check_rollout_ports(cfg: VerlConfig, ports: list[int] | None = None) -> Result:
    name, fixed = rollout_ports(cfg)
    ports = fixed if ports is None else ports
    if not ports:
        return Result("ray", "ray.rollout_ports", SKIP, f"rollout.name={name}: the engine picks free ports itself")
    busy = [p for p in ports if not port_free(p)]
    if busy:
        return Result("ray", "ray.rollout_ports", FAIL,
                      f"rollout.name={name} binds ports {ports[0]}-{ports[-1]} on each node; in use here: {busy}",
                      f"stop what listens there (`ss -ltnp 'sport = :{busy[0]}'`)", {"busy": busy})
    return Result("ray", "ray.rollout_ports", PASS, f"ports {ports[0]}-{ports[-1]} for {name} are free here")


# --------------------------------------------------------------------------- environment


def probe_available() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("envbuild.probe.__main__") is not None
    except (ImportError, ValueError):
        return False


def check_env(cfg: VerlConfig, opt: Options) -> list[Result]:
    engine = str(cfg.get("actor_rollout_ref.rollout.name") or "vllm")
    engine = "sglang" if engine.startswith("sglang") else ("vllm" if engine.startswith("vllm") else engine)
    out = [run_probe(engine, opt)]
    out += check_host(out[0].details.get("verdict") or {}, opt)
    if opt.table:
        versions = out[0].details.get("versions") or installed_versions(engine)
        out.append(check_table(opt, engine, versions))
    return out


def nvidia_gpus() -> list[dict]:
    """[{'name', 'driver', 'sm'}] from nvidia-smi; [] without an NVIDIA driver here."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        p = subprocess.run([exe, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in p.stdout.splitlines() if p.returncode == 0 else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3:
            out.append({"name": parts[0], "driver": parts[1], "sm": parse_sm(parts[2])})
    return out


def _ver_tuple(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def check_host(verdict: dict, opt: Options, shm_path: str = "/dev/shm") -> list[Result]:
    """What the stack needs from this host (the row's `hardware`): /dev/shm, the NVIDIA driver for
    the installed torch's CUDA, and kernels for this host's GPU in every extension."""
    out = []
    try:
        st = os.statvfs(shm_path)
        shm = st.f_frsize * st.f_blocks
    except OSError:
        shm = None
    if shm is None:
        out.append(Result("env", "env.shm", WARN, f"{shm_path} is missing: NCCL and Ray keep buffers there"))
    elif shm < MIN_SHM_BYTES:
        out.append(Result("env", "env.shm", FAIL, f"{shm_path} holds {shm >> 20} MiB; NCCL and Ray need "
                          f"≥ {MIN_SHM_BYTES >> 20} MiB (Docker's default 64 MB fails at the first collective)",
                          "docker run --shm-size=16g (or --ipc=host); on Kubernetes an emptyDir with medium: Memory"))
    else:
        out.append(Result("env", "env.shm", PASS, f"{shm_path}: {shm >> 20} MiB"))
    gpus = (opt.gpus_smi or nvidia_gpus)()
    versions = verdict.get("versions") or {}
    need = drivers.min_driver(versions.get("torch_cuda")) if versions.get("torch_cuda") else None
    if gpus and need:
        have = gpus[0]["driver"]
        if _ver_tuple(have) >= _ver_tuple(need):
            out.append(Result("env", "env.driver", PASS, f"NVIDIA driver {have} ≥ {need} (CUDA {versions['torch_cuda']})"))
        else:
            floor = drivers.MINOR_COMPAT_FLOOR.get(str(versions["torch_cuda"]).split(".")[0])
            out.append(Result("env", "env.driver", FAIL if not floor or _ver_tuple(have) < _ver_tuple(floor) else WARN,
                              f"NVIDIA driver {have} is older than {need}, the minimum for CUDA {versions['torch_cuda']}",
                              "update the driver, use an image of an older CUDA (envbuild pick --cuda ...), or the "
                              "forward-compatibility package (cuda-compat) on data-center GPUs"))
    arch = ((verdict.get("hardware") or {}).get("gpu_arch") or {})
    if gpus and arch.get("supports") is not None:
        sm = gpus[0]["sm"]
        if sm is not None and f"sm_{sm}" not in arch["supports"]:
            lacking = (arch.get("lacking") or {}).get(f"sm_{sm}") or []
            out.append(Result("env", "env.gpu-arch", FAIL, f"{gpus[0]['name']} (sm_{sm}) has no kernels in "
                              f"{', '.join(lacking) or 'some extension'}: 'no kernel image is available' at run time",
                              f"envbuild pick --gpu sm_{sm} ..."))
        elif sm is not None:
            out.append(Result("env", "env.gpu-arch", PASS, f"every extension has kernels for {gpus[0]['name']} (sm_{sm})"))
    return out


def run_probe(engine: str, opt: Options) -> Result:
    if engine not in ("vllm", "sglang", "hf"):
        return Result("env", "env.probe", SKIP, f"rollout.name={engine}: the probe knows vllm, sglang, hf")
    if not probe_available():
        return Result("env", "env.probe", WARN, "probe not available (envbuild.probe has no __main__ here)",
                      "install an envbuild with the probe, or run `envbuild probe` on the image")
    from .probe_run import probe_here  # the one probe path (envbuild.probe_run)

    v = probe_here(level="contract", engine=engine, expect={}, timeout=opt.probe_timeout)
    if v.get("status") == "timeout":
        return Result("env", "env.probe", FAIL,
                      f"probe (env + contract) did not finish in {opt.probe_timeout:.0f}s",
                      f"run `envbuild probe --here --level contract --engine {engine}` by hand to see where")
    if v.get("cause") in ("no-verdict", "bad-verdict"):
        tail = (v["checks"][0].get("detail") or "").strip().splitlines()[-1:] or ["no output"]
        return Result("env", "env.probe", WARN, f"probe wrote no verdict: {tail[0][:300]}",
                      f"run `envbuild probe --here --level contract --engine {engine}` by hand")
    status = v.get("status")
    bad = [c for c in v.get("checks", []) if c.get("status") not in ("pass", "not-applicable", "skipped")]
    names = ", ".join(f"{c['name']} ({c.get('cause') or c['status']})" for c in bad[:5])
    details = {"verdict": v, "versions": v.get("versions", {})}
    n = len(v.get("checks", []))
    if status == "pass":
        return Result("env", "env.probe", PASS, f"probe env+contract for {engine}: {n} checks pass", details=details)
    if status == "needs-gpu":
        return Result("env", "env.probe", WARN, f"probe env+contract for {engine}: some checks need a GPU: {names}",
                      "run doctor on a GPU machine for a full verdict", details)
    if status == "fail":
        return Result("env", "env.probe", FAIL, f"probe env+contract for {engine} fails: {names}",
                      "use a verified image (`envbuild pick`) or fix the versions the probe names", details)
    return Result("env", "env.probe", WARN, f"the probe itself errored ({names or status})",
                  "report it with the verdict JSON (--json)", details)


def installed_versions(engine: str) -> dict:
    """Versions without importing the heavy packages (the probe's numbers are preferred when it ran)."""
    from importlib import metadata

    out: dict = {"python": ".".join(map(str, sys.version_info[:2]))}
    for dist in ("verl", "torch", engine):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec and spec.submodule_search_locations:
            text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", text, re.M)
            out["torch_cuda"] = m.group(1) if m else None
    except (OSError, ImportError, ValueError):
        pass
    return out


def _cuda(v: Any) -> str:
    return parse_cuda(v) or ""  # the one CUDA parser (envbuild.vocab): cu124 == 12.4 == 12.4.1


def _release(v: Any) -> str:
    return str(v or "").split("+", 1)[0]


def check_table(opt: Options, engine: str, versions: dict) -> Result:
    try:
        from .verify import load_table
    except ImportError as e:
        return Result("env", "env.table", WARN, f"table verification not available ({e})",
                      "update envbuild (envbuild.verify.load_table)")
    try:
        table = load_table(opt.table, pubkey=opt.pubkey, insecure=opt.insecure)
    except EnvbuildError as e:
        return Result("env", "env.table", FAIL, f"table {opt.table} not verified: {e}",
                      "pass the right --pubkey, or fetch the table again")
    except Exception as e:  # a broken signature library etc.: say so, do not crash the other checks
        return Result("env", "env.table", FAIL, f"table {opt.table} not verified: {type(e).__name__}: {e}",
                      "pass the right --pubkey, or fetch the table again")
    py = str(versions.get("python") or "")
    have = {"verl": _release(versions.get("verl")), "engine": engine,
            "engine_version": _release(versions.get(engine)) if engine != "hf" else "",
            "torch": _release(versions.get("torch")), "cuda": _cuda(versions.get("torch_cuda")),
            "python": ".".join(py.split(".")[:2])}
    missing = [k for k in ("verl", "torch") if not have[k]] + (["engine_version"] if engine != "hf" and not
                                                                 have["engine_version"] else [])
    label = (f"verl {have['verl']} + {engine} {have['engine_version']} + torch {have['torch']} "
             f"{have['cuda']} py{have['python']}")
    if missing:
        return Result("env", "env.table", FAIL, f"not installed here: {', '.join(missing)} ({label})",
                      "install the stack, or use a verified image (`envbuild pick`)", {"installed": have})
    for row in table.get("rows", []):
        c = row.get("combo", {})
        if (_release(c.get("verl")) == have["verl"] and c.get("engine") == engine
                and _release(c.get("engine_version") or "") == have["engine_version"]
                and _release(c.get("torch")) == have["torch"] and _cuda(c.get("cuda")) == have["cuda"]
                and str(c.get("python")) == have["python"]):
            order = ("env", "contract", "gpu")  # the table's JSON is key-sorted; report in level order
            raw = row.get("levels") or {}
            ranked = sorted(raw, key=lambda k: order.index(k) if k in order else len(order))
            levels = {k: (raw[k] or {}).get("status") for k in ranked}
            passed = [k for k, s in levels.items() if s == "pass"]
            failed = [k for k, s in levels.items() if s in ("fail", "timeout")]
            d = {"installed": have, "row": row.get("id"), "levels": levels, "row_status": row.get("status")}
            if failed:
                return Result("env", "env.table", FAIL, f"{label} is in the table as broken at {failed}",
                              "switch to a verified combination (`envbuild pick`)", d)
            if passed and opt.insecure:  # unsigned evidence is worth a note, not a pass
                return Result("env", "env.table", WARN, f"{label} passed {passed} in a table whose signature was "
                              "NOT checked (--insecure)", "drop --insecure and pass --pubkey", d)
            if passed:
                return Result("env", "env.table", PASS, f"{label} verified in the signed table at {passed}",
                              details=d)
            return Result("env", "env.table", WARN, f"{label} is in the table but untested ({levels})",
                          "run `envbuild build` / `envbuild probe` for it", d)
    return Result("env", "env.table", WARN, f"{label} does not appear in the signed table",
                  "use a verified combination (`envbuild pick`) or probe this one", {"installed": have})


# --------------------------------------------------------------------------- run

CHECKS: dict[str, Callable[[VerlConfig, Options], list[Result]]] = {
    "config": check_config, "grpo": check_grpo, "fsdp": check_fsdp, "data": check_data,
    "output": check_output, "ray": check_ray, "env": check_env,
}


def diagnose(cfg: VerlConfig, opt: Options, skip: set[str] = frozenset()) -> list[Result]:
    out: list[Result] = []
    for group, fn in CHECKS.items():
        if group not in skip:
            out.extend(fn(cfg, opt))
    return out


def add_arguments(p) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="verl trainer overrides, after `--` (key=value, +key=value, ~key)")
    p.add_argument("--config", help="a verl YAML config; overrides apply on top of it")
    p.add_argument("--verl", metavar="VERSION",
                   help="judge against this verl release's trainer config (default: the installed verl, "
                        "else the newest recorded release)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--skip", action="append", default=[], choices=GROUPS, help="skip a group of checks (repeatable)")
    p.add_argument("--table", help="signed compatibility table (dir, compat.json, .dsse or URL)")
    p.add_argument("--pubkey", help="public key to verify the table with")
    p.add_argument("--insecure", action="store_true",
                   help="skip the table's signature check (a match is then a warning, never a pass)")
    p.add_argument("--probe-timeout", type=float, default=600.0, help="seconds for the probe (default 600)")
    p.add_argument("--ray-timeout", type=float, default=90.0, help="seconds for the Ray query (default 90)")


def run(args) -> int:
    cfg = build_config(args.config, args.overrides, verl=args.verl)
    opt = Options(table=args.table, pubkey=args.pubkey, insecure=args.insecure,
                  probe_timeout=args.probe_timeout, ray_timeout=args.ray_timeout)
    results = diagnose(cfg, opt, set(args.skip))
    failed = any(r.status == FAIL for r in results)
    if args.json:
        given = {k: cfg.get(k) for k in cfg.explicit if k not in cfg.deleted}  # what the user set, resolved
        json.dump({"ok": not failed, "counts": _counts(results), "checks": [asdict(r) for r in results],
                   "config": given}, sys.stdout, indent=2, default=str)
        print()
    else:
        print_report(results)
    return 1 if failed else 0


def _counts(results: list[Result]) -> dict:
    return {s: sum(1 for r in results if r.status == s) for s in (FAIL, WARN, PASS, SKIP)}


def print_report(results: list[Result], file=None) -> None:
    file = file or sys.stdout
    for r in results:
        print(f"{r.status.upper():<4}  {r.name}: {r.reason}", file=file)
        if r.fix and r.status in (FAIL, WARN):
            print(f"      fix: {r.fix}", file=file)
        if r.group == "data" and "sample" in r.details:
            for k, v in r.details["sample"].items():
                print(f"      sample {k}: {v[:160]}", file=file)
    c = _counts(results)
    print(f"envbuild doctor: {c[FAIL]} fail, {c[WARN]} warn, {c[PASS]} pass, {c[SKIP]} skip", file=file)
