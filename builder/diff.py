"""`envbuild diff OLD NEW`: what changed between two signed compatibility tables.

Both tables are verified first (a diff against a forged table would be worse than none).
Per combination and per level (build, env, contract, gpu) it reports:
  regression  was pass, now fail/timeout (a stack that worked and broke): exit status 1
  fixed       was fail/timeout, now pass
  cause       failed before and now, for a different classified cause
  new         a row only in NEW;  gone: a row only in OLD
An infrastructure "error", "needs-gpu" or "not-run" decides nothing: pass -> error is not a
regression (the nightly machine having a bad night is not a broken stack), and is listed as
"undecided" so that it is visible without failing the run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .errors import UsageError
from .row import BROKEN, Entry, Row, Table
from .probe.vocab import FAIL, FAILING, LEVELS, NOT_RUN, PASS, UNDECIDED

STAGES = ("build", *LEVELS)  # what a row says per stage: its build, then each probe level


@dataclass
class Change:
    kind: str  # regression | fixed | cause | undecided
    id: str
    level: str
    old: str  # old status
    new: str  # new status
    old_cause: str | None = None
    new_cause: str | None = None
    detail: str = ""  # the new failure's detail (what a reader needs to act)


@dataclass
class Diff:
    old: dict  # {"source", "generated", "serial", "keyid", "rows"}
    new: dict
    changes: list[Change] = field(default_factory=list)
    added: list[dict] = field(default_factory=list)  # {"id", "status", "best_level"}
    removed: list[dict] = field(default_factory=list)

    def of(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]

    @property
    def regressions(self) -> list[Change]:
        return self.of("regression")

    def to_dict(self) -> dict:
        return {"old": self.old, "new": self.new,
                "regressions": [asdict(c) for c in self.of("regression")],
                "fixed": [asdict(c) for c in self.of("fixed")],
                "cause_changed": [asdict(c) for c in self.of("cause")],
                "undecided": [asdict(c) for c in self.of("undecided")],
                "added": self.added, "removed": self.removed}


def _levels(row: Row) -> dict[str, Entry]:
    return {"build": row.build, **{lv: row.level(lv) for lv in LEVELS}}


def _summary(row: Row) -> dict:
    return {"id": row.id, "status": row.status, "best_level": row.best_level,
            "failure": row.failure.to_dict() if row.failure else None}


def _meta(t: Table, src: str, n: int) -> dict:
    return {"source": src, "generated": t.generated, "serial": t.serial, "keyid": t.keyid, "rows": n}


def check_order(old: Table, new: Table, old_src: str = "OLD", new_src: str = "NEW") -> None:
    """Refuse OLD newer than NEW: read backwards, every regression would be reported as a fix.

    Serials decide (monotonic per publisher); tables without one (schema 1) compare `generated`.
    """
    if old.serial is not None and new.serial is not None:
        newer = old.serial > new.serial
        what = f"serial {old.serial} > {new.serial}"
    else:
        newer = bool(old.generated and new.generated and old.generated > new.generated)
        what = f"generated {old.generated} > {new.generated}"
    if newer:
        raise UsageError(f"OLD ({old_src}) is newer than NEW ({new_src}): {what}; the order is "
                         "`envbuild diff OLD NEW` (swap them)")


def compare(old: Table, new: Table, old_src: str = "OLD", new_src: str = "NEW") -> Diff:
    """Compare two (already verified) tables."""
    a, b = {r.id: r for r in old.rows}, {r.id: r for r in new.rows}
    d = Diff(old=_meta(old, old_src, len(a)), new=_meta(new, new_src, len(b)))
    d.added = [_summary(b[i]) for i in sorted(b.keys() - a.keys())]
    d.removed = [_summary(a[i]) for i in sorted(a.keys() - b.keys())]
    for cid in sorted(a.keys() & b.keys()):
        la, lb = _levels(a[cid]), _levels(b[cid])
        for lv in STAGES:
            o, n = la[lv], lb[lv]
            so, sn = o.status or NOT_RUN, n.status or NOT_RUN
            co, cn = o.cause, n.cause
            kind = None
            if so == PASS and sn in FAILING:
                kind = "regression"
            elif so in FAILING and sn == PASS:
                kind = "fixed"
            elif so in FAILING and sn in FAILING and (co, so) != (cn, sn):
                kind = "cause"
            elif so in (PASS, *FAILING) and sn in UNDECIDED and sn != NOT_RUN:
                kind = "undecided"  # was decided, now the machine could not tell: visible, not fatal
            if kind:
                d.changes.append(Change(kind, cid, lv, so, sn, co, cn, (n.detail or "")[:600]))
        _scope_changes(d, cid, a[cid], b[cid])
    return d


def _scope_changes(d: Diff, cid: str, ra: Row, rb: Row) -> None:
    """Per scope (a feature, a model type): a run that opts in broke (regression) or works again
    (fixed). A scope newly listed on a row that was broken before is no regression: before scopes
    every finding counted against the whole row."""
    was_broken = ra.status == BROKEN
    for sc in sorted(rb.scopes.keys() - ra.scopes.keys()):
        if not was_broken:
            e = rb.scopes[sc]
            d.changes.append(Change("regression", cid, f"scope {sc}", PASS, FAIL, None,
                                    ",".join(e.get("checks") or []) or sc, str(e.get("detail") or "")[:600]))
    for sc in sorted(ra.scopes.keys() - rb.scopes.keys()):
        if rb.status != BROKEN:
            d.changes.append(Change("fixed", cid, f"scope {sc}", FAIL, PASS, sc, None, ""))


# ---------------------------------------------------------------- rendering


def _fmt(c: Change) -> str:
    if c.kind == "regression":
        return f"{c.id} [{c.level}]: {c.old} -> {c.new} ({c.new_cause or c.new})"
    if c.kind == "fixed":
        return f"{c.id} [{c.level}]: {c.old} ({c.old_cause or c.old}) -> pass"
    if c.kind == "cause":
        return f"{c.id} [{c.level}]: {c.old_cause or c.old} -> {c.new_cause or c.new}"
    return f"{c.id} [{c.level}]: {c.old} -> {c.new} ({c.new_cause or 'no verdict'}; not a regression)"


SECTIONS = (("regression", "Regressions (was pass, now fail)"), ("fixed", "Fixed (was fail, now pass)"),
            ("cause", "Failure cause changed"), ("undecided", "Undecided now (infrastructure, not a verdict)"))


def render_text(d: Diff) -> str:
    lines = [f"old: {d.old['source']} ({d.old['rows']} rows, generated {d.old['generated']})",
             f"new: {d.new['source']} ({d.new['rows']} rows, generated {d.new['generated']})"]
    for kind, title in SECTIONS:
        items = d.of(kind)
        if items:
            lines.append(f"{title}: {len(items)}")
            lines += [f"  {_fmt(c)}" for c in items]
    for title, rows in (("New rows", d.added), ("Rows gone", d.removed)):
        if rows:
            lines.append(f"{title}: {len(rows)}")
            lines += [f"  {r['id']} ({r['status']})" for r in rows]
    n = len(d.regressions)
    lines.append(f"{n} regression(s)" if n else "no regressions")
    return "\n".join(lines) + "\n"


def _md_cell(s: object) -> str:
    return str(s if s is not None else "").replace("|", "\\|").replace("\n", " ")


def render_markdown(d: Diff, verified: bool = True) -> str:
    n = len(d.regressions)
    head = f"## envbuild: {n} regression(s)" if n else "## envbuild: no regressions"
    lines = [head, "",
             f"Compared `{d.old['source']}` ({d.old['rows']} rows, {d.old['generated']}) with "
             f"`{d.new['source']}` ({d.new['rows']} rows, {d.new['generated']}); "
             + ("both signatures verified." if verified else "**signatures NOT checked (--insecure)**."), ""]
    counts = [f"{len(d.of(k))} {k}" for k, _ in SECTIONS] + [f"{len(d.added)} new", f"{len(d.removed)} gone"]
    lines += [" · ".join(counts), ""]
    for kind, title in SECTIONS:
        items = d.of(kind)
        if not items:
            continue
        lines += [f"### {title}", "", "| combination | level | was | now | cause | detail |", "|---|---|---|---|---|---|"]
        for c in items:
            cause = c.new_cause if kind != "fixed" else c.old_cause
            if kind == "cause":
                cause = f"{c.old_cause} → {c.new_cause}"
            detail = (c.detail or "").strip().splitlines()
            lines.append("| " + " | ".join(_md_cell(x) for x in (
                f"`{c.id}`", c.level, c.old, c.new, cause or "", detail[-1][:200] if detail and kind != "fixed" else "")) + " |")
        lines.append("")
    for title, rows in (("New rows", d.added), ("Rows gone", d.removed)):
        if rows:
            lines += [f"### {title}", ""] + [f"- `{r['id']}`: {r['status']}" for r in rows] + [""]
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI
