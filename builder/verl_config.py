"""verl trainer configuration as `envbuild doctor` sees it: known keys, Hydra-style overrides, merging.

One table (VERL_DEFAULTS) holds the keys of verl's `ppo_trainer.yaml` with their defaults, written as
the YAML nests them. It is the union over verl releases 0.3 - 0.9 (older spellings such as
`ray_init.num_cpus` and newer ones such as `ray_kwargs.ray_init.num_cpus` both appear) so one table
serves every image in the matrix. An empty dict (OPEN) marks a subtree whose keys verl passes through
unchecked (engine kwargs, model override_config, profiler options...): anything below it is accepted.
Strings of the form `${a.b}` / `${oc.select:a.b,default}` are interpolations, resolved on lookup as
OmegaConf would.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError

OPEN: dict = {}  # marker; compared by identity-free emptiness, see _flatten

_FSDP = {
    "wrap_policy": {"min_num_params": 0, "transformer_layer_cls_to_wrap": None},
    "param_offload": False, "optimizer_offload": False, "offload_policy": False,
    "reshard_after_forward": True, "fsdp_size": -1, "forward_prefetch": False, "model_dtype": "fp32",
    "use_orig_params": False, "seed": 42, "full_determinism": False, "ulysses_sequence_parallel_size": 1,
    "entropy_from_logits_with_chunking": False, "entropy_from_logits_chunk_size": 2048,
    "use_torch_compile": True, "entropy_checkpointing": False, "use_no_sync_for_gradient_accumulation": True,
    "pad_to_length": False, "pad_to_length_bucket": 1024, "forward_only": False, "strategy": "fsdp",
    "dtype": "bfloat16", "mixed_precision": {}, "qat": {}, "turbo_config": {},
}
_OPTIM = {
    "optimizer": "AdamW", "optimizer_impl": "torch.optim", "lr": 1e-6, "lr_warmup_steps_ratio": 0.0,
    "total_training_steps": -1, "weight_decay": 0.01, "lr_warmup_steps": -1, "betas": [0.9, 0.999],
    "clip_grad": 1.0, "min_lr_ratio": 0.0, "num_cycles": 0.5, "lr_scheduler_type": "constant",
    "zero_indexed_step": True, "warmup_style": None, "override_optimizer_config": {},
}
_MODEL = {
    "path": "~/models/deepseek-llm-7b-chat", "hf_config_path": None, "tokenizer_path": None,
    "use_shm": False, "trust_remote_code": False, "custom_chat_template": None, "external_lib": None,
    "override_config": {}, "enable_gradient_checkpointing": True, "enable_activation_offload": False,
    "gradient_checkpointing_kwargs": {}, "use_remove_padding": False, "lora_rank": 0, "lora_alpha": 16,
    "target_modules": "all-linear", "exclude_modules": None, "lora_adapter_path": None, "use_liger": False,
    "use_fused_kernels": False, "fused_kernel_options": {}, "tiled_mlp": {}, "mtp": {}, "lora": {},
    "return_last_hidden_state": False, "use_fused_loss": False, "input_tokenizer": None,
    "fsdp_config": dict(_FSDP),  # critic/reward model keep FSDP settings here in verl <= 0.5
}
_CHECKPOINT = {"contents": ["model", "optimizer", "extra"], "save_contents": ["model", "optimizer", "extra"],
               "load_contents": "${.save_contents}", "async_save": False, "strict": True}

VERL_DEFAULTS: dict[str, Any] = {
    "data": {
        "tokenizer": None, "use_shm": False,
        "train_files": "~/data/rlhf/gsm8k/train.parquet", "val_files": "~/data/rlhf/gsm8k/test.parquet",
        "train_max_samples": -1, "val_max_samples": -1,
        "prompt_key": "prompt", "reward_fn_key": "data_source",
        "max_prompt_length": 512, "max_response_length": 512,
        "train_batch_size": 1024, "gen_batch_size": None, "val_batch_size": None,
        "tool_config_path": None, "function_tool_path": None,
        "return_raw_input_ids": False, "return_raw_chat": False, "return_full_prompt": False,
        "shuffle": True, "seed": None, "dataloader_num_workers": 8, "image_patch_size": 14,
        "validation_shuffle": False, "filter_overlong_prompts": False, "filter_overlong_prompts_workers": 1,
        "truncation": "error", "image_key": "images", "video_key": "videos", "audio_key": "audios",
        "trust_remote_code": False, "custom_cls": {"path": None, "name": None},
        "return_multi_modal_inputs": True, "apply_chat_template_kwargs": {}, "mm_processor_kwargs": {},
        "sampler": {"class_path": None, "class_name": None}, "datagen": {"path": None, "name": None},
    },
    "actor_rollout_ref": {
        "hybrid_engine": True, "nccl_timeout": 600,
        "model": dict(_MODEL),
        "actor": {
            "strategy": "fsdp", "rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}",
            "ppo_mini_batch_size": 256, "ppo_micro_batch_size": None, "ppo_micro_batch_size_per_gpu": None,
            "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 16384, "grad_clip": 1.0,
            "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
            "tau_pos": 1.0, "tau_neg": 1.05, "freeze_vision_tower": False,
            "policy_loss": {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0,
                            "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1, "dro_beta": None},
            "loss_agg_mode": "token-mean", "loss_scale_factor": None, "entropy_coeff": 0,
            "calculate_entropy": False, "calculate_sum_pi_squared": False,
            "use_kl_loss": False, "use_prefix_grouper": False, "use_torch_compile": True,
            "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl",
            "ppo_epochs": 1, "shuffle": False, "data_loader_seed": 42, "ulysses_sequence_parallel_size": 1,
            "entropy_from_logits_with_chunking": False, "entropy_from_logits_chunk_size": 2048,
            "entropy_checkpointing": False, "pad_to_length": False, "use_remove_padding": False,
            "use_fused_kernels": False, "checkpoint": dict(_CHECKPOINT), "optim": dict(_OPTIM),
            "fsdp_config": dict(_FSDP), "megatron": {}, "profiler": {}, "router_replay": {}, "qat": {},
        },
        "ref": {
            "strategy": "${actor_rollout_ref.actor.strategy}",
            "rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}",
            "use_torch_compile": "${oc.select:actor_rollout_ref.actor.use_torch_compile,true}",
            "log_prob_micro_batch_size": None, "log_prob_micro_batch_size_per_gpu": None,
            "log_prob_use_dynamic_bsz": "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}",
            "log_prob_max_token_len_per_gpu": "${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}",
            "ulysses_sequence_parallel_size": "${oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1}",
            "entropy_from_logits_with_chunking": False, "entropy_from_logits_chunk_size": 2048,
            "entropy_checkpointing": False, "pad_to_length": False,
            "fsdp_config": {**_FSDP, "forward_only": True}, "megatron": {}, "profiler": {}, "router_replay": {},
        },
        "rollout": {
            "name": "vllm", "mode": "sync", "chat_scheduler": None, "nnodes": 0,
            "n_gpus_per_node": "${oc.select:trainer.n_gpus_per_node,8}",
            "temperature": 1.0, "top_k": -1, "top_p": 1, "use_fire_sampling": False,
            "full_determinism": False, "seed": 42,
            "prompt_length": "${oc.select:data.max_prompt_length,512}",
            "response_length": "${oc.select:data.max_response_length,512}",
            "dtype": "bfloat16", "gpu_memory_utilization": 0.5, "ignore_eos": False, "enforce_eager": True,
            "cudagraph_capture_sizes": None, "free_cache_engine": True, "load_format": "dummy_dtensor",
            "tensor_model_parallel_size": 2, "data_parallel_size": 1, "expert_parallel_size": 1,
            "pipeline_model_parallel_size": 1, "max_num_batched_tokens": 8192, "max_model_len": None,
            "max_num_seqs": 1024, "enable_chunked_prefill": True, "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs", "scheduling_policy": "fcfs", "layered_summon": False,
            "log_prob_micro_batch_size": None, "log_prob_micro_batch_size_per_gpu": None,
            "log_prob_use_dynamic_bsz": "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}",
            "log_prob_max_token_len_per_gpu": "${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}",
            "disable_log_stats": True, "do_sample": True, "n": 1, "over_sample_rate": 0,
            "multi_stage_wake_up": False, "calculate_log_probs": False, "skip_tokenizer_init": False,
            "enable_rollout_routing_replay": False, "moe_load_balance_metrics_interval": 0,
            "quantization": None, "quantization_config_file": None, "limit_images": None,
            "update_weights_bucket_megabytes": 512, "skip_rollout": False, "skip_dump_dir": None,
            "engine_kwargs": {"vllm": {}, "sglang": {}, "trtllm": {}, "swap_space": None},
            "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False},
            "multi_turn": {
                "enable": False, "max_turns": None, "max_assistant_turns": None, "tool_config_path": None,
                "function_tool_path": None, "max_user_turns": None, "max_parallel_calls": 1,
                "max_tool_response_length": 256, "tool_response_truncate_side": "middle",
                "interaction_config_path": None, "use_inference_chat_template": False,
                "tokenization_sanity_check_mode": "strict", "format": "hermes", "num_repeat_rollouts": None,
            },
            "agent": {"num_workers": 8, "default_agent_loop": "single_turn_agent", "agent_loop_config_path": None,
                      "custom_async_server": {"path": None, "name": None}},
            "checkpoint_engine": {}, "trace": {}, "profiler": {}, "prometheus": {}, "mtp": {}, "qat": {},
            "disaggregation": {}, "server": {}, "router": {},
        },
    },
    "critic": {
        "enable": None, "rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}", "strategy": "fsdp",
        "optim": {**_OPTIM, "lr": 1e-5}, "model": dict(_MODEL), "fsdp": dict(_FSDP), "megatron": {},
        "ppo_mini_batch_size": "${oc.select:actor_rollout_ref.actor.ppo_mini_batch_size,256}",
        "ppo_micro_batch_size": None, "ppo_micro_batch_size_per_gpu": None,
        "forward_micro_batch_size": None, "forward_micro_batch_size_per_gpu": None,
        "use_dynamic_bsz": "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}",
        "ppo_max_token_len_per_gpu": 32768, "forward_max_token_len_per_gpu": 32768,
        "ulysses_sequence_parallel_size": 1, "ppo_epochs": 1, "shuffle": False, "data_loader_seed": 42,
        "grad_clip": 1.0, "cliprange_value": 0.5, "loss_agg_mode": "token-mean", "loss_scale_factor": None,
        "checkpoint": dict(_CHECKPOINT), "profiler": {},
    },
    "reward_model": {
        "enable": False, "enable_resource_pool": None, "strategy": "fsdp", "num_workers": None,
        "n_gpus_per_node": None, "nnodes": None,
        "model": dict(_MODEL), "micro_batch_size": None, "micro_batch_size_per_gpu": None, "max_length": None,
        "ulysses_sequence_parallel_size": 1, "use_dynamic_bsz": False, "forward_max_token_len_per_gpu": 32768,
        "reward_manager": "naive", "launch_reward_fn_async": False, "sandbox_fusion": {},
        "reward_loop_source": None, "reward_loop_module_path": None, "reward_loop_class_name": None,
        "rollout": {}, "profiler": {}, "reward_kwargs": {}, "use_reward_loop": None,
    },
    "reward": {}, "sandbox_fusion": {}, "distillation": {}, "transfer_queue": {}, "skip": {},
    "global_profiler": {}, "model_engine_server": {}, "topology": {},
    "custom_reward_function": {"path": None, "name": "compute_score", "reward_kwargs": {}},
    "algorithm": {
        "gamma": 1.0, "lam": 1.0, "adv_estimator": "gae", "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False, "kl_penalty": "kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1},
        "use_pf_ppo": False, "pf_ppo": {"reweight_method": "pow", "weight_pow": 2.0},
        "filter_groups": {"enable": False, "metric": None, "max_num_gen_batches": 0,
                          "max_inflight_gen_batches": 1},
        "rollout_correction": {}, "rollout_is": {},
    },
    "trainer": {
        "balance_batch": True, "total_epochs": 30, "total_training_steps": None,
        "project_name": "verl_examples", "experiment_name": "gsm8k", "logger": ["console", "wandb"],
        "log_val_generations": 0, "log_train_generations": 0, "rollout_data_dir": None, "validation_data_dir": None,
        "nnodes": 1, "n_gpus_per_node": 8, "save_freq": -1, "esi_redundant_time": 0,
        "resume_mode": "auto", "resume_from_path": None, "val_before_train": True, "val_only": False,
        "test_freq": -1, "critic_warmup": 0, "default_hdfs_dir": None, "del_local_ckpt_after_load": False,
        "default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "max_actor_ckpt_to_keep": None, "max_critic_ckpt_to_keep": None,
        "ray_wait_register_center_timeout": 300, "device": "cuda", "use_legacy_worker_impl": "auto",
        "use_v1": False, "v1": {}, "profile_steps": None, "controller_nsight_options": {},
        "worker_nsight_options": {}, "npu_profile": {}, "rollout_data_dir_max_samples": None,
    },
    # verl <= 0.4: `ray_init`; later: `ray_kwargs.ray_init`. `address` is not in verl's YAML (users
    # add it with `+ray_init.address=...`) but ray.init reads it, so it is known here.
    "ray_init": {"num_cpus": None, "address": None, "timeline_json_file": None, "runtime_env": {}},
    "ray_kwargs": {"ray_init": {"num_cpus": None, "address": None, "runtime_env": {}},
                   "timeline_json_file": None},
}

# Hydra's own top-level entries in a config file, not trainer keys.
_META_KEYS = {"defaults", "hydra", "_self_"}


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v  # a leaf, or {} = an open subtree
    return out


KNOWN: dict[str, Any] = _flatten(VERL_DEFAULTS)
_OPEN = {k for k, v in KNOWN.items() if isinstance(v, dict)}


def is_known(key: str) -> bool:
    if key in KNOWN or key.split(".")[-1] == "_target_":
        return True
    parts = key.split(".")
    for i in range(1, len(parts)):  # below an open subtree, or a subtree of known leaves
        head = ".".join(parts[:i])
        if head in _OPEN:
            return True
    # setting a whole known subtree (data.custom_cls={...}) is fine too
    return any(k.startswith(key + ".") for k in KNOWN)


def suggest(key: str) -> str | None:
    """The closest known key: same parent first (a typo in the last part), then anywhere."""
    parent, _, leaf = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in KNOWN if k.rpartition(".")[0] == parent]
    hit = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if hit:
        return f"{parent}.{hit[0]}" if parent else hit[0]
    # the leaf exists under another parent (actor.use_kl_in_reward -> algorithm.use_kl_in_reward)
    same_leaf = [k for k in KNOWN if k.rpartition(".")[2] == leaf]
    if same_leaf:
        return difflib.get_close_matches(key, same_leaf, n=1, cutoff=0.0)[0]
    hit = difflib.get_close_matches(key, list(KNOWN), n=1, cutoff=0.75)
    return hit[0] if hit else None


# --------------------------------------------------------------------------- override values

_INT = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"^[-+]?(\d[\d_]*\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|inf|nan)$", re.I)


def parse_value(text: str, where: str = "command line", name: str = "value") -> Any:
    """A Hydra override value: null, bools, ints, floats, quoted strings, [lists], {dicts}, else a string."""
    try:
        val, rest = _parse(text.strip(), text)
    except ValueError as e:
        raise InputError(where, None, name, text, str(e)) from None
    if rest.strip():
        if rest.lstrip().startswith(","):  # Hydra reads `a=1,2` as a sweep and refuses it outside -m
            raise InputError(where, None, name, text, "comma-separated values are a Hydra sweep; "
                             "write a list as [a,b] or quote the string")
        raise InputError(where, None, name, text, f"cannot parse after {text[:len(text) - len(rest)]!r}")
    return val


def _split_scalar(s: str) -> tuple[str, str]:
    depth, i = 0, 0
    while i < len(s):
        c = s[i]
        if c in "[{":
            depth += 1
        elif c in "]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        i += 1
    return s[:i], s[i:]


def _parse(s: str, whole: str) -> tuple[Any, str]:
    s = s.lstrip()
    if s[:1] in ("'", '"'):
        q = s[0]
        end = s.find(q, 1)
        if end < 0:
            raise ValueError("unterminated quote")
        return s[1:end], s[end + 1:]
    if s[:1] == "[":
        items, rest = [], s[1:].lstrip()
        if rest.startswith("]"):
            return items, rest[1:]
        while True:
            item, rest = _parse(rest, whole)
            items.append(item)
            rest = rest.lstrip()
            if rest.startswith(","):
                rest = rest[1:]
            elif rest.startswith("]"):
                return items, rest[1:]
            else:
                raise ValueError("unterminated list (missing ']')")
    if s[:1] == "{":
        out, rest = {}, s[1:].lstrip()
        if rest.startswith("}"):
            return out, rest[1:]
        while True:
            k, sep, rest = rest.partition(":")
            if not sep:
                raise ValueError("dict entry without ':'")
            out[k.strip().strip("'\"")], rest = _parse(rest, whole)
            rest = rest.lstrip()
            if rest.startswith(","):
                rest = rest[1:].lstrip()
            elif rest.startswith("}"):
                return out, rest[1:]
            else:
                raise ValueError("unterminated dict (missing '}')")
    tok, rest = _split_scalar(s)
    return _scalar(tok.strip()), rest


def _scalar(tok: str) -> Any:
    low = tok.lower()
    if low == "null":  # Hydra's only null spelling; "None" stays a string, as in Hydra
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    if _INT.match(tok):
        return int(tok.replace("_", ""))
    if _FLOAT.match(tok):
        return float(tok.replace("_", ""))
    return tok


# --------------------------------------------------------------------------- the merged config


@dataclass
class Unknown:
    key: str
    source: str  # "override" or the config file
    suggestion: str | None


@dataclass
class VerlConfig:
    """Flat dotted keys -> values: verl's defaults, then the config file, then the overrides."""

    values: dict[str, Any] = field(default_factory=lambda: {k: v for k, v in KNOWN.items()})
    explicit: dict[str, str] = field(default_factory=dict)  # key -> where the user set it
    unknown: list[Unknown] = field(default_factory=list)
    deleted: set[str] = field(default_factory=set)

    def set(self, key: str, value: Any, source: str, add: bool = False) -> None:
        if isinstance(value, dict) and value and not _is_open(key):
            for k, v in _flatten(value, key + ".").items():
                self.set(k, v, source, add)
            return
        if not add and not is_known(key):
            self.unknown.append(Unknown(key, source, suggest(key)))
        self.values[key] = value
        self.explicit[key] = source
        self.deleted.discard(key)

    def delete(self, key: str, source: str) -> None:
        for k in [k for k in self.values if k == key or k.startswith(key + ".")]:
            del self.values[k]
        self.deleted.add(key)
        self.explicit[key] = source

    def is_explicit(self, key: str) -> bool:
        return key in self.explicit

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self.values:
            return default
        return self._resolve(self.values[key], key, depth=0)

    def _resolve(self, v: Any, key: str, depth: int) -> Any:
        if not isinstance(v, str) or "${" not in v or depth > 10:
            return v
        m = re.fullmatch(r"\$\{(?:oc\.select:)?([^,}]+)(?:,([^}]*))?\}", v.strip())
        if m:
            ref, dflt = m.group(1).strip(), m.group(2)
            if ref.startswith("."):  # relative to the key's parent
                ref = key.rpartition(".")[0] + ref
            if ref in self.values:
                return self._resolve(self.values[ref], ref, depth + 1)
            return _scalar(dflt.strip()) if dflt is not None else None
        # string with embedded interpolations: checkpoints/${trainer.project_name}/...
        return re.sub(r"\$\{([^}]+)\}", lambda mm: str(self._resolve("${" + mm.group(1) + "}", key, depth + 1)), v)


def _is_open(key: str) -> bool:
    return key in _OPEN or any(key.startswith(o + ".") for o in _OPEN)


def apply_override(cfg: VerlConfig, arg: str) -> None:
    """One trainer override: key=value, +key=value (add), ++key=value (add or set), ~key (delete)."""
    if arg.startswith("~"):
        key = arg[1:].split("=", 1)[0].strip()
        if not key:
            raise InputError("command line", None, "override", arg, "empty key after '~'")
        cfg.delete(key, "override")
        return
    key, sep, raw = arg.partition("=")
    if not sep:
        raise InputError("command line", None, "override", arg, "expected key=value (Hydra override syntax)")
    add = key.startswith("+")
    key = key.lstrip("+").strip()
    if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", key):
        raise InputError("command line", None, "override", arg, "not a dotted config key")
    cfg.set(key, parse_value(raw, "command line", key), "override", add=add)


def load_yaml_config(cfg: VerlConfig, path: str | Path) -> None:
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise InputError(str(path), None, "--config", str(path), e.strerror or str(e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(str(path), mark.line + 1 if mark else None, "yaml", "",
                         str(getattr(e, "problem", e))) from None
    if data is None:
        return
    if not isinstance(data, dict):
        raise InputError(str(path), None, "top level", type(data).__name__, "a verl config is a mapping")
    for k, v in data.items():
        if k in _META_KEYS:
            continue
        if isinstance(v, dict) and v and not _is_open(str(k)):
            for fk, fv in _flatten(v, f"{k}.").items():
                cfg.set(fk, fv, str(path))
        else:
            cfg.set(str(k), v, str(path))


def build_config(config_file: str | None, overrides: list[str]) -> VerlConfig:
    cfg = VerlConfig()
    if config_file:
        load_yaml_config(cfg, config_file)
    for o in overrides:
        apply_override(cfg, o)
    return cfg
