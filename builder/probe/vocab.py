"""The shared vocabulary: probe levels, engines, check statuses, CUDA spellings, platforms.

Its home is the probe because the probe runs inside images where envbuild is not installed
(standard library only); the host side re-exports it (envbuild.vocab). One parse/format pair
for CUDA: `cu126`, `12.6`, `12.6.3` and `CUDA 12.6` all mean variant cu126.
"""

from __future__ import annotations

import re

from .verdict import CAVEATS, ERROR, FAIL, NEEDS_GPU, NOT_APPLICABLE, PASS, SKIPPED

LEVELS = ("env", "contract", "gpu")  # each level includes the levels before it
ENGINES = ("vllm", "sglang", "hf")  # hf: transformers generate, no inference engine
TIMEOUT = "timeout"  # a probe killed at its deadline (written by the launcher, not the probe)
# A check's or a verdict's status. needs-gpu / not-applicable / skipped are not failures, and the
# caveats (needs-network, needs-writable-home) are things the host must allow, not verdicts.
CHECK_STATUSES = (PASS, FAIL, NEEDS_GPU, NOT_APPLICABLE, SKIPPED, ERROR, *CAVEATS)
VERDICT_STATUSES = (PASS, FAIL, NEEDS_GPU, ERROR, TIMEOUT)
CPU = "cpu"  # the CUDA "variant" of a CPU-only torch build

_CUDA_RE = re.compile(r"(?:cuda\s*)?(?:cu(\d{3})|(\d{1,2})\.(\d)(?:\.\d+)*)", re.I)


def parse_cuda(value: object) -> str | None:
    """Any spelling -> the variant name (`cu126`), `cpu` for a CPU build, None if not a CUDA."""
    s = str(value if value is not None else "").strip()
    if s.lower() in (CPU, "none"):
        return CPU
    m = _CUDA_RE.fullmatch(s)
    if not m:
        return None
    if m.group(1):
        return f"cu{m.group(1)}"
    return f"cu{int(m.group(2))}{m.group(3)}"


def cuda_version(variant: str) -> str:
    """`cu126` -> `12.6` (`cu130` -> `13.0`); `cpu` stays `cpu`."""
    v = parse_cuda(variant)
    if v is None:
        raise ValueError(f"not a CUDA variant: {variant!r}")
    if v == CPU:
        return CPU
    digits = v[2:]
    return f"{digits[:-1]}.{digits[-1]}"


# Platforms: Docker's name -> (the machine Python and wheel tags say, Debian's architecture).
# One table for every spelling: `--platform arm64`, `aarch64` and `linux/arm64` are one platform.
PLATFORMS = {"linux/amd64": ("x86_64", "amd64"), "linux/arm64": ("aarch64", "arm64")}
DEFAULT_PLATFORM = "linux/amd64"  # its combinations' ids and tags carry no platform (as before the axis)


def parse_platform(value: object) -> str | None:
    """Any spelling (`linux/arm64`, `linux/arm64/v8`, `arm64`, `aarch64`) -> `linux/arm64`; None if unknown."""
    s = str(value if value is not None else "").strip().lower()
    if s.endswith("/v8"):
        s = s[:-3]
    s = s.removeprefix("linux/")
    for name, (machine, arch) in PLATFORMS.items():
        if s in (machine, arch):
            return name
    return None


def platform_machine(platform: str) -> str:
    """`linux/arm64` -> `aarch64` (platform.machine() inside the image; the wheel tag's arch)."""
    return PLATFORMS[parse_platform(platform) or platform][0]


def platform_arch(platform: str) -> str:
    """`linux/arm64` -> `arm64` (Debian's and Docker's architecture name)."""
    return PLATFORMS[parse_platform(platform) or platform][1]


def host_platform() -> str | None:
    """This machine's platform, None for one envbuild has no images for."""
    import platform as _platform

    return parse_platform(_platform.machine())


def level_index(level: str) -> int:
    return LEVELS.index(level)


def levels_upto(level: str) -> tuple[str, ...]:
    return LEVELS[: LEVELS.index(level) + 1]
