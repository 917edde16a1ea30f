"""Classify failure messages into a status and a cause, naming the symbol/module/library.

The classes come from what broken stacks really print (see shared/reference/probe.md):
a missing driver means "needs a GPU", everything else that stops an import is a broken stack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .vocab import ENGINE, FAIL, NEEDS_GPU, NEEDS_HOME, NEEDS_NETWORK, NOT_APPLICABLE, engine_of_module
from .hardware import ACCELERATORS
# Optional backends verl supports but a combination need not include: their absence is not a failure.
OPTIONAL_BACKENDS = {
    "megatron", "mbridge", "transformer_engine", "apex", "torch_npu", "mindspeed", "vllm_ascend",
    "tensorrt_llm", "trtllm", "lmdeploy", "deepspeed", "liger_kernel", "flash_attn_interface",
    "trl", "peft", "mcore", "nemo", "torchtitan",
}


def _other_engine(top: str, engine: str | None) -> bool:
    """A module of an engine the probe knows, other than this combination's."""
    owner = engine_of_module(top)
    return owner is not None and owner != engine and top not in ENGINE.get(engine or "", ENGINE["hf"]).modules


@dataclass
class Classified:
    status: str
    cause: str
    detail: str


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _demangle(sym: str) -> str:
    from .elfsyms import demangle  # local: keeps this module importable on its own
    return demangle([sym]).get(sym, sym)


def classify_message(text: str, engine: str | None = None) -> Classified:
    """Map one error message (exception text or stderr tail) to a status and cause."""
    t = text or ""
    # Driver-level: this host has no GPU. Not broken, cannot be judged here.
    for kind in ACCELERATORS.values():  # each accelerator's own words for "no device here"
        if kind.driver_lib:
            m = re.search(rf"({re.escape(kind.driver_lib)}\.so(?:\.\d+)*): cannot open shared object file", t)
            if m:
                return Classified(NEEDS_GPU, "no-driver", f"{m.group(1)} not found: needs the {kind.driver_label}")
    for pat, why in (
        *(nd for kind in ACCELERATORS.values() for nd in kind.no_device),
        (r"Device string must not be empty", "no device (engine config needs a GPU)"),
        # sgl-kernel picks its common_ops build by the GPU it sees; with none it loads none. (On a
        # GPU it cannot serve, the gpu level fails it: needs-gpu decides nothing.)
        (r"Could not load any common_ops library", "kernel package found no GPU to pick its library for"),
    ):
        if re.search(pat, t):
            return Classified(NEEDS_GPU, "needs-gpu", why)
    net = _network(t)
    if net is not None:
        return Classified(NEEDS_NETWORK, "needs-network", net)
    m = re.search(r"(Read-only file system|Permission denied): '([^']+)'", t)
    if m and _under_home(m.group(2)):
        return Classified(NEEDS_HOME, "needs-writable-home", f"writes {m.group(2)} ({m.group(1)})")
    if "no kernel image is available for execution on the device" in t:
        return Classified(FAIL, "no-kernel-image", "wheel not built for this GPU architecture")
    m = re.search(r"undefined symbol: (\S+)", t)
    if m:
        sym = m.group(1).rstrip(",.;'\"")
        return Classified(FAIL, "undefined-symbol",
                          f"undefined symbol {_demangle(sym)} ({sym}): built against another torch/library")
    m = re.search(r"(GLIBC(?:XX)?_[\d.]+)' not found", t) or re.search(r"(GLIBC(?:XX)?_[\d.]+) not found", t)
    if m:
        return Classified(FAIL, "glibc-too-old", f"{m.group(1)} not found: base image's C library is too old")
    m = re.search(r"(lib(?:cudart|cublas|cublasLt|cudnn\w*|nccl|nvrtc|cufft|curand|cusparse\w*|cusolver|"
                  r"nvJitLink|nvToolsExt|cupti|cufile|nvshmem\w*)[\w.\-]*\.so[\d.]*): cannot open", t)
    if m:
        return Classified(FAIL, "cuda-runtime-missing",
                          f"{m.group(1)} not found: CUDA runtime missing or of another major version")
    m = re.search(r"(\S+\.so[\d.]*): cannot open shared object file", t)
    if m:
        return Classified(FAIL, "library-missing", f"{m.group(1)} not found")
    m = re.search(r"No module named '([\w.]+)'", t)
    if m:
        mod = m.group(1)
        top = mod.split(".")[0]
        if _other_engine(top, engine):
            return Classified(NOT_APPLICABLE, "other-engine", f"needs {mod} (engine not in this combination)")
        if top in OPTIONAL_BACKENDS and engine_of_module(top) is None:
            # (a module an engine descriptor claims is that engine's: missing from its own
            # combination it is a failure, never "an optional backend")
            return Classified(NOT_APPLICABLE, "optional-backend", f"needs {mod} (optional backend not installed)")
        return Classified(FAIL, "module-missing", f"No module named {mod!r}")
    # importlib.metadata.version("vllm") in verl.third_party.vllm when vLLM is not installed
    m = re.search(r"No package metadata was found for ([\w.\-]+)", t)
    if m:
        pkg = m.group(1)
        if _other_engine(pkg.replace("-", "_").lower(), engine):
            return Classified(NOT_APPLICABLE, "other-engine", f"needs the {pkg} package (engine not in this combination)")
        return Classified(FAIL, "package-missing", f"package {pkg} is not installed")
    m = re.search(r"cannot import name '([\w.]+)' from '([\w.]+)'", t)
    if m:
        return Classified(FAIL, "import-error", f"cannot import {m.group(1)} from {m.group(2)} (API drift)")
    if re.search(r"CUDA out of memory|OutOfMemoryError", t):
        return Classified(FAIL, "gpu-oom", _first_line(t))
    if re.search(r"\bImportError\b|\bModuleNotFoundError\b", t):
        return Classified(FAIL, "import-error", _first_line(t))
    return Classified(FAIL, "exception", _first_line(t)[:500])


# What an import that reaches for the network prints when the host is offline (or the probe's
# guard refused the connection): requests/urllib3, urllib, huggingface_hub, DNS.
_NETWORK = re.compile(
    r"envbuild-probe: network blocked|Max retries exceeded|Failed to establish a new connection|"
    r"Temporary failure in name resolution|Name or service not known|nodename nor servname|"
    r"Network is unreachable|urlopen error|getaddrinfo failed|OfflineModeIsEnabled|offline mode is enabled|"
    r"HF_HUB_OFFLINE|couldn't connect to 'https?://|LocalEntryNotFoundError|"
    r"Cannot find the requested files in the (?:disk )?cache and outgoing traffic has been disabled|"
    # clients below Python (Rust's reqwest, libcurl) in a namespace or container without a network
    r"error sending request for url|dns error|failed to lookup address information|Could not resolve (?:host|proxy)|"
    r"Couldn't resolve host")


def _network(t: str) -> str | None:
    if not _NETWORK.search(t):
        return None
    m = re.search(r"https?://[^\s'\")>]+", t) or re.search(r"host='([^']+)'", t) or re.search(r"\(([\w.\-]+:\d+)\)", t)
    what = m.group(m.lastindex or 0) if m else ""
    return f"reaches the network at import{' (' + what + ')' if what else ''}; fails offline"


def _under_home(path: str) -> bool:
    import os
    home = os.path.expanduser("~")
    return bool(home) and home != "/" and os.path.abspath(path).startswith(home.rstrip("/") + "/")


def _chain(exc: BaseException, limit: int = 8) -> list[BaseException]:
    """The exception and what it was raised from or while handling, outermost first."""
    out = []
    while exc is not None and len(out) < limit and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def classify_exception(exc: BaseException, engine: str | None = None) -> Classified:
    """Classify the exception; an environment need anywhere in its chain wins: an engine that
    falls back to another engine's kernels because libcuda is missing needs a GPU, and a module
    whose download failed offline needs the network, whatever the last error says."""
    c = _classify_one(exc, engine)
    if c.status in (NEEDS_GPU, NEEDS_NETWORK, NEEDS_HOME):
        return c
    for inner in _chain(exc)[1:]:
        ci = _classify_one(inner, engine)
        if ci.status in (NEEDS_GPU, NEEDS_NETWORK, NEEDS_HOME):
            ci.detail = f"{ci.detail} (then: {c.detail})"[:1500]
            return ci
    return c


def _classify_one(exc: BaseException, engine: str | None) -> Classified:
    if isinstance(exc, OSError) and exc.errno in (1, 13, 30) and isinstance(exc.filename, str) \
            and _under_home(exc.filename):
        return Classified(NEEDS_HOME, "needs-writable-home", f"writes {exc.filename} ({exc.strerror})")
    text = f"{type(exc).__name__}: {exc}"
    c = classify_message(text, engine)
    if c.cause == "exception":
        c.detail = text[:500]
    if isinstance(exc, ImportError) and c.cause == "exception":
        c.cause = "import-error"
    where = _where(exc)
    if where:  # the message alone rarely says which module raised ("No module named 'flashinfer'")
        c.detail = f"{c.detail} [at {where}]"
    return c


_DEVICE_WORDS = ("cuda", "gpu", "cpu", "hip", "rocm", "npu", "xpu", "musa", "device", "is_available")


def device_branch(exc: BaseException) -> str | None:
    """Where an import failed inside a branch chosen by the device the host has
    (`if not is_cuda(): from vllm._custom_ops import ...`): 'file:line (if not is_cuda())'. On a
    host without a GPU such a branch is the CPU one, which a GPU host never runs: the failure
    says nothing about the stack there. None when the failing line is under no such test."""
    import ast

    if not isinstance(exc, ImportError) or exc.__traceback__ is None:
        return None
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    # the innermost frame outside importlib's machinery: the import statement that failed
    f = next((f for f in reversed(frames) if not f.filename.startswith("<")), None)
    if f is None or not f.filename.endswith(".py") or _is_stdlib(f.filename):
        return None
    try:
        with open(f.filename, "rb") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    test = None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno < f.lineno <= (node.end_lineno or node.lineno):
            if test is None or node.lineno > test.lineno:  # the innermost enclosing if
                test = node
    if test is None:
        return None
    text = ast.unparse(test.test)
    if not any(w in text.lower() for w in _DEVICE_WORDS):
        return None
    return f"{_frame(f).rsplit(' ', 1)[0]} (under `if {text[:80]}`)"


def _where(exc: BaseException, frames: int = 3) -> str:
    """The innermost frames of the exception, shortest path first: 'pkg/mod.py:12 fn <- ...'.
    When those are all the standard library's (dataclasses, typing, importlib), the innermost frame
    outside it comes first: that is the package that broke."""
    import traceback

    tb = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    inner = list(reversed(tb[-frames:]))
    parts = [_frame(f) for f in inner]
    if inner and all(_is_stdlib(f.filename) for f in inner):
        own = next((f for f in reversed(tb) if not _is_stdlib(f.filename)), None)
        if own is not None:
            return f"{_frame(own)}, in the standard library below it: " + " <- ".join(parts)
    return " <- ".join(parts)


def _frame(f) -> str:
    import sysconfig
    path = f.filename
    for marker in ("site-packages/", "dist-packages/", sysconfig.get_paths()["stdlib"].rstrip("/") + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{f.lineno} {f.name}"


def _is_stdlib(path: str) -> bool:
    import os
    import sysconfig
    if path.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    if "site-packages" in path or "dist-packages" in path:
        return False
    paths = sysconfig.get_paths()
    return any(path.startswith(os.path.join(paths[k], "")) for k in ("stdlib", "platstdlib"))
