"""doctor's shared pieces: a check's Result, the Options, and small readers of the config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import EnvbuildError
from ..verl_config import VerlConfig
from ..yamlsafe import read_bounded

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
GROUPS = ("config", "grpo", "fsdp", "data", "output", "ray", "env")
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
    platform: str | None = None  # the platform whose row the table check reads (default: this machine's)


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
    # No accelerator here (host.gpu_present: the one check): skip importing torch, which alone takes seconds.
    from .. import host

    if not host.gpu_present():
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


