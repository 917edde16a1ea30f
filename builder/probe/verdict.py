"""The probe's verdict: one entry per check, folded into one overall status.

Standard library only: this package is copied into images where envbuild is not installed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

# Check statuses. "needs-gpu" and "not-applicable" are not failures: a CPU host cannot run the
# first, and the second belongs to an engine or backend the combination does not include.
PASS, FAIL, NEEDS_GPU, NOT_APPLICABLE, SKIPPED, ERROR = (
    "pass", "fail", "needs-gpu", "not-applicable", "skipped", "error")

SCHEMA = 1


@dataclass
class Check:
    name: str
    status: str
    detail: str = ""
    cause: str | None = None  # classified cause when not pass, e.g. "undefined-symbol"
    seconds: float = 0.0


@dataclass
class Verdict:
    level: str
    engine: str
    expect: dict = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    gpu: dict = field(default_factory=dict)
    peak_gpu_mem: int | None = None  # bytes, max over ranks
    metrics: dict = field(default_factory=dict)  # numbers the gpu level measured (tolerances etc.)
    started: float = field(default_factory=time.time)

    def add(self, name: str, status: str, detail: str = "", cause: str | None = None,
            seconds: float = 0.0) -> Check:
        c = Check(name, status, detail[:2000], cause, round(seconds, 4))
        self.checks.append(c)
        return c

    @contextmanager
    def timed(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] = round(time.perf_counter() - t0, 4)

    @property
    def status(self) -> str:
        return overall_status([c.status for c in self.checks])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status
        d["schema"] = SCHEMA
        d["cause"] = first_cause(self.checks)
        d["timings"].setdefault("total", round(time.time() - self.started, 4))
        del d["started"]
        return d


def overall_status(statuses: list[str]) -> str:
    """error (the probe itself broke) > fail > needs-gpu > pass."""
    if ERROR in statuses:
        return "error"
    if FAIL in statuses:
        return "fail"
    if NEEDS_GPU in statuses:
        return "needs-gpu"
    return "pass"


def first_cause(checks: list[Check]) -> str | None:
    for want in (ERROR, FAIL, NEEDS_GPU):
        for c in checks:
            if c.status == want:
                return c.cause or c.name
    return None


def write_json(path: str, obj: dict) -> None:
    """Atomic write (same idea as envbuild.fsutil, which is not available inside images)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".verdict.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
