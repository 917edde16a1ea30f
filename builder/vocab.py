"""Host-side vocabulary: the probe's (levels, engines, statuses, CUDA spellings) re-exported,
plus the words only the host uses (record statuses, --probe plans). One home for each."""

from __future__ import annotations

from .probe.verdict import CAVEATS, ERROR, FAIL, NEEDS_GPU, NOT_APPLICABLE, PASS, SKIPPED  # noqa: F401
from .probe.vocab import (  # noqa: F401
    CHECK_STATUSES, CPU, DEFAULT_PLATFORM, ENGINES, LEVELS, PLATFORMS, TIMEOUT, VERDICT_STATUSES, cuda_version,
    host_platform, level_index, levels_upto, parse_cuda, parse_platform, platform_arch, platform_machine,
)

# A record's status: ok (the stage completed), fail (a verdict: the stack is broken), error
# (infrastructure: says nothing about the stack, never replaces an earlier verdict).
OK, RECORD_FAIL, RECORD_ERROR = "ok", "fail", "error"
RECORD_STATUSES = (OK, RECORD_FAIL, RECORD_ERROR)
STAGES = ("lock", "render", "build", "push", "probe")

# `envbuild build --probe X` -> the probe levels run, in order.
PROBE_CHOICES = ("none", "cpu", "gpu", "auto")
PROBE_PLAN = {"none": (), "cpu": ("env", "contract"), "gpu": LEVELS}

# A verdict status -> the record status it makes. One rule, stated in the README: a probe that
# times out is a failure of the stack (a verdict), because a stack that hangs is not usable and
# an infrastructure error would let an earlier "works" stand; needs-gpu decides nothing.
VERDICT_TO_RECORD = {PASS: OK, NEEDS_GPU: OK, FAIL: RECORD_FAIL, TIMEOUT: RECORD_FAIL, ERROR: RECORD_ERROR}
