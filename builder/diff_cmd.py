"""`envbuild diff OLD NEW`: compare two signed tables; exit 1 on regressions (the command around
envbuild.diff, whose comparison `ci notify` reads too)."""

from __future__ import annotations

import json
import sys

from . import errors
from .diff import check_order, compare, render_markdown, render_text


def add_arguments(p) -> None:
    from .trust import add_trust_arguments

    p.add_argument("old", help="the earlier table (directory, compat.json, its .dsse, or an https URL)")
    p.add_argument("new", help="the later table")
    p.add_argument("--old-pubkey", help="key for OLD (after a key rotation); default --pubkey")
    p.add_argument("--new-pubkey", help="key for NEW; default --pubkey")
    p.add_argument("--insecure", action="store_true", help="skip signature checks (never in CI)")
    p.add_argument("--json", action="store_true", help="print the diff as JSON")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (issue / PR comment) here")
    add_trust_arguments(p, "public key JSON that signed both tables")


def run(args) -> int:
    from .fsutil import write_atomic
    from .state import TrustStore
    from .trust import check_fresh, load_verified

    ko = args.old_pubkey or args.pubkey
    kn = args.new_pubkey or args.pubkey
    # OLD is old by design: its signature is checked, not its freshness. NEW must be current,
    # checked after the order so that swapped arguments get the message that says so.
    old, _ = load_verified(args.old, ko, insecure=args.insecure, quiet=True, fresh=False, ca=args.ca,
                          allow_legacy=getattr(args, "allow_legacy", False))
    new, info = load_verified(args.new, kn, insecure=args.insecure, quiet=True, fresh=False, ca=args.ca,
                              allow_legacy=getattr(args, "allow_legacy", False))
    check_order(old, new, str(args.old), str(args.new))
    if info["verified"]:
        check_fresh(new, info["keyid"], info["envelope"], TrustStore.load(), args.allow_rollback, args.json)
    d = compare(old, new, str(args.old), str(args.new))
    if args.markdown:
        write_atomic(args.markdown, render_markdown(d, verified=not args.insecure))
    if args.json:
        json.dump(d.to_dict(), sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        sys.stdout.write(render_text(d))
    return errors.VERDICT if d.regressions else errors.OK
