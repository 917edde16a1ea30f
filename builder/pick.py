"""Print the best verified image for a selection (`envbuild pick`).

Verifies the table's signature first, then asks the one query (envbuild.query): the row that
qualifies for the selection on this machine's platform (or --platform), at --level or above, with
kernels for --gpu and running on --driver; the highest level wins, then the newest verl, engine,
torch, then the newest verdict. When nothing qualifies, it says which rows matched and why each
was not good enough, and exits 1 (a verdict: nothing verified fits).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from .errors import OK, VERDICT, InputError
from .query import DEFAULT_LEVEL, Answer, Ask, answer, versions_in, why_not
from .row import VERIFIED, Row, Table
from .runscope import add_run_arguments, scopes_from_args
from .selector import add_selector_args, selectors_from_args
from .probe.vocab import LEVELS
from .probe.hardware import DEFAULT_PLATFORM, host_platform, parse_gpu

# `verify` (and with it urllib, ssl, the config reader) is imported inside run(): `pick`'s whole
# process must start in under 200 ms on a 1,000-row signed table (bench/pick_speed.py measures it).

EXPLAIN_MAX = 25  # lines of explanation on a terminal; --json lists every rejected row


def pick(table: Table, sel, min_level: str = DEFAULT_LEVEL, gpu: str | None = None,
         driver: str | None = None) -> tuple[Row | None, list[Row]]:
    """(best row or None, the matching rows that were not good enough): query.answer, unpacked."""
    from .query import ask

    ans = answer(table, ask(sel, min_level, gpu, driver))
    return ans.best, ans.rejected


def explain_empty(table: Table, a: Ask, ans: Answer) -> list[str]:
    asked = a.describe()
    if not ans.rows:
        lines = [f"no combination in the table matches {asked}"]
        sel = a.selectors
        for name in (k for k in ("verl", "engine_version", "torch", "cuda", "python") if getattr(sel, k)):
            avail = versions_in(table, name, sel)
            label = name.replace("engine_version", sel.engine or "engine")
            lines.append(f"  {label} in the table: {', '.join(avail) or 'none'}")
        return lines
    lines = [f"no verified image at level {a.level} or above matches {asked}; "
             f"{len(ans.rows)} combination(s) match:"]
    shown = sorted(ans.rows, key=lambda r: r.id)
    for r in shown[:EXPLAIN_MAX]:
        lines.append(f"  {r.id}: {why_not(r, a)}")
    if len(shown) > EXPLAIN_MAX:
        lines.append(f"  … and {len(shown) - EXPLAIN_MAX} more (narrow the selection, or --json for all)")
    return lines


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    from .trust import add_trust_arguments

    add_selector_args(p, matrix=False)  # the one grammar (envbuild.selector): 0.8 selects 0.8.x
    p.add_argument("--gpu", metavar="GPU", help="only images with kernels for this GPU: H100, H200, B200, GB200, "
                                                "B300, sm_90, 9.0, ...")
    p.add_argument("--driver", metavar="VERSION", help="only images whose CUDA runs on this NVIDIA driver (550.54.14)")
    p.add_argument("--in-place", action="store_true",
                   help="a stack verified in place on a GPU node (envbuild venv + probe --here), for a node "
                        "without Docker: prints the row and how to make its environment, not an image")
    p.add_argument("--verify-attestations", action="store_true",
                   help="before answering, check the picked image's signed attestations in its registry "
                        "(envbuild attach) and that its attested test result is the row's; exit non-zero if "
                        "any is missing, unsigned, tampered or disagrees")
    p.add_argument("--level", choices=list(LEVELS), default=DEFAULT_LEVEL,
                   help=f"lowest probe level the image must have passed (default: {DEFAULT_LEVEL})")
    p.add_argument("--table", default=None, help="table directory, file or https URL (default: $ENVBUILD_TABLE, "
                                                 "`table` in config.toml, else ./table)")
    p.add_argument("--insecure", action="store_true",
                   help="skip signature verification and allow plain http (not recommended)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON (reference, row, verification)")
    add_run_arguments(p)
    add_trust_arguments(p)


def ask_from_args(args) -> Ask:
    sel = selectors_from_args(args)
    if sel.platform is None:  # an image for the machine asking, unless told otherwise
        sel = replace(sel, platform=host_platform() or DEFAULT_PLATFORM)
    gpu = None
    if getattr(args, "gpu", None):
        gpu = parse_gpu(args.gpu)
        if gpu is None:
            raise InputError("command line", None, "--gpu", args.gpu, "not a GPU (H100, B200, sm_90, 9.0, ...)")
    driver = getattr(args, "driver", None)
    if driver is not None and not all(p.isdigit() for p in driver.split(".")):
        raise InputError("command line", None, "--driver", driver, "not a driver version (550.54.14)")
    return Ask(sel, args.level, gpu, driver, in_place=getattr(args, "in_place", False), scopes=scopes_from_args(args))


def run(args) -> int:
    from .trust import load_verified

    table, info = load_verified(args.table, args.pubkey, args.insecure, quiet=args.json,
                                allow_rollback=args.allow_rollback, ca=args.ca,
                                allow_legacy=getattr(args, "allow_legacy", False))
    if args.insecure:
        print("warning: --insecure: the table's signature was NOT checked", file=sys.stderr)
    a = ask_from_args(args)
    ans = answer(table, a)
    row = ans.best
    if row and args.verify_attestations:  # the image's own attestations (envbuild.attest)
        from .attest import check_picked

        check_picked(row, args.pubkey, info, quiet=args.json, allow_rollback=args.allow_rollback)
    if args.json:
        out = {"ref": (None if a.in_place else row.pinned) if row else None,
               "level": ((row.in_place.get("best_level") if a.in_place else row.best_level) if row else None),
               "in_place": a.in_place,
               "row": row.to_dict() if row else None, "selection": a.selectors.describe(),
               "gpu": a.gpu, "driver": a.driver, "scopes": sorted(a.scopes),
               "min_level": a.level, "verified": info["verified"], "keyid": info["keyid"],
               "table": info["source"], "generated": table.generated, "serial": table.serial,
               "expires": table.expires}
        if not row:
            out["explanation"] = explain_empty(table, a, ans)
            out["rejected"] = [{"id": r.id, "status": r.status, "why": why_not(r, a)} for r in ans.rejected]
        print(json.dumps(out, indent=2, sort_keys=True))
        return OK if row else VERDICT
    if not row:
        for line in explain_empty(table, a, ans):
            print(line, file=sys.stderr)
        return VERDICT  # no image qualifies: a verdict, not an error
    if a.in_place:
        ip = row.in_place
        print(row.id)
        print(f"{row.id}: verified in place up to {ip.get('best_level')} on {', '.join(ip['host'].get('gpu') or [])} "
              f"(driver {ip['host'].get('driver')}); make its environment with\n"
              f"  envbuild wheelhouse {_selectors_of(row)} --out WHEELHOUSE\n"
              f"  envbuild venv {_selectors_of(row)} --wheelhouse WHEELHOUSE --out VENV [--host-packages]",
              file=sys.stderr)
        return 0
    print(row.pinned)
    print(f"{row.id}: verified up to {row.best_level}", file=sys.stderr)
    for sc, e in row.scopes.items():  # broken only for runs that opt in: say which, so a user can check theirs
        print(f"  caveat: broken with {e.get('label') or sc} ({sc}): "
              f"{(str(e.get('detail') or '').splitlines() or [''])[0]}", file=sys.stderr)
    if row.in_place.get("status") == VERIFIED:
        print(f"  its lock also passed {row.in_place.get('best_level')} in place on "
              f"{', '.join(row.in_place['host'].get('gpu') or [])} (the stack, not this image)", file=sys.stderr)
    return 0


def _selectors_of(row: Row) -> str:
    c = row.combo
    eng = f"--{c.engine} {c.engine_version}" if c.engine_version else f"--{c.engine}"
    return (f"--verl {c.verl} {eng} --torch {c.torch} --cuda {c.cuda} --python {c.python} "
            f"--platform {c.platform or DEFAULT_PLATFORM}")
