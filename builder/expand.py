"""The plan: a matrix (envbuild.matrix) expanded into combinations, its axes multiplied, its
includes added, its exclude rules and the metadata's facts applied, then narrowed by selectors.

Open axes (torch: auto) are filled from the pinned packages' metadata (envbuild.index), never
typed by hand: `--vllm 0.8.4` implies torch 2.6.0 because vLLM 0.8.4's wheel requires it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import lru_cache
from operator import attrgetter
from pathlib import Path

from .errors import InputError
from .index import Metadata
from .matrix import UNVERSIONED, ExcludeRule, Matrix, matrix_from_args
from .selector import Selectors, narrow, release_of, selectors_from_args, version_matches
from .values import Combo
from .probe.vocab import ENGINE, VERSIONED_ENGINES, dist_of
from .probe.hardware import DEFAULT_PLATFORM, platform_machine


@dataclass(frozen=True)
class Excluded:
    combo: Combo
    reason: str
    by_rule: bool = False  # a matrix rule (an opinion: naming the pair plans it anyway), not a fact


@dataclass
class Plan:
    combos: list[Combo]
    excluded: list[Excluded]
    warnings: list[str] = field(default_factory=list)



# --------------------------------------------------------------------------- expansion


def plan_from_args(args, meta=None, *, say=None) -> Plan:
    """Shared by every command that takes selectors: the plan, or a clear error if empty.
    Warnings (an excluded combination planned because it was asked for) go to `say` (stderr)."""
    import sys

    m = matrix_from_args(args)
    sel = selectors_from_args(args)
    pl = plan(m, sel, meta, undeclared=bool(getattr(args, "undeclared", False)))
    for w in pl.warnings:
        (say or (lambda t: print(f"warning: {t}", file=sys.stderr)))(w)
    if not pl.combos:
        raise InputError(m.path, None, "selectors", sel.describe(), _nothing_planned(pl, sel))
    return pl


def _nothing_planned(pl: Plan, sel: Selectors) -> str:
    if not pl.excluded:
        return "no combination matches (see `envbuild plan` for what the matrix declares)"
    first = pl.excluded[0]
    more = f" (and {len(pl.excluded) - 1} more: `envbuild plan --all` lists them)" if len(pl.excluded) > 1 else ""
    how = ("" if sel.explicit() or not any(e.by_rule for e in pl.excluded) else
           "; to judge an excluded pair anyway, name its verl and engine versions (--verl V --vllm V)")
    return f"excluded: {first.combo.id}: {first.reason}{more}{how}"


@lru_cache(maxsize=65536)
def _spec_match(spec: str, version: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec, prereleases=True).contains(version, prereleases=True)


def _rule_matches(rule: ExcludeRule, c: Combo) -> bool:
    for k, v in rule.match.items():
        if k in ("cuda", "python", "engine", "platform"):
            if getattr(c, k) != v:
                return False
        elif k in VERSIONED_ENGINES:
            if c.engine != k or not _spec_match(v, c.engine_version):
                return False
        elif not _spec_match(v, getattr(c, k)):  # torch, verl
            return False
    return True


def plan(m: Matrix, sel: Selectors | None = None, meta=None, undeclared: bool = True) -> Plan:
    """Expand axes x engines x includes, apply exclusions, then narrow by selectors.

    Selectors act as axis overrides (a version outside the matrix is planned, so that
    `envbuild lock --vllm 0.8.4 --torch 2.7.0` can give its verdict), then filter.
    `meta` answers metadata questions (envbuild.index.Metadata); it fills torch: auto.
    An engine or verl version the matrix does not declare is refused unless `undeclared` (the
    command line's --undeclared; library callers plan as given); selector.release_of.
    """
    sel = sel or Selectors()
    meta = meta or Metadata()
    notes = []
    if sel.engine and ENGINE[sel.engine].versioned and sel.engine_version:
        ev, note = release_of(sel.engine_version, m.releases(sel.engine), f"--{sel.engine}", undeclared)
        sel, notes = replace(sel, engine_version=ev), notes + [note] * bool(note)
    if sel.verl:
        v, note = release_of(sel.verl, m.releases("verl"), "--verl", undeclared)
        sel, notes = replace(sel, verl=v), notes + [note] * bool(note)
    engines = dict(m.engines)
    if sel.engine:
        versioned = ENGINE[sel.engine].versioned
        declared = m.engines.get(sel.engine) or ([] if versioned else [""])
        engines = {sel.engine: narrow(sel.engine_version, declared) if versioned else [""]}
    cudas = [sel.cuda] if sel.cuda else list(m.cuda)
    for cu in cudas:
        if cu not in m.cuda:
            raise InputError(m.path, m.lines.get(("cuda",)), "cuda", cu,
                             f"unknown CUDA variant (the matrix declares {', '.join(m.cuda)})")
    pythons = [sel.python] if sel.python else m.python
    platforms = [sel.platform] if sel.platform else m.platforms
    verls = narrow(sel.verl, m.verl)
    torch_axis = narrow(sel.torch, m.torch) if m.torch else None
    explicit = sel.explicit()

    # raw combinations as plain tuples: (verl, engine, engine version, cuda, python, forced torch, platform,
    # the include's reason)
    raw: list[tuple] = [(verl, eng, ev, cu, py, None, pf, None)
                        for (eng, versions), verl, cu, py, pf in itertools.product(engines.items(), verls, cudas,
                                                                                   pythons, platforms)
                        for ev in versions]
    for inc in m.include:
        eng = next((e for e in VERSIONED_ENGINES if e in inc), None) or inc.get("engine", UNVERSIONED)
        for cu in [inc["cuda"]] if inc.get("cuda") else cudas:
            for py in [inc["python"]] if inc.get("python") else pythons:
                for pf in [inc["platform"]] if inc.get("platform") else platforms:
                    raw.append((inc["verl"], eng, inc.get(eng, ""), cu, py, inc.get("torch"), pf, inc.get("reason")))

    raw.sort(key=lambda r: r[7] is None)  # a reasoned include decides a combination the axes also make
    combos: list[Combo] = []
    excluded: list[Excluded] = []
    warnings: list[str] = list(notes)
    seen: set[tuple] = set()
    why_not = _Excluder(m, meta)
    torch_memo: dict[tuple, tuple[list[str], str | None]] = {}
    for verl, eng, ev, cu, py, forced, pf, reason in raw:
        tk = (eng, ev, forced)
        if tk not in torch_memo:
            torch_memo[tk] = _torch_for(eng, ev, forced, torch_axis, sel.torch, meta)
        torches, why = torch_memo[tk]
        cv = m.cuda[cu]
        for t in torches:
            key = (verl, eng, ev, t, cu, py, pf)
            if key in seen:
                continue
            seen.add(key)
            combo = Combo(verl, eng, ev, t, cu, py, cv.toolkit, cv.base, cv.glibc, platform=pf)
            fact = why or why_not.facts(combo)
            rule = None if fact else why_not.rule(combo)
            if rule and reason:
                combo = replace(combo, note=f"included: {reason} (a matrix rule would exclude it: {rule})")
                rule = None
            if rule and explicit and sel.matches_combo(combo):
                # Asked for by name: a rule is an opinion about which pairs to build, so the
                # combination is judged anyway; the rule travels with it as a note.
                combo = replace(combo, note=f"outside the matrix: {rule}")
                warnings.append(f"{combo.id} is excluded by a matrix rule ({rule}); planned because it was asked for")
                rule = None
            if fact or rule:
                excluded.append(Excluded(combo, fact or rule, by_rule=not fact))
            else:
                combos.append(combo)

    # Sort on plain tuples: dataclass ordering is ten times slower on 10^5 rows.
    return Plan(sorted((c for c in combos if sel.matches_combo(c)), key=_order),
                sorted((e for e in excluded if sel.matches_combo(e.combo)), key=lambda e: _order(e.combo)),
                warnings)


def _order(c: Combo) -> tuple:
    return (c.verl, c.engine, c.engine_version, c.torch, c.cuda, c.python, c.platform)


def _torch_for(engine: str, version: str, forced: str | None, torch_axis: list[str] | None,
               selected: str | None, meta) -> tuple[list[str], str | None]:
    """The torch releases of one engine release: the matrix's axis, an include's, or the
    engine's own pin; a --torch that does not select that pin overrides it (to be judged)."""
    if forced and not (selected and not version_matches(selected, forced)):
        return [forced], None
    if torch_axis:
        return list(torch_axis), None
    versioned = ENGINE[engine].versioned
    pin = meta.torch_pin(engine, version) if versioned else None
    if selected and not (pin and version_matches(selected, pin)):
        return [selected], None
    if not versioned:
        return ["?"], f"the {engine} engine pins no torch: name one in an include entry or with --torch"
    if pin is None:
        return ["?"], f"{engine} {version} pins no exact torch version: give --torch"
    return [pin], None


class _Excluder:
    """Why a combination is not planned, or None: rules first, then facts from metadata.

    Each answer depends on a few axes only, so answers are memoised on those axes; that keeps
    planning 10^5 raw combinations well under a second.
    """

    def __init__(self, m: Matrix, meta):
        self.m, self.meta = m, meta
        # per rule: the attributes its answer depends on (an engine axis reads engine + version)
        self.rules = [(r, attrgetter(*sorted({f for a in r.match for f in (
            ("engine", "engine_version") if a in VERSIONED_ENGINES else (a,))})), {}) for r in m.exclude]
        self.memo: dict[tuple, str | None] = {}

    def __call__(self, c: Combo) -> str | None:
        return self.rule(c) or self.facts(c)

    def rule(self, c: Combo) -> str | None:
        """The first matrix rule that excludes the combination (an opinion: overridable by name)."""
        for rule, axes, memo in self.rules:
            key = axes(c)
            if key not in memo:
                memo[key] = (f"{rule.reason} ({Path(self.m.path).name}:{rule.line})"
                             if _rule_matches(rule, c) else None)
            if memo[key]:
                return memo[key]
        return None

    def facts(self, c: Combo) -> str | None:
        """What the metadata rules out (no torch build for the variant, Python bounds, no wheel for
        the platform): facts."""
        return self._facts(c.cuda, c.torch, c.python, c.verl, c.engine, c.engine_version, c.platform)

    def _facts(self, cuda, torch, python, verl, engine, engine_version, platform) -> str | None:
        memo = self.memo
        k1, k2, k3 = ("cuda", cuda, torch, python), (verl, "verl", python), (engine_version, engine, python)
        if k1 not in memo:
            memo[k1] = self._torch_fact(cuda, torch, python)
        if memo[k1]:
            return memo[k1]
        if k2 not in memo:
            memo[k2] = self._fact("verl", verl, python)
        if memo[k2]:
            return memo[k2]
        if k3 not in memo:
            memo[k3] = self._fact(engine, engine_version, python)
        if memo[k3] or platform == DEFAULT_PLATFORM:
            return memo[k3]
        for pkg, ver in (("torch", torch), (engine, engine_version), ("verl", verl)):
            k = ("platform", pkg, ver, platform)
            if k not in memo:
                memo[k] = self._platform_fact(pkg, ver, platform) if ver and ver != "?" and pkg in (*VERSIONED_ENGINES, "torch", "verl") else None
            if memo[k]:
                return memo[k]
        return None

    def _platform_fact(self, pkg, ver, platform) -> str | None:
        """A release whose wheels are all for other machines (binary, no pure wheel) has none for
        this platform: building it from source is not planned (vLLM, torch: hours and a toolkit)."""
        have = self.meta.wheel_machines(dist_of(pkg), ver)
        machine = platform_machine(platform)
        if not have or "any" in have or machine in have:
            return None  # unknown, sdist-only or covered
        return f"{pkg} {ver} has no wheel for {platform} on the index (its wheels: {', '.join(have)})"

    def _torch_fact(self, cuda, torch, python) -> str | None:
        cv = self.m.cuda[cuda]
        if torch != "?" and not _spec_match(cv.torch, torch):
            return f"torch {torch} has no {cuda} build (variant {cuda} covers torch{cv.torch})"
        return self._fact("torch", torch, python)

    def _fact(self, pkg, ver, python) -> str | None:
        rp = self.meta.requires_python(dist_of(pkg), ver) if ver and ver != "?" else ""
        return f"{pkg} {ver} requires Python {rp}" if rp and not _spec_match(rp, python + ".0") else None
