"""Stale backtracks in a resolution: pins years older than the era that the resolver walked back
to, not ones the stack asks for.

uv keeps the newest release of what it decides first and backtracks what it meets later, down
to a release years older than the era when only that one lacks the cap in the way: verl 0.9.1 +
vLLM 0.24.0 got datasets 1.1.1 (2020) beside fsspec 2026.9.0, and datasets 1.1.1 cannot import
with the era's pyarrow; `pip install` of that stack takes datasets 5.0.1 with fsspec 2026.6.0.
A pin older than the era by STALE_YEARS is a backtrack when the index has final releases of it
from those years that every package depending on it admits (sympy's `mpmath<1.4` makes mpmath
1.3.0 a choice). The locker (lock.Locker._floor_stale) asks for such a floor and resolves again.
"""

from __future__ import annotations

import datetime as dt
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .errors import EnvbuildError, InfraError
from .index import Metadata

STALE_YEARS = 3


def years_before(day: str, years: int) -> str:
    return (dt.date.fromisoformat(day) - dt.timedelta(days=365 * years)).isoformat()


def stale_pins(pylock: str, when: str, meta: Metadata) -> dict[str, tuple[str, str, str]]:
    """name -> (pinned version, its upload date, oldest newer release) for each pin older
    than the era by STALE_YEARS while the index has final releases of it from those years."""
    cutoff = years_before(when, STALE_YEARS)
    out = {}
    for pkg in tomllib.loads(pylock).get("packages", []):
        files = [*pkg.get("wheels", []), pkg.get("sdist") or {}]
        dates = [str(f["upload-time"])[:10] for f in files if f.get("upload-time")]
        if not dates or min(dates) >= cutoff:
            continue  # recent, or the index says nothing of its date (the PyTorch index)
        name = canonicalize_name(pkg["name"])
        recent = releases_between(meta, name, cutoff, when)
        if recent and recent[0] > Version(pkg["version"]):
            out[name] = (pkg["version"], min(dates), str(recent[0]))
    return out


def admitted_floor(name: str, deps: list[str], full: dict, when: str, meta: Metadata) -> str | None:
    """The oldest release from the last STALE_YEARS that every package depending on `name` in
    this resolution (`deps`, pinned in `full`) admits (None: none is, or it is asked for directly)."""
    specs = []
    for dep in deps:
        if dep.startswith("-r") or dep not in full:
            return None
        try:
            lines = meta.get(dep, full[dep][0])["requires_dist"]
        except (InfraError, EnvbuildError):
            return None
        for line in lines:
            try:
                r = Requirement(line)
            except ValueError:
                continue
            if canonicalize_name(r.name) == name:
                specs.append(r.specifier)
    for v in releases_between(meta, name, years_before(when, STALE_YEARS), when):
        if all(sp.contains(v, prereleases=True) for sp in specs):
            return str(v)
    return None


def releases_between(meta: Metadata, name: str, start: str, end: str) -> list[Version]:
    """Final releases of `name` first uploaded in [start, end), oldest first."""
    try:
        first = meta.first_uploads(name)
    except InfraError:
        return []
    return sorted(v for v, t in first.items() if t and start <= t < end and not (v.is_prerelease or v.is_devrelease))
