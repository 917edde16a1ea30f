"""Work for the gpu level started as the probe starts, in a thread of its own, while the levels
below import their modules: the CUDA context and the first steps' kernels, then, where no other
level of this process imports the stack before the gpu level, the modules the tiny model is built
with (transformers' Qwen2, tokenizers: 3-5 s of the hf gpu level's model build on a cold node).
One thread, CUDA first: imports in a thread of their own beside env's slowed env more than they
gained (they share the GIL; bench/probe_warm_import_h100.json). A failure here is never reported
from here: the gpu level does the same work again and reports it.

The module imports must have the stack to themselves: two threads importing transformers at once
can hand one of them a half-initialised module (its lazy, circular imports), which would read as
a broken stack. So they run only where the contract level is judged in another process (side by
side), and the gpu level waits for them (`wait`) before it builds the model.
"""

from __future__ import annotations

import importlib
import os
import threading
import time

_thread: threading.Thread | None = None
_seconds: dict[str, float] = {}


def wanted(choice: str | None = None) -> bool:
    """ENVBUILD_PROBE_WARM_IMPORT: yes (the default) or no, for measuring one against the other."""
    return (choice or os.environ.get("ENVBUILD_PROBE_WARM_IMPORT") or "yes") != "no"


def start(dtype: str, modules: tuple[str, ...] = ()) -> None:
    """Start the thread: CUDA first (torch releases the GIL while it waits on the device), then
    `modules` in order."""
    global _thread

    def warm():
        t0 = time.perf_counter()
        try:
            _cuda(dtype)
        except BaseException:
            pass  # the gpu level reports whatever is wrong with CUDA
        _seconds["warm_cuda"] = round(time.perf_counter() - t0, 4)
        t0 = time.perf_counter()
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:
                break  # the gpu level imports it again and reports what is wrong
        if modules:
            _seconds["warm_import"] = round(time.perf_counter() - t0, 4)

    _thread = threading.Thread(target=warm, name="probe-warmup", daemon=True)
    _thread.start()


def wait() -> None:
    """Until the thread has ended (at once when none was started)."""
    if _thread is not None:
        _thread.join()


def timings() -> dict[str, float]:
    return dict(_seconds)


def _cuda(dtype: str) -> None:
    """Create the CUDA context and load the kernels of the gpu level's first steps: context
    creation, cuBLAS's handles and the attention kernels' first launch are seconds of the gpu
    level's wall time on a fresh node (the hf rollout's first SDPA call alone took 0.65 s on the
    H200, bench/probe_ab_h200.json)."""
    import torch
    if not torch.cuda.is_available():
        return
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))  # this thread only
    x = torch.ones(64, 64, device="cuda")
    (x @ x).sum().item()
    # The tiny model's shapes in the engine's dtype (tiny_model.py: head_dim 64): a bf16 GEMM,
    # causal attention, the sampler's softmax and draw.
    dt = getattr(torch, dtype)
    w = torch.randn(128, 128, device="cuda", dtype=dt)
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=dt)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.multinomial(torch.softmax((w @ w).float(), -1), 1)
    torch.cuda.synchronize()
