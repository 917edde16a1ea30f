"""The one outcome model: what a probe verdict, a lock result and a record say about a stack, and
the exit code of each.

  verdict  a probe level's answer (envbuild.probe writes it as JSON; `Verdict` types it here):
           pass | fail | timeout (verdicts: vocab.DECISIVE) | needs-gpu | error (no verdict)
  lock     ok | unsatisfiable | needs-build (verdicts: the stack cannot be installed as asked)
           | index-unreachable | lock-error | metadata-missing (infrastructure)
  record   ok (the stage completed) | fail (a verdict: the stack is broken) | error
           (infrastructure: says nothing about the stack, never replaces an earlier verdict)

Exit codes come from one table (vocab.EXIT_OF_STATUS, shared with the in-image probe): 0 ok,
1 a verdict against a combination, 3 infrastructure (and needs-gpu); 2 is bad input, raised as
errors, never an outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .probe.vocab import (
    ERROR, EXIT_INFRA, EXIT_OF_STATUS, EXIT_OK, EXIT_VERDICT, FAIL, FAILING, LEVELS, NEEDS_GPU, PASS, TIMEOUT,
    VERDICT_STATUSES,
)
from .probe.vocab import NOT_A_PROBLEM as VOCAB_NOT_A_PROBLEM
from .probe.verdict import Check  # noqa: F401 - the one Check, written by the probe, read here

# ---------------------------------------------------------------- records

OK, RECORD_FAIL, RECORD_ERROR = "ok", "fail", "error"
RECORD_STATUSES = (OK, RECORD_FAIL, RECORD_ERROR)
STAGES = ("lock", "render", "build", "push", "probe")

# A verdict status -> the record status it makes (module docstring; README "Exit codes").
VERDICT_TO_RECORD = {PASS: OK, NEEDS_GPU: OK, FAIL: RECORD_FAIL, TIMEOUT: RECORD_FAIL, ERROR: RECORD_ERROR}


def exit_of_records(statuses, *, incomplete: bool = False) -> int:
    """A command that wrote records: any verdict against a combination is 1; else any
    infrastructure error, or work it could not do (`incomplete`), is 3."""
    statuses = set(statuses)
    if RECORD_FAIL in statuses:
        return EXIT_VERDICT
    return EXIT_INFRA if RECORD_ERROR in statuses or incomplete else EXIT_OK


# ---------------------------------------------------------------- locks

LOCK_OK = OK
LOCK_VERDICTS = ("unsatisfiable", "needs-build")  # the stack cannot be installed as asked
LOCK_INFRA = ("index-unreachable", "lock-error", "metadata-missing")


def lock_record_status(status: str) -> str:
    """A lock result's status -> the record status it makes."""
    if status == LOCK_OK:
        return OK
    return RECORD_FAIL if status in LOCK_VERDICTS else RECORD_ERROR


def exit_of_lock(status: str) -> int:
    return {OK: EXIT_OK, RECORD_FAIL: EXIT_VERDICT}.get(lock_record_status(status), EXIT_INFRA)


# ---------------------------------------------------------------- verdicts

# Check statuses that do not explain a non-passing verdict: the caveats go on the row instead.
NOT_A_PROBLEM = (None, OK, *VOCAB_NOT_A_PROBLEM)  # vocab's set, and a record's "ok" / no status


def exit_of_verdict(status: str) -> int:
    return EXIT_OF_STATUS.get(status, EXIT_INFRA)


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


_KNOWN = ("level", "status", "cause", "engine", "expect", "checks", "versions", "hardware", "caveats", "gpu",
          "timings", "runner", "reused_from")


@dataclass
class Verdict:
    """One probe level's verdict on the host. Read from the JSON the probe wrote (or the launcher
    wrote for it); keys this envbuild does not know are kept, so a record round-trips."""

    level: str | None
    status: str  # vocab.VERDICT_STATUSES; an unreadable status is "error" (it proves nothing)
    cause: str | None = None
    engine: str | None = None
    expect: dict = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)
    caveats: list[dict] = field(default_factory=list)
    gpu: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    runner: dict = field(default_factory=dict)
    reused_from: str | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, v: object, level: str | None = None) -> "Verdict":
        """A Verdict from a Verdict or its JSON (anything else is an unreadable verdict: error)."""
        if isinstance(v, Verdict):
            return v
        d = _dict(v)
        status = d.get("status")
        checks = d.get("checks")
        lv = d.get("level") if d.get("level") in LEVELS else level
        return cls(
            level=lv, status=status if status in VERDICT_STATUSES else ERROR,
            cause=None if d.get("cause") is None else str(d["cause"]),
            engine=d.get("engine") if isinstance(d.get("engine"), str) else None,
            expect=_dict(d.get("expect")),
            checks=[c for c in map(Check.from_dict, checks if isinstance(checks, list) else []) if c],
            versions=_dict(d.get("versions")), hardware=_dict(d.get("hardware")),
            caveats=[c for c in d.get("caveats") or [] if isinstance(c, dict)] if isinstance(d.get("caveats"), list) else [],
            gpu=_dict(d.get("gpu")), timings=_dict(d.get("timings")), runner=_dict(d.get("runner")),
            reused_from=d.get("reused_from") if isinstance(d.get("reused_from"), str) else None,
            extra={k: x for k, x in d.items() if k not in _KNOWN})

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update(level=self.level, status=self.status, cause=self.cause, engine=self.engine, expect=self.expect,
                 checks=[c.to_dict() for c in self.checks], versions=self.versions, hardware=self.hardware,
                 caveats=self.caveats, gpu=self.gpu, timings=self.timings)
        if self.runner:
            d["runner"] = self.runner
        if self.reused_from:
            d["reused_from"] = self.reused_from
        return d

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


def unwritten(level: str, engine: str, expect: dict, status: str, cause: str, detail: str) -> dict:
    """The verdict JSON of a level the probe could not write itself (timeout, crash, docker error):
    every field a written verdict has, so no reader finds one missing."""
    from .probe.verdict import SCHEMA, Verdict as ProbeVerdict

    v = ProbeVerdict(level=level, engine=engine, expect=dict(expect))
    v.add("probe-run", status, detail[-2000:], cause).level = level
    d = v.to_dict()
    d.update(schema=SCHEMA, status=status, cause=cause)  # the probe's own fold knows no "timeout"
    d["timings"] = {}
    return d


def record_status(verdicts: dict) -> tuple[str, str | None, str]:
    """A record's (status, cause, detail) from its level verdicts, by VERDICT_TO_RECORD: the first
    failing level decides; error (infrastructure) only when nothing failed."""
    typed = {lv: Verdict.of(v, lv) for lv, v in verdicts.items()}
    first: dict[str, tuple[str, Verdict]] = {}
    for lv, v in typed.items():
        first.setdefault(VERDICT_TO_RECORD.get(v.status, RECORD_ERROR), (lv, v))
    st = next((s for s in (RECORD_FAIL, RECORD_ERROR) if s in first), OK)
    if st == OK:
        return OK, None, ""
    lv, v = first[st]
    cause = v.cause or (TIMEOUT if v.status == TIMEOUT else f"probe-{v.status}")
    bad = [f"{c.name}: {c.detail}".strip() for c in v.checks if c.status in (FAIL, TIMEOUT, ERROR)]
    return st, cause, (f"probe level {lv}: {v.status}\n" + "\n".join(bad))[:4000]


def push_probe_outcome(push, probe) -> tuple[str, str, str | None, str]:
    """(stage, status, cause, detail) of a record from what the push and the probe, which ran at
    once, ended with. push: None (not asked) | ("ok", digest) | ("error", cause, detail);
    probe: None | ("verdicts", {level: verdict}) | ("error", cause, detail). The rule (module
    docstring of envbuild.pipeline, which runs them): a failing verdict decides; else a failed push; else
    the probe; else build ok."""
    if probe and probe[0] == "verdicts":
        p_status, p_cause, p_detail = record_status(probe[1])
        p_said = "probe: " + ", ".join(f"{lv} {Verdict.of(v).status}" for lv, v in probe[1].items())
    elif probe:
        p_status, p_cause, p_detail = RECORD_ERROR, probe[1], probe[2]
        p_said = f"probe: error {probe[1]}: {probe[2]}"
    else:
        p_status = p_cause = p_detail = p_said = None
    push_failed = bool(push) and push[0] == RECORD_ERROR
    if p_status == RECORD_FAIL:
        also = f"\npush failed as well ({push[1]}): {push[2]}" if push_failed else ""
        return "probe", RECORD_FAIL, p_cause, (p_detail + also)[:4000]
    if push_failed:
        also = f"\n{p_said} (kept in this record's probe)" if p_said else ""
        return "push", RECORD_ERROR, push[1], (push[2] + also)[:4000]
    if p_status is not None:
        return "probe", p_status, p_cause, p_detail
    return "build", OK, None, ""
