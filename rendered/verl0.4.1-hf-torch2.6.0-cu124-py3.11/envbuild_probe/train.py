"""The trainer side of one GRPO step, as verl does it (small): rule reward, GRPO advantages,
clipped policy loss + low_var_kl to a frozen reference, actor wrapped in FSDP2."""

from __future__ import annotations

import os
import socket


def import_fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4 / 2.5
    return fully_shard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_distributed(device_type: str) -> tuple[int, int, int]:
    """World from torchrun's environment (any size); a plain process is rank 0 of 1."""
    import torch.distributed as dist
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if not dist.is_initialized():
        # A plain process is rank 0 of 1; engines that join this group (vLLM's external_launcher)
        # read these variables themselves.
        for k, val in (("RANK", rank), ("LOCAL_RANK", local), ("WORLD_SIZE", world)):
            os.environ.setdefault(k, str(val))
        if "MASTER_ADDR" not in os.environ:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
    return rank, world, local


def rule_reward(text: str) -> float:
    """A fixed rule on the decoded text: the share of letters from the first half of the alphabet."""
    letters = [c for c in text.lower() if "a" <= c <= "z"]
    return sum(c <= "m" for c in letters) / len(letters) if letters else 0.0


def grpo_advantages(scores, norm_by_std: bool = True, eps: float = 1e-6):
    """scores [groups, n] -> per-response advantages, verl's compute_grpo_outcome_advantage."""
    import torch
    if scores.shape[1] == 1:
        mean, std = torch.zeros_like(scores), torch.ones_like(scores)
    else:
        mean, std = scores.mean(-1, keepdim=True), scores.std(-1, keepdim=True)  # unbiased, as torch.std
    adv = scores - mean
    return adv / (std + eps) if norm_by_std else adv


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum().clamp_min(1)


def low_var_kl(logp, ref_logp):
    """k3 estimator, clamped as verl does."""
    import torch
    kl = torch.clamp(ref_logp - logp, -20, 20)
    return torch.clamp(torch.exp(kl) - kl - 1, -10, 10)


def policy_loss(logp, old_logp, adv, mask, clip: float = 0.2):
    import torch
    ratio = torch.exp(logp - old_logp)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    return masked_mean(torch.maximum(l1, l2), mask), masked_mean((l2 > l1).float(), mask)


def batch_tensors(prompts, groups, pad_id: int, device):
    """Equal-length prompts + right-padded responses -> input_ids [B, L+T], response mask [B, T]."""
    import torch
    L = len(prompts[0])
    rows, masks = [], []
    T = max(len(toks) for g in groups for toks, _ in g)
    for p, g in zip(prompts, groups):
        for toks, _lp in g:
            rows.append(p + toks + [pad_id] * (T - len(toks)))
            masks.append([1.0] * len(toks) + [0.0] * (T - len(toks)))
    return torch.tensor(rows, device=device), torch.tensor(masks, device=device), L


def response_logprobs(model, input_ids, L: int):
    """Per-token logprobs of the response part, fp32. Causal attention: right padding is harmless."""
    import torch
    logits = model(input_ids=input_ids).logits[:, L - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, L:].unsqueeze(-1)).squeeze(-1)


def shard_actor(model, world: int, device_type: str):
    from torch.distributed.device_mesh import init_device_mesh
    fully_shard = import_fully_shard()
    mesh = init_device_mesh(device_type, (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_state(model):
    """(name, full tensor) per parameter; a collective on every rank under FSDP2."""
    out = []
    for name, p in model.named_parameters():
        t = p.data
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out.append((name, t.detach().clone()))
    return out
