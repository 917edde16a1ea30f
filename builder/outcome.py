"""The one outcome model: what a probe verdict, a lock result and a record say about a stack, and
the exit code of each.

  verdict  a probe level's answer (probe.verdict.Verdict: the one model, written by the probe, read here):
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

from .probe.vocab import ERROR, EXIT_INFRA, EXIT_OF_STATUS, EXIT_OK, EXIT_VERDICT, FAIL, NEEDS_GPU, PASS, TIMEOUT
from .probe.vocab import NOT_A_PROBLEM as VOCAB_NOT_A_PROBLEM
from .probe.verdict import Check, Verdict  # noqa: F401 - the one model, written by the probe, read here

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
