"""Print the best verified image for a selection (`envbuild pick`).

Verifies the table's signature first. Only rows whose status is "verified" (digest present,
probe passed, no level failed) and whose best level reaches --level are candidates; among them
the highest level wins, then the newest verl, engine, torch, then the newest verdict. When
nothing qualifies, it says which rows matched the selection and why each was not good enough.
"""

from __future__ import annotations

import json
import sys

from packaging.version import InvalidVersion, Version

from .errors import EnvbuildError
from .table import parse_pinned

LEVEL_RANK = {None: 0, "env": 1, "contract": 2, "gpu": 3}
DEFAULT_LEVEL = "contract"  # env only proves versions; contract proves verl's rollout imports
EXPLAIN_MAX = 25  # lines of explanation on a terminal; --json lists every rejected row
SELECTORS = ("cuda", "vllm", "sglang", "verl", "torch", "python")


class NoMatch(EnvbuildError):
    exit_code = 1


def norm_cuda(v: object) -> str:
    """'cu124', '12.4', '12.4.1' -> '124': one spelling for comparing CUDA versions."""
    s = str(v or "").strip().lower()
    if s.startswith("cu"):
        s = s[2:]
    if "." in s:
        s = "".join(s.split(".")[:2])
    return s


def version_matches(want: str, have: object) -> bool:
    """Component prefix match: '0.8' matches 0.8.4, '0.8.4' matches only 0.8.4 (not 0.8.40)."""
    if have is None:
        return False
    w, h = str(want).strip().split("."), str(have).strip().split(".")
    return h[: len(w)] == w


def _ver(v: object):
    try:
        return (1, Version(str(v)))
    except InvalidVersion:
        return (0, Version("0"))


def matches(row: dict, sel: dict) -> bool:
    c = row.get("combo") or {}
    for name, want in sel.items():
        if want is None:
            continue
        if name == "cuda":
            if norm_cuda(c.get("cuda")) != norm_cuda(want):
                return False
        elif name in ("vllm", "sglang"):
            if c.get("engine") != name or not version_matches(want, c.get("engine_version")):
                return False
        elif name == "engine":
            if c.get("engine") != want:
                return False
        elif not version_matches(want, c.get(name)):
            return False
    return True


def rank_key(row: dict):
    c = row.get("combo") or {}
    newest = max((row["levels"][lv].get("created") or "" for lv in row["levels"]), default="")
    return (LEVEL_RANK.get(row.get("best_level"), 0), _ver(c.get("verl")), _ver(c.get("engine_version")),
            _ver(c.get("torch")), newest, row["id"])


def why_not(row: dict, min_level: str) -> str:
    """One line: why a matching row is not an answer."""
    st, lv = row.get("status"), row.get("levels") or {}
    if st == "verified" and not (row.get("image") or {}).get("pinned"):
        return "marked verified but has no digest: refused"
    if st == "broken":
        f = row.get("failure") or {}
        d = f" - {f['detail'].splitlines()[-1]}" if f.get("detail") else ""
        return f"broken at {f.get('level')}: {f.get('cause')}{d}"
    if st == "untested":
        undecided = [f"{k} {v['status']}" + (f" ({v['cause']})" if v.get("cause") else "")
                     for k, v in lv.items() if v["status"] != "not-run"]
        b = row.get("build") or {}
        if b.get("status") == "error":
            undecided.insert(0, f"build error ({b.get('cause')})")
        what = ", ".join(undecided) or "never probed"
        return f"no verdict yet: {what}; infrastructure errors and needs-gpu are not verdicts"
    if st == "unpinned":
        return "passed, but the image was never pushed: no digest to pin"
    if st == "verified" and LEVEL_RANK.get(row.get("best_level"), 0) >= LEVEL_RANK[min_level]:
        return "inconsistent row (its levels do not support its status): refused"
    if st == "verified":
        nxt = [k for k in ("env", "contract", "gpu") if LEVEL_RANK[k] > LEVEL_RANK.get(row.get("best_level"), 0)]
        state = ", ".join(f"{k} {lv[k]['status']}" + (f" ({lv[k]['cause']})" if lv[k].get("cause") else "")
                          for k in nxt if LEVEL_RANK[k] <= LEVEL_RANK[min_level])
        return f"verified only up to {row.get('best_level')} (< {min_level}): {state}"
    return f"status {st!r}"


def eligible(row: dict, need: int) -> bool:
    """Re-derived from the levels, not only from status/best_level: an inconsistent row is refused."""
    lv = row.get("levels") or {}
    if row.get("status") != "verified" or not parse_pinned((row.get("image") or {}).get("pinned")):
        return False
    if LEVEL_RANK.get(row.get("best_level"), 0) < need:
        return False
    if any((lv.get(k) or {}).get("status") in ("fail", "timeout") for k in ("env", "contract", "gpu")):
        return False
    return all((lv.get(k) or {}).get("status") == "pass" for k in ("env", "contract", "gpu")
               if LEVEL_RANK[k] <= LEVEL_RANK[row["best_level"]])


def pick(table: dict, sel: dict, min_level: str = DEFAULT_LEVEL) -> tuple[dict | None, list[dict]]:
    """(best row or None, the matching rows that were not good enough)."""
    rows = [r for r in table["rows"] if matches(r, sel)]
    need = LEVEL_RANK[min_level]
    good = [r for r in rows if eligible(r, need)]
    if good:
        return max(good, key=rank_key), []
    return None, rows


def explain_empty(table: dict, sel: dict, rejected: list[dict], min_level: str) -> list[str]:
    asked = " ".join(f"--{k} {v}" for k, v in sel.items() if v is not None) or "(no selectors)"
    if not rejected:
        lines = [f"no combination in the table matches {asked}"]
        for name in (k for k, v in sel.items() if v is not None):
            avail = sorted({_available(r, name) for r in table["rows"]} - {None}, key=_ver)
            lines.append(f"  {name} in the table: {', '.join(avail) or 'none'}")
        return lines
    lines = [f"no verified image at level {min_level} or above matches {asked}; "
             f"{len(rejected)} combination(s) match:"]
    shown = sorted(rejected, key=lambda r: r["id"])
    for r in shown[:EXPLAIN_MAX]:
        lines.append(f"  {r['id']}: {why_not(r, min_level)}")
    if len(shown) > EXPLAIN_MAX:
        lines.append(f"  … and {len(shown) - EXPLAIN_MAX} more (narrow the selection, or --json for all)")
    return lines


def _available(row: dict, name: str) -> str | None:
    c = row.get("combo") or {}
    if name in ("vllm", "sglang"):
        return str(c.get("engine_version")) if c.get("engine") == name else None
    v = c.get(name)
    return str(v) if v is not None else None


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    for name in SELECTORS:
        p.add_argument(f"--{name}", metavar="VERSION", help=f"{name} version (prefix: 0.8 matches 0.8.x)")
    p.add_argument("--verify-attestations", action="store_true",
                   help="before answering, check the picked image's signed attestations in its registry "
                        "(envbuild attach); exit non-zero if any is missing, unsigned or tampered")
    p.add_argument("--engine", choices=["vllm", "sglang", "hf"], help="rollout engine")
    p.add_argument("--level", choices=["env", "contract", "gpu"], default=DEFAULT_LEVEL,
                   help=f"lowest probe level the image must have passed (default: {DEFAULT_LEVEL})")
    p.add_argument("--table", default="table", help="table directory, file or URL (default: table)")
    p.add_argument("--pubkey", help="public key JSON (default: $ENVBUILD_PUBKEY, else pubkey.json next to a local table)")
    p.add_argument("--insecure", action="store_true", help="skip signature verification (not recommended)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON (reference, row, verification)")


def run(args) -> int:
    from .verify import load_verified

    table, info = load_verified(args.table, args.pubkey, args.insecure, quiet=args.json)
    if args.insecure:
        print("warning: --insecure: the table's signature was NOT checked", file=sys.stderr)
    sel = {k: getattr(args, k) for k in (*SELECTORS, "engine")}
    row, rejected = pick(table, sel, args.level)
    if row and args.verify_attestations:  # the image's own attestations (envbuild.attach)
        from .attach import check_picked

        check_picked(row, args.pubkey, info, quiet=args.json)
    if args.json:
        out = {"ref": row["image"]["pinned"] if row else None, "level": row["best_level"] if row else None,
               "row": row, "selection": {k: v for k, v in sel.items() if v is not None}, "min_level": args.level,
               "verified": info["verified"], "keyid": info["keyid"], "table": args.table,
               "generated": table.get("generated")}
        if not row:
            out["explanation"] = explain_empty(table, sel, rejected, args.level)
            out["rejected"] = [{"id": r["id"], "status": r["status"], "why": why_not(r, args.level)} for r in rejected]
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0 if row else 1
    if not row:
        for line in explain_empty(table, sel, rejected, args.level):
            print(line, file=sys.stderr)
        return 1
    print(row["image"]["pinned"])
    print(f"{row['id']}: verified up to {row['best_level']}", file=sys.stderr)
    return 0
