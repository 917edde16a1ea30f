"""The probe's verdict: one entry per check, folded into one overall status.

Standard library only: this package is copied into images where envbuild is not installed.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from .vocab import (  # noqa: F401 - the statuses' home is the vocabulary; re-exported for the probe's modules
    CAVEATS, ERROR, FAIL, FAILING, LEVELS, NEEDS_GPU, NEEDS_HOME, NEEDS_NETWORK, NOT_A_PROBLEM, NOT_APPLICABLE,
    PASS, PRECEDENCE, SKIPPED, TIMEOUT, VERDICT_STATUSES, worst_status,
)
from .features import CORE, is_core

SCHEMA = 1


@dataclass
class Check:
    """One check: the one model, written by the probe and read by the host (outcome.py)."""

    name: str
    status: str
    detail: str = ""
    cause: str | None = None  # classified cause when not pass, e.g. "undefined-symbol"
    seconds: float = 0.0
    level: str | None = None  # env | contract | gpu: the level that wrote it; None counts against every level
    # The runs that reach what it found (features.CORE, a feature, `model:T`, `guard:G`) and whether
    # that was read from code or from a feature descriptor. Only a core failure fails the verdict;
    # a scoped one is a caveat of the runs that opt in. Records made before scopes: core.
    scope: str = CORE
    scope_from: str | None = None

    @classmethod
    def from_dict(cls, d: object) -> "Check | None":
        """A check from JSON of any source (a record, another envbuild): wrong types are read as
        the field's empty value, never trusted as given."""
        if not isinstance(d, dict):
            return None
        secs, scope, sfrom = d.get("seconds"), d.get("scope"), d.get("scope_from")
        return cls(str(d.get("name") or ""), str(d.get("status") or ""), str(d.get("detail") or ""),
                   None if d.get("cause") is None else str(d["cause"]),
                   float(secs) if isinstance(secs, (int, float)) and not isinstance(secs, bool) else 0.0,
                   d.get("level") if d.get("level") in LEVELS else None,
                   scope if isinstance(scope, str) and scope else CORE,
                   sfrom if isinstance(sfrom, str) else None)

    def to_dict(self) -> dict:
        d = {"name": self.name, "status": self.status, "detail": self.detail, "cause": self.cause,
             "seconds": self.seconds, "level": self.level}
        if not is_core(self.scope) or self.scope_from:
            d.update(scope=self.scope, scope_from=self.scope_from)
        return d

    @property
    def problem(self) -> bool:
        """Explains a non-passing verdict: a core check that did not pass (a scoped failure is a
        caveat of the runs that opt in, listed apart)."""
        return self.status not in (None, "ok", *NOT_A_PROBLEM) and is_core(self.scope)

    @property
    def scoped_failure(self) -> bool:
        return self.status in FAILING and not is_core(self.scope)


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


# What a written verdict holds (to_dict); anything else a reader finds is kept in `extra`.
_KNOWN = ("level", "status", "cause", "engine", "expect", "checks", "versions", "hardware", "caveats", "gpu",
          "timings", "runner", "reused_from", "metrics", "peak_gpu_mem")


@dataclass
class Verdict:
    """One level's verdict: the one model, from the probe to the page.

    The probe builds it check by check (`add` inside `at_level`): its status is what its core
    checks fold to, by the one precedence. The host reads a written one back with `of` (typed
    on read: wrong types are the field's empty value, an unreadable status is "error"), and a
    verdict the host states itself (a level split off a higher one) comes from `stated`: those
    carry their status and cause as given, and keys this version does not know stay in
    `extra`, so a record round-trips.
    """

    level: str | None
    engine: str | None = None
    expect: dict = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    gpu: dict = field(default_factory=dict)
    peak_gpu_mem: int | None = None  # bytes, max over ranks
    metrics: dict = field(default_factory=dict)  # numbers the gpu level measured (tolerances etc.)
    # What the host must provide and which GPUs the native code runs on (env level): gpu_arch
    # (fatbin.image_coverage), nccl, cudnn, min_shm_bytes.
    hardware: dict = field(default_factory=dict)
    # Environment needs met by no check's failure: {"kind": needs-network|needs-writable-home,
    # "check": name, "module": ..., "what": what it fetches / writes}.
    caveats: list[dict] = field(default_factory=list)
    runner: dict = field(default_factory=dict)  # the host's launcher: exit code, wall seconds, timeout
    reused_from: str | None = None  # the record whose verdict this is (probe_run reuses by content)
    given: tuple | None = None  # (status, cause) as written or stated; None: folded from the checks
    extra: dict = field(default_factory=dict)
    written: frozenset = frozenset()  # the keys a verdict read back had: written back, even when empty
    started: float = field(default_factory=time.time)
    current_level: str | None = None  # set by at_level(); stamped on every check added meanwhile

    # -- read and stated
    @classmethod
    def of(cls, v: object, level: str | None = None) -> "Verdict":
        """A Verdict from a Verdict or its JSON (anything else is an unreadable verdict: error)."""
        if isinstance(v, Verdict):
            return v
        d = _dict(v)
        status, checks, caveats = d.get("status"), d.get("checks"), d.get("caveats")
        mem = d.get("peak_gpu_mem")
        return cls(
            level=d.get("level") if d.get("level") in LEVELS else level,
            engine=d.get("engine") if isinstance(d.get("engine"), str) else None,
            expect=_dict(d.get("expect")),
            checks=[c for c in map(Check.from_dict, checks if isinstance(checks, list) else []) if c],
            versions=_dict(d.get("versions")), hardware=_dict(d.get("hardware")),
            caveats=[c for c in caveats if isinstance(c, dict)] if isinstance(caveats, list) else [],
            gpu=_dict(d.get("gpu")), timings=_dict(d.get("timings")), runner=_dict(d.get("runner")),
            metrics=_dict(d.get("metrics")),
            peak_gpu_mem=mem if isinstance(mem, int) and not isinstance(mem, bool) else None,
            reused_from=d.get("reused_from") if isinstance(d.get("reused_from"), str) else None,
            given=(status if status in VERDICT_STATUSES else ERROR, None if d.get("cause") is None else str(d["cause"])),
            extra={k: x for k, x in d.items() if k not in _KNOWN}, written=frozenset(d))

    @classmethod
    def stated(cls, level: str | None, status: str, cause: str | None = None, **kw) -> "Verdict":
        """A verdict whose status the host states (a lower level split off a higher one's)."""
        return cls(level=level, given=(status, cause), **kw)

    # -- built by the probe
    def add(self, name: str, status: str, detail: str = "", cause: str | None = None,
            seconds: float = 0.0, scope: str = CORE, scope_from: str | None = None) -> Check:
        # Outside a level (the probe itself broke between levels) no level: it counts against all.
        c = Check(name, status, detail[:2000], cause, round(seconds, 4), self.current_level, scope or CORE, scope_from)
        self.checks.append(c)
        return c

    def caveat(self, kind: str, check: str, module: str, what: str) -> None:
        item = {"kind": kind, "check": check, "module": module, "what": what}
        if item not in self.caveats:
            self.caveats.append(item)

    @contextmanager
    def at_level(self, level: str):
        prev, self.current_level = self.current_level, level
        try:
            yield
        finally:
            self.current_level = prev

    @contextmanager
    def timed(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] = round(time.perf_counter() - t0, 4)

    def absorb(self, d: dict, prefix: str = "") -> None:
        """Fold in a level judged elsewhere (a child process, a verdict of its own) as written by
        to_dict: its checks after these, its numbers where this verdict has none (`process` and
        `total` under `prefix`)."""
        self.checks += [Check(**{k: x for k, x in c.items() if k in Check.__dataclass_fields__})
                        for c in d.get("checks", [])]
        for k, val in d.get("timings", {}).items():
            if k in ("process", "total"):
                if prefix:
                    self.timings[f"{prefix}_{k}"] = val
            else:
                self.timings.setdefault(k, val)
        for mine, theirs in ((self.versions, d.get("versions")), (self.metrics, d.get("metrics")),
                             (self.hardware, d.get("hardware")), (self.gpu, d.get("gpu"))):
            for k, val in (theirs or {}).items():
                mine.setdefault(k, val)
        if d.get("peak_gpu_mem") is not None:
            self.peak_gpu_mem = max(self.peak_gpu_mem or 0, d["peak_gpu_mem"])
        for c in d.get("caveats", []):
            if c not in self.caveats:
                self.caveats.append(c)

    # -- what it says
    @property
    def status(self) -> str:
        if self.given is not None:
            return self.given[0]
        return overall_status([c.status for c in self.checks if is_core(c.scope)])

    @property
    def cause(self) -> str | None:
        if self.given is not None:
            return self.given[1]
        return first_cause([c for c in self.checks if is_core(c.scope)])

    @property
    def failing(self) -> bool:
        return self.status in FAILING

    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.problem]

    def first_cause(self) -> str | None:
        """The verdict's own cause, else the cause of its first check that explains it."""
        if self.cause:
            return self.cause
        first = next(iter(self.problems()), None)
        return (first.cause or first.name or first.status) if first else None

    def first_detail(self) -> str:
        first = next(iter(self.problems()), None)
        return f"{first.name}: {first.detail}" if first else ""

    @property
    def wall_seconds(self) -> float:
        w = self.runner.get("wall_seconds")
        return float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) else 0.0

    def scoped(self) -> dict[str, list[str]]:
        """{scope: [check names]} of the failures only some runs reach (they leave status alone)."""
        out: dict[str, list[str]] = {}
        for c in self.checks:
            if c.status == FAIL and not is_core(c.scope):
                out.setdefault(c.scope, []).append(c.name)
        return out

    def to_dict(self, level: str | None = None) -> dict:
        """The verdict as written. The probe's: every field, its status and cause from its checks,
        `level` naming a lower level that has just ended (its verdict is everything so far, since
        a level includes the levels below it). One read back or stated: as it came, with the keys
        this version does not know."""
        d = dict(self.extra)
        d.update(level=self.level if level is None else level, status=self.status, cause=self.cause,
                 engine=self.engine, expect=self.expect, checks=[c.to_dict() for c in self.checks],
                 versions=self.versions, hardware=self.hardware, caveats=self.caveats, gpu=self.gpu,
                 timings=self.timings)
        probe = self.given is None  # the probe writing: every field
        for key, value in (("metrics", self.metrics), ("peak_gpu_mem", self.peak_gpu_mem), ("runner", self.runner),
                           ("reused_from", self.reused_from)):
            if (probe and key in ("metrics", "peak_gpu_mem")) or value or key in self.written:
                d[key] = value
        d = copy.deepcopy(d)  # what is written never aliases the verdict (the probe writes it at each level's end)
        if probe:
            d["schema"] = SCHEMA
            d["timings"].setdefault("total", round(time.time() - self.started, 4))
        return d


def overall_status(statuses: list[str]) -> str:
    """The one precedence (vocab.worst_status): error > fail > needs-gpu > pass. Caveats
    (needs-network, needs-writable-home) and not-applicable leave it at pass."""
    return worst_status(statuses)


def first_cause(checks: list[Check]) -> str | None:
    for want in (s for s in PRECEDENCE if s != TIMEOUT):
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
