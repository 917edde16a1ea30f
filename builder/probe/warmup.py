"""Work for the gpu level started as the probe starts, while the levels below import their
modules: the CUDA context and the first steps' kernels, then, where no other level of this process
imports the stack before the gpu level, the modules the tiny model is built with (transformers'
Qwen2, tokenizers: 3-5 s of the hf gpu level's model build on a cold node). Beside CUDA in a
second thread started once torch is imported (the default), or after it in the same thread: a
thread of their own from the probe's start had slowed env's torch import (the GIL) for no gain on a
CPU machine (bench/probe_warm_import_h100.json), but once torch is in, CUDA's start mostly waits on
the driver (bench/probe_warm_beside_h100.json).
A failure here is never reported from here: the gpu level does the same work again and reports it.

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

_threads: list[threading.Thread] = []
_seconds: dict[str, float] = {}
# beside: the imports run in a second thread from the moment torch is imported, overlapping CUDA's
# start (torch releases the GIL while it waits on the driver); after: they follow CUDA in the
# warm-up thread. Beside was faster cold in all nine pairs of three rounds on H100s, once env's
# GIL-bound reads had moved into children (bench/probe_warm_beside_h100.json).
HOW = ("beside", "after", "no")
DEFAULT = "beside"


def how(choice: str | None = None) -> str:
    """ENVBUILD_PROBE_WARM_IMPORT: beside (the default; yes means the same), after or no."""
    choice = choice or os.environ.get("ENVBUILD_PROBE_WARM_IMPORT") or DEFAULT
    choice = DEFAULT if choice == "yes" else choice
    if choice not in HOW:
        raise ValueError(f"ENVBUILD_PROBE_WARM_IMPORT={choice!r}: expected one of {', '.join(HOW)} (or yes)")
    return choice


def start(dtype: str, modules: tuple[str, ...] = (), beside: bool = False) -> None:
    """Start the warm-up: CUDA, then `modules` in order, in the same thread, or, `beside`, in a
    thread of their own started once torch is imported."""

    def imports():
        t0 = time.perf_counter()
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:
                break  # the gpu level imports it again and reports what is wrong
        _seconds["warm_import"] = round(time.perf_counter() - t0, 4)

    def warm():
        t0 = time.perf_counter()
        try:
            if modules and beside:
                import torch  # noqa: F401  (the imports below need it; CUDA waits on it too)
                _spawn(imports, "probe-warm-import")
            _cuda(dtype)
        except BaseException:
            pass  # the gpu level reports whatever is wrong with CUDA
        _seconds["warm_cuda"] = round(time.perf_counter() - t0, 4)
        if modules and not beside:
            imports()

    _spawn(warm, "probe-warmup")


def _spawn(fn, name: str) -> None:
    t = threading.Thread(target=fn, name=name, daemon=True)
    _threads.append(t)
    t.start()


def wait() -> None:
    """Until every warm-up thread has ended (at once when none was started)."""
    for t in list(_threads):  # the imports' thread is appended while the first one runs
        t.join()
    for t in list(_threads):
        t.join()


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
