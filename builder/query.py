"""The one query every reader answers through: which variant of the table (a row) for these
selectors on this platform, GPU and driver, and why each other matching row is not it.

pick, the page (its cells and its `docker pull` box), compat.md, doctor's table check, notify,
diff and `pick --verify-attestations` all ask here, so they cannot disagree. The answer is made
of a few facts per row (`facts`), which the page embeds and its script combines the same way
(tests/test_query_agreement.py holds the two against each other):

  eligible   the level a row qualifies for by itself: a row "verified", pushed (a digest), no
             level failed, every level up to its best passed, and its lock not failed in place on a
             node (0: not eligible; an inconsistent row is refused, whatever its status says)
  supports   the GPU architectures its native code has kernels for (None: never read: unknown is
             not yes)
  min_driver the oldest NVIDIA driver its CUDA runs on (None: unknown)
  standing   verified 4, unpinned 3, untested 2, broken 1 (which non-answer a cell shows)
  rank       its place in the preference order: highest best level, then newest verl, engine,
             torch, then newest verdict

A row answers an ask when it matches the selectors (the platform too: rows made before the
platform axis are linux/amd64), its `eligible` reaches the asked level, it has kernels for the
asked GPU and runs on the asked driver. The answer is the qualifying row of highest rank; what a
cell shows without an answer is the best non-answer by (standing, rank).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from . import drivers
from .row import BROKEN, UNPINNED, UNTESTED, VERIFIED, Row, Table, parse_pinned
from .selector import Selectors, from_flags, version_matches
from .probe.vocab import DECISIVE, ERROR, FAILING, LEVELS, PASS, level_rank
from .probe.features import model_types, scope_flag
from .probe.hardware import DEFAULT_PLATFORM

DEFAULT_LEVEL = "contract"  # env only proves versions; contract proves verl's rollout imports
STANDING = {VERIFIED: 4, UNPINNED: 3, UNTESTED: 2, BROKEN: 1}


@dataclass(frozen=True)
class Ask:
    """A reader's question. `selectors.platform` None asks about every platform."""

    selectors: Selectors = field(default_factory=Selectors)
    level: str = DEFAULT_LEVEL  # the lowest probe level the answer must have passed
    gpu: str | None = None  # the GPU's architecture as the table spells it (sm_90 for an H200: hardware.parse_gpu)
    driver: str | None = None  # the host's NVIDIA driver version
    in_place: bool = False  # answer a stack verified in place (envbuild venv), not an image
    # What the user's run enters beyond verl's core path: feature names and `model:T` (vocab
    # scopes). A row broken under one of them is no answer for this run, whatever its status.
    scopes: frozenset = frozenset()

    def on(self, platform: str | None) -> "Ask":
        return replace(self, selectors=replace(self.selectors, platform=platform))

    def describe(self) -> str:
        return (self.selectors.describe() + (f" --gpu {self.gpu}" if self.gpu else "")
                + (f" --driver {self.driver}" if self.driver else "")
                + "".join(" " + scope_flag(s) for s in sorted(self.scopes)))


def ask(sel=None, level: str = DEFAULT_LEVEL, gpu: str | None = None, driver: str | None = None) -> Ask:
    """An Ask from Selectors or flag values ({"vllm": "0.8.4"})."""
    sel = sel if isinstance(sel, Selectors) else from_flags(**(sel or {}))
    return Ask(sel, level, gpu, driver)


# ---------------------------------------------------------------- facts of a row


@dataclass(frozen=True)
class Facts:
    eligible: int
    supports: tuple[str, ...] | None
    min_driver: str | None
    standing: int
    broken_scopes: tuple[str, ...] = ()  # scopes a run may enter under which the row is broken


def eligible(row: Row) -> int:
    """The level rank a row qualifies for by itself (module docstring); 0 when it does not."""
    if row.in_place.get("status") == BROKEN:
        return 0  # the same lock failed on a GPU node: the stack is broken, whatever its image says
    if row.status != VERIFIED or not parse_pinned(row.pinned):
        return 0
    rank = level_rank(row.best_level)
    if rank == 0 or any(row.level(k).status in FAILING for k in LEVELS):
        return 0
    if not all(row.level(k).status == PASS for k in LEVELS[:rank]):
        return 0
    return rank


def unsettled(row: Row, before: Row | None = None) -> list[str]:
    """Levels that failed and have not passed since: each level whose newest decided verdict in the
    row's history (any image of it) failed, or that failed in `before` (the row in an earlier
    table), and that the row's own image has not passed. A row verified up to contract says
    nothing of a failure at gpu: a night's first table, published before its gpu verdicts, must not
    read as the fix of last night's gpu failure (notify would close the issue, then reopen it)."""
    failed = {lv for lv in LEVELS if before is not None and before.level(lv).status in FAILING}
    seen: set[str] = set()
    for h in row.history:  # newest first
        for lv, st in h.levels.items():
            if lv in LEVELS and lv not in seen and st in DECISIVE:
                seen.add(lv)
                if st in FAILING:
                    failed.add(lv)
    return [lv for lv in LEVELS if lv in failed and row.level(lv).status != PASS]


def facts(row: Row) -> Facts:
    hw = row.hardware or {}
    arch = hw.get("gpu_arch") if isinstance(hw.get("gpu_arch"), dict) else {}
    sup = arch.get("supports")
    supports = tuple(str(s) for s in sup) if isinstance(sup, list) and sup else None
    drv = hw.get("min_driver")
    return Facts(eligible(row), supports, drv if isinstance(drv, str) and drv else None,
                 STANDING.get(row.status, 0), tuple(sorted(row.scopes)))


def scope_hits(broken: tuple[str, ...], scopes) -> list[str]:
    """The broken scopes a run enters: a feature by name, a model type when a `model:` scope lists it."""
    asked = {t for x in scopes for t in model_types(x)}
    return [s for s in broken if s in scopes or asked & set(model_types(s))]


def _ver(v: object) -> tuple:
    """A version as a sortable key: numbers compared as numbers ("0.10.0" > "0.9.1")."""
    from packaging.version import InvalidVersion, Version
    try:
        return (1, Version(str(v)))
    except InvalidVersion:
        return (0, Version("0"))


def rank_key(row: Row, in_place: bool = False) -> tuple:
    c = row.combo
    return (in_place_rank(row) if in_place else level_rank(row.best_level), _ver(c.verl), _ver(c.engine_version), _ver(c.torch), row.newest(), row.id)


def driver_at_least(have: str, need: str) -> bool:
    def nums(v):
        return tuple(int(x) for x in re.findall(r"\d+", v))
    return nums(have) >= nums(need)


def platform_of(row: Row) -> str:
    return row.combo.platform or DEFAULT_PLATFORM  # rows before the platform axis are amd64


# ---------------------------------------------------------------- matching and qualifying


def matches(row: Row, sel: Selectors) -> bool:
    return matches_combo(row.combo, sel)


def matches_combo(c, sel: Selectors) -> bool:
    return sel.matches(cuda=c.cuda, python=c.python, torch=c.torch, engine=c.engine,
                       engine_version=c.engine_version, verl=c.verl, platform=c.platform)


def gpu_gap(row: Row, gpu: str | None) -> str | None:
    """Why the row's native code has no kernels for this GPU (None: it has, or no GPU asked)."""
    if gpu is None:
        return None
    f = facts(row)
    if f.supports is None:
        return "its GPU architecture coverage is unknown (probe it again with this envbuild)"
    if gpu in f.supports:
        return None
    arch = (row.hardware or {}).get("gpu_arch") or {}
    lacking = (arch.get("lacking") or {}).get(gpu) or []
    return (f"no kernels for {gpu} in {', '.join(lacking[:4])}" if lacking else f"{gpu} is not covered") + \
        f" (covers {', '.join(f.supports)})"


def driver_gap(row: Row, driver: str | None) -> str | None:
    """Why the row's CUDA does not run on this driver (None: it does, or no driver asked)."""
    if not driver:
        return None
    need = facts(row).min_driver
    if need is None:
        return f"the oldest driver for its {row.combo.cuda or 'CUDA'} is unknown"
    if driver_at_least(driver, need):
        return None
    return f"needs {drivers.driver_label(row.combo.cuda)} >= {need} for {row.combo.cuda}, this one is {driver}"


def qualifies_facts(f: Facts, a: Ask) -> bool:
    """The rule the page's script repeats (and the agreement test holds it to)."""
    if f.eligible < level_rank(a.level):
        return False
    if a.gpu is not None and (f.supports is None or a.gpu not in f.supports):
        return False
    if a.driver and (f.min_driver is None or not driver_at_least(a.driver, f.min_driver)):
        return False
    return not (a.scopes and scope_hits(f.broken_scopes, a.scopes))


def in_place_rank(row: Row) -> int:
    """The level rank the row's lock reached in place (envbuild venv + probe --here), 0 if none."""
    ip = row.in_place or {}
    return level_rank(ip.get("best_level")) if ip.get("status") == VERIFIED else 0


def qualifies(row: Row, a: Ask) -> bool:
    if a.in_place:  # the stack on a node, no image: its in-place verdict decides (GPU and driver: its node's)
        return in_place_rank(row) >= level_rank(a.level) and not scope_hits(tuple(row.scopes), a.scopes)
    return qualifies_facts(facts(row), a)


def display_key(row: Row, a: Ask) -> tuple:
    """Which of a cell's variants it shows: an answer first, then by standing, then by rank."""
    return (qualifies(row, a), STANDING.get(row.status, 0), rank_key(row))


def _state(name: str, e) -> str:
    return f"{name} {e.status}" + (f" ({e.cause})" if e.cause else "")


def why_not(row: Row, a: Ask) -> str:
    """One line: why a matching row is not an answer."""
    st, best = row.status, row.best_level
    ip = row.in_place or {}
    if ip.get("status") == BROKEN:
        f = ip.get("failure") or {}
        on = ", ".join((ip.get("host") or {}).get("gpu") or []) or "a node"
        return f"the same lock failed {f.get('level')} in place on {on}: {f.get('cause')}"
    if a.in_place:
        if not ip:
            return "never judged in place (envbuild venv + envbuild probe --here)"
        if ip.get("refused"):
            return f"could not be judged in place: {ip['refused']}"
        return f"in place: {ip.get('status')} up to {ip.get('best_level') or 'no level'} (< {a.level})"
    if st == VERIFIED and not row.pinned:
        return "marked verified but has no digest: refused"
    if st == BROKEN:
        f = row.failure
        d = f" - {f.detail.splitlines()[-1]}" if f and f.detail.strip() else ""
        return f"broken at {f.level if f else None}: {f.cause if f else None}{d}"
    if st == UNTESTED:
        undecided = [_state(k, v) for k, v in row.levels.items() if v.status != "not-run"]
        if row.build.status == ERROR:
            undecided.insert(0, f"build error ({row.build.cause})")
        what = ", ".join(undecided) or "never probed"
        return f"no verdict yet: {what}; infrastructure errors and needs-gpu are not verdicts"
    if st == UNPINNED:
        return "passed, but the image was never pushed: no digest to pin"
    if st != VERIFIED:
        return f"status {st!r}"
    if eligible(row) == 0:
        return "inconsistent row (its levels do not support its status): refused"
    if eligible(row) < level_rank(a.level):
        nxt = [k for k in LEVELS if level_rank(best) < level_rank(k) <= level_rank(a.level)]
        return f"verified only up to {best} (< {a.level}): " + ", ".join(_state(k, row.level(k)) for k in nxt)
    gap = gpu_gap(row, a.gpu)
    if gap:
        return f"verified, but not for this GPU: {gap}"
    gap = driver_gap(row, a.driver)
    if gap:
        return f"verified, but not for this driver: {gap}"
    hit = scope_hits(tuple(row.scopes), a.scopes)
    if hit:
        e = row.scopes[hit[0]]
        first = str(e.get("detail") or "").splitlines()[:1]
        return f"verified, but broken for your run ({e.get('label') or hit[0]}): " + (first[0] if first else "")
    return "qualifies"


# ---------------------------------------------------------------- answers


@dataclass
class Answer:
    best: Row | None  # the answer, None when no row qualifies
    rows: list[Row]  # every row matching the selectors
    shown: Row | None  # what a cell shows: the answer, else the best non-answer

    @property
    def rejected(self) -> list[Row]:
        """The matching rows, when none answers (each with query.why_not to say why)."""
        return [] if self.best else list(self.rows)


def answer_rows(rows: list[Row], a: Ask) -> Answer:
    rows = [r for r in rows if matches(r, a.selectors)]
    good = [r for r in rows if qualifies(r, a)]
    best = max(good, key=lambda r: rank_key(r, a.in_place)) if good else None
    shown = best or (max(rows, key=lambda r: display_key(r, a)) if rows else None)
    return Answer(best, rows, shown)


def answer(table: Table, a: Ask) -> Answer:
    """The one question: the best row for `a`, every row that matched, and what a cell shows."""
    return answer_rows(table.where(lambda c: matches_combo(c, a.selectors)), a)


def cells(table: Table, a: Ask) -> dict[tuple[str, str, str], Answer]:
    """The page's grid and compat.md's: per (platform, engine label, verl), the answer for `a`
    narrowed to that cell."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in table.rows:
        if matches(r, a.selectors):
            c = r.combo
            key = (platform_of(r), f"{c.engine or ''} {c.engine_version or ''}".strip(), c.verl or "")
            groups.setdefault(key, []).append(r)
    return {k: answer_rows(v, a) for k, v in sorted(groups.items())}


def exact(table: Table, *, verl: str, engine: str, engine_version: str | None, torch: str, cuda: str,
          python: str, platform: str | None) -> Answer:
    """The rows of exactly this stack (doctor: the installed versions, local variants stripped),
    platform included."""
    sel = Selectors(cuda=cuda, python=python, torch=torch, engine=engine, engine_version=engine_version or None,
                    verl=verl, platform=platform or DEFAULT_PLATFORM)
    return answer(table, Ask(sel, level="env"))


# ---------------------------------------------------------------- what an attestation must agree with


def attested_disagreement(row: Row, predicate: dict) -> str | None:
    """Why a signed test-result predicate does not back this row (None: it does). The statement
    was made from the row when its image was attested: a row that says verified must be backed by
    a result that is not FAILED, with the row's status and best level, and every verdict (pass,
    fail, timeout) on either side the same on the other. Undecided levels (needs-gpu, error,
    not-run) may differ: a later night's infrastructure error decides nothing."""
    e = predicate.get("envbuild") if isinstance(predicate.get("envbuild"), dict) else {}
    result = predicate.get("result")
    if row.status == VERIFIED and result == "FAILED":
        return "the image's attested test result is FAILED, the table says verified"
    if e.get("status") is not None and e.get("status") != row.status:
        return f"the image's attested status is {e.get('status')!r}, the table says {row.status!r}"
    levels = e.get("levels") if isinstance(e.get("levels"), dict) else {}
    for lv in LEVELS:
        said = (levels.get(lv) or {}).get("status") if isinstance(levels.get(lv), dict) else None
        have = row.level(lv).status
        if (said in DECISIVE or have in DECISIVE) and said != have:
            return f"the image's attested {lv} level is {said or 'missing'!r}, the table says {have!r}"
    if e.get("best_level", row.best_level) != row.best_level:
        return f"the image's attested best level is {e.get('best_level')!r}, the table says {row.best_level!r}"
    return None


def versions_in(table: Table, name: str, sel: Selectors) -> list[str]:
    """The values of one combination field in the table, among the rows of the asked engine (the
    hint when nothing matches: another engine's versions are no help)."""
    out = set()
    for c in table.combos():
        if sel.engine and c.engine != sel.engine:
            continue
        v = c.get(name)
        if v:
            out.add(str(v))
    return sorted(out, key=_ver)


__all__ = ["Ask", "Answer", "Facts", "answer", "answer_rows", "ask", "cells", "exact", "facts", "qualifies",
           "why_not", "rank_key", "gpu_gap", "driver_gap", "attested_disagreement", "versions_in",
           "version_matches", "DEFAULT_LEVEL"]
