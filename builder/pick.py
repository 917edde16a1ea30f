"""Print the best verified image for a selection (`envbuild pick`).

Verifies the table's signature first. Only rows whose status is "verified" (digest present,
probe passed, no level failed) and whose best level reaches --level are candidates; among them
the highest level wins, then the newest verl, engine, torch, then the newest verdict. When
nothing qualifies, it says which rows matched the selection and why each was not good enough,
and exits 1 (a verdict: nothing verified fits); there is no exception for that, run() returns 1.
"""

from __future__ import annotations

import json
from dataclasses import replace
import sys

from packaging.version import InvalidVersion, Version

from .errors import InputError
from .probe.fatbin import parse_sm
from .row import LEVELS, Combo, Row, Table, parse_pinned
from .selector import Selectors, add_selector_args, from_flags, selectors_from_args
from .vocab import DEFAULT_PLATFORM, host_platform

# `verify` (and with it urllib, ssl, the config reader) is imported inside run(): `pick`'s whole
# process must start in under 200 ms on a 1,000-row signed table (bench/pick_speed.py measures it).

LEVEL_RANK = {None: 0, "env": 1, "contract": 2, "gpu": 3}
DEFAULT_LEVEL = "contract"  # env only proves versions; contract proves verl's rollout imports
EXPLAIN_MAX = 25  # lines of explanation on a terminal; --json lists every rejected row


def _ver(v: object):
    try:
        return (1, Version(str(v)))
    except InvalidVersion:
        return (0, Version("0"))


def _selectors(sel) -> Selectors:
    return sel if isinstance(sel, Selectors) else from_flags(**sel)


def matches(row: Row, sel) -> bool:
    return matches_combo(row.combo, _selectors(sel))


def matches_combo(c: Combo, sel: Selectors) -> bool:
    return sel.matches(cuda=c.cuda, python=c.python, torch=c.torch, engine=c.engine,
                       engine_version=c.engine_version, verl=c.verl, platform=c.platform)


def gpu_gap(row: Row, sm: int | None) -> str | None:
    """Why the row's native code has no kernels for this GPU (None: it has, or no GPU asked).
    A row without coverage facts (probed before envbuild read them) is refused: unknown is not yes."""
    if sm is None:
        return None
    arch = (row.hardware or {}).get("gpu_arch")
    if not isinstance(arch, dict) or not arch.get("supports"):
        return "its GPU architecture coverage is unknown (probe it again with this envbuild)"
    if f"sm_{sm}" in arch["supports"]:
        return None
    lacking = (arch.get("lacking") or {}).get(f"sm_{sm}") or []
    return (f"no kernels for sm_{sm} in {', '.join(lacking[:4])}" if lacking else f"sm_{sm} is not covered") + \
        f" (covers {', '.join(arch['supports'])})"


def rank_key(row: Row):
    c = row.combo
    return (LEVEL_RANK.get(row.best_level, 0), _ver(c.verl), _ver(c.engine_version), _ver(c.torch),
            row.newest(), row.id)


def _state(name: str, e) -> str:
    return f"{name} {e.status}" + (f" ({e.cause})" if e.cause else "")


def why_not(row: Row, min_level: str, sm: int | None = None) -> str:
    """One line: why a matching row is not an answer."""
    st, best = row.status, row.best_level
    gap = gpu_gap(row, sm) if st == "verified" else None
    if gap:
        return f"verified, but not for this GPU: {gap}"
    if st == "verified" and not row.pinned:
        return "marked verified but has no digest: refused"
    if st == "broken":
        f = row.failure
        d = f" - {f.detail.splitlines()[-1]}" if f and f.detail.strip() else ""
        return f"broken at {f.level if f else None}: {f.cause if f else None}{d}"
    if st == "untested":
        undecided = [_state(k, v) for k, v in row.levels.items() if v.status != "not-run"]
        if row.build.status == "error":
            undecided.insert(0, f"build error ({row.build.cause})")
        what = ", ".join(undecided) or "never probed"
        return f"no verdict yet: {what}; infrastructure errors and needs-gpu are not verdicts"
    if st == "unpinned":
        return "passed, but the image was never pushed: no digest to pin"
    if st == "verified" and LEVEL_RANK.get(best, 0) >= LEVEL_RANK[min_level]:
        return "inconsistent row (its levels do not support its status): refused"
    if st == "verified":
        nxt = [k for k in LEVELS if LEVEL_RANK[k] > LEVEL_RANK.get(best, 0) and LEVEL_RANK[k] <= LEVEL_RANK[min_level]]
        return f"verified only up to {best} (< {min_level}): " + ", ".join(_state(k, row.level(k)) for k in nxt)
    return f"status {st!r}"


def eligible(row: Row, need: int) -> bool:
    """Re-derived from the levels, not only from status/best_level: an inconsistent row is refused."""
    if row.status != "verified" or not parse_pinned(row.pinned):
        return False
    rank = LEVEL_RANK.get(row.best_level, 0)
    if rank < need or rank == 0:
        return False
    if any(row.level(k).status in ("fail", "timeout") for k in LEVELS):
        return False
    return all(row.level(k).status == "pass" for k in LEVELS if LEVEL_RANK[k] <= rank)


def pick(table: Table, sel, min_level: str = DEFAULT_LEVEL, sm: int | None = None) -> tuple[Row | None, list[Row]]:
    """(best row or None, the matching rows that were not good enough). `sm`: the GPU's compute
    capability (90 for an H200): only images whose native code has kernels for it qualify."""
    sel = _selectors(sel)
    rows = table.where(lambda c: matches_combo(c, sel))
    need = LEVEL_RANK[min_level]
    good = [r for r in rows if eligible(r, need) and gpu_gap(r, sm) is None]
    if good:
        return max(good, key=rank_key), []
    return None, rows


def explain_empty(table: Table, sel, rejected: list[Row], min_level: str, sm: int | None = None) -> list[str]:
    sel = _selectors(sel)
    asked = sel.describe() + (f" --gpu sm_{sm}" if sm else "")
    if not rejected:
        lines = [f"no combination in the table matches {asked}"]
        for name in (k for k in ("verl", "engine_version", "torch", "cuda", "python") if getattr(sel, k)):
            avail = sorted({_available(c, name) for c in table.combos()} - {None}, key=_ver)
            lines.append(f"  {name.replace('engine_version', sel.engine or 'engine')} in the table: "
                         f"{', '.join(avail) or 'none'}")
        return lines
    lines = [f"no verified image at level {min_level} or above matches {asked}; "
             f"{len(rejected)} combination(s) match:"]
    shown = sorted(rejected, key=lambda r: r.id)
    for r in shown[:EXPLAIN_MAX]:
        lines.append(f"  {r.id}: {why_not(r, min_level, sm)}")
    if len(shown) > EXPLAIN_MAX:
        lines.append(f"  … and {len(shown) - EXPLAIN_MAX} more (narrow the selection, or --json for all)")
    return lines


def _available(c: Combo, name: str) -> str | None:
    v = c.get(name)
    return str(v) if v is not None else None


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    from .verify import add_trust_arguments

    add_selector_args(p, matrix=False)  # the one grammar (envbuild.selector): 0.8 selects 0.8.x
    p.add_argument("--gpu", metavar="GPU", help="only images with kernels for this GPU: H100, H200, B200, GB200, "
                                                "B300, sm_90, 9.0, ...")
    p.add_argument("--verify-attestations", action="store_true",
                   help="before answering, check the picked image's signed attestations in its registry "
                        "(envbuild attach); exit non-zero if any is missing, unsigned or tampered")
    p.add_argument("--level", choices=list(LEVELS), default=DEFAULT_LEVEL,
                   help=f"lowest probe level the image must have passed (default: {DEFAULT_LEVEL})")
    p.add_argument("--table", default=None, help="table directory, file or https URL (default: $ENVBUILD_TABLE, "
                                                 "`table` in config.toml, else ./table)")
    p.add_argument("--insecure", action="store_true",
                   help="skip signature verification and allow plain http (not recommended)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON (reference, row, verification)")
    add_trust_arguments(p)


def run(args) -> int:
    from .verify import load_verified

    table, info = load_verified(args.table, args.pubkey, args.insecure, quiet=args.json,
                                allow_rollback=args.allow_rollback, ca=args.ca)
    if args.insecure:
        print("warning: --insecure: the table's signature was NOT checked", file=sys.stderr)
    sel = selectors_from_args(args)
    if sel.platform is None:  # an image for the machine asking, unless told otherwise
        sel = replace(sel, platform=host_platform() or DEFAULT_PLATFORM)
    sm = None
    if args.gpu:
        sm = parse_sm(args.gpu)
        if sm is None:
            raise InputError("command line", None, "--gpu", args.gpu, "not a GPU (H100, B200, sm_90, 9.0, ...)")
    row, rejected = pick(table, sel, args.level, sm)
    if row and args.verify_attestations:  # the image's own attestations (envbuild.attach)
        from .attach import check_picked

        check_picked(row, args.pubkey, info, quiet=args.json)
    if args.json:
        out = {"ref": row.pinned if row else None, "level": row.best_level if row else None,
               "row": row.to_dict() if row else None, "selection": sel.describe(), "gpu": f"sm_{sm}" if sm else None,
               "min_level": args.level, "verified": info["verified"], "keyid": info["keyid"],
               "table": info["source"], "generated": table.generated, "serial": table.serial,
               "expires": table.expires}
        if not row:
            out["explanation"] = explain_empty(table, sel, rejected, args.level, sm)
            out["rejected"] = [{"id": r.id, "status": r.status, "why": why_not(r, args.level, sm)} for r in rejected]
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0 if row else 1
    if not row:
        for line in explain_empty(table, sel, rejected, args.level, sm):
            print(line, file=sys.stderr)
        return 1
    print(row.pinned)
    print(f"{row.id}: verified up to {row.best_level}", file=sys.stderr)
    return 0
