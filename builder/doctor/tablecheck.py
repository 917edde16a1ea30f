"""doctor, env group: the installed stack in the signed table (through the one query)."""

from __future__ import annotations

from typing import Any

from ..errors import EnvbuildError
from ..query import exact, scope_hits
from ..row import BROKEN, VERIFIED
from ..probe.vocab import ENGINE, LEVELS, is_failing
from ..probe.features import model_types, scope_flag
from ..probe.hardware import DEFAULT_PLATFORM, host_platform, variant_tag
from .common import (FAIL, PASS, WARN, Options, Result)


def _release(v: Any) -> str:
    return str(v or "").split("+", 1)[0]


def check_table(opt: Options, engine: str, versions: dict, scopes: frozenset = frozenset()) -> Result:
    """The installed stack's row on this machine's platform, found by the one query (the row pick
    and the page would name for exactly these versions). `scopes`: what the user's run enters
    beyond verl's core path (runscope.scopes_of): a scope the row is broken under fails."""
    try:
        from ..trust import load_verified
    except ImportError as e:
        return Result("env", "env.table", WARN, f"table verification not available ({e})",
                      "update envbuild (envbuild.verify)")
    try:
        table = load_verified(opt.table, pubkey=opt.pubkey, insecure=opt.insecure, quiet=True)[0]
    except EnvbuildError as e:
        return Result("env", "env.table", FAIL, f"table {opt.table} not verified: {e}",
                      "pass the right --pubkey, or fetch the table again")
    except Exception as e:  # a broken signature library etc.: say so, do not crash the other checks
        return Result("env", "env.table", FAIL, f"table {opt.table} not verified: {type(e).__name__}: {e}",
                      "pass the right --pubkey, or fetch the table again")
    spec = ENGINE.get(engine)
    py = str(versions.get("python") or "")
    variant = versions.get("torch_variant") or variant_tag(versions.get("torch_cuda")) or ""
    platform = opt.platform or host_platform() or DEFAULT_PLATFORM
    have = {"verl": _release(versions.get("verl")), "engine": engine,
            "engine_version": _release(versions.get(spec.dist)) if spec and spec.versioned else "",
            "torch": _release(versions.get("torch")), "cuda": variant,
            "python": ".".join(py.split(".")[:2]), "platform": platform}
    versioned = bool(spec and spec.versioned)
    missing = [k for k in ("verl", "torch") if not have[k]] + (["engine_version"] if versioned and not
                                                                 have["engine_version"] else [])
    label = (f"verl {have['verl']} + {engine} {have['engine_version']} + torch {have['torch']} "
             f"{have['cuda']} py{have['python']} on {platform}")
    if missing:
        return Result("env", "env.table", FAIL, f"not installed here: {', '.join(missing)} ({label})",
                      "install the stack, or use a verified image (`envbuild pick`)", {"installed": have})
    ans = exact(table, verl=have["verl"], engine=engine, engine_version=have["engine_version"], torch=have["torch"],
                cuda=have["cuda"], python=have["python"], platform=platform)
    row = ans.shown
    if row is None:
        return Result("env", "env.table", WARN, f"{label} does not appear in the signed table",
                      "use a verified combination (`envbuild pick`) or probe this one", {"installed": have})
    levels = {k: row.level(k).status for k in LEVELS}
    passed = [k for k, s in levels.items() if s == PASS]
    failed = [k for k, s in levels.items() if is_failing(s)]
    d = {"installed": have, "row": row.id, "levels": levels, "row_status": row.status}
    if row.status == BROKEN:  # the status the query and pick read, not a second reading of the levels
        where = failed or [row.failure.level if row.failure else "build"]
        return Result("env", "env.table", FAIL, f"{label} is in the table as broken at {where}",
                      "switch to a verified combination (`envbuild pick`)", d)
    if passed and opt.insecure:  # unsigned evidence is worth a note, not a pass
        return Result("env", "env.table", WARN, f"{label} passed {passed} in a table whose signature was "
                      "NOT checked (--insecure)", "drop --insecure and pass --pubkey", d)
    hits = scope_hits(tuple(row.scopes), scopes)
    d["scopes"] = {"entered": sorted(scopes), "broken_entered": hits,
                   "broken_avoided": [s for s in row.scopes if s not in hits]}
    if hits:
        e = row.scopes[hits[0]]
        return Result("env", "env.table", FAIL, f"{label} is broken for this run: with {e.get('label') or hits[0]}: "
                      + (str(e.get("detail") or "").splitlines() or [""])[0],
                      f"pick a stack verified for this run (`envbuild pick {scope_flag(hits[0])}`)"
                      + ("" if model_types(hits[0]) else ", or switch that feature off"), d)
    avoided = f"; broken only with {', '.join(d['scopes']['broken_avoided'])}, which this run does not use" \
        if d["scopes"]["broken_avoided"] else ""
    if row.status == VERIFIED:
        return Result("env", "env.table", PASS, f"{label} verified in the signed table at {passed}{avoided}",
                      details=d)
    return Result("env", "env.table", WARN, f"{label} is in the table but {row.status} ({levels})",
                  "run `envbuild build` / `envbuild probe` for it", d)
