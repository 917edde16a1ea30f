"""`envbuild verify`: check a signed table (its signature, freshness, every listed file and,
with --attestations, every image's attestation), or with IMAGE@sha256:… the attestations
attached to that image in its registry (envbuild.attest). The table's trust rules are
envbuild.trust's."""

from __future__ import annotations

import hashlib
import json
import os
import re

from .attest import verify_cli
from .errors import InputError, TrustError
from .row import RECORDS_ARCHIVE, Table, attestation_path
from .sign import VerifyError, load_public_key, verify_envelope
from .tablesource import DEFAULT_TABLE, PUBKEY_NAME, Location, parse_json
from .trust import add_trust_arguments, load_verified

# ---------------------------------------------------------------- coverage


_KNOWN_FILES = {"compat.md", "index.html", PUBKEY_NAME, RECORDS_ARCHIVE}


def verify_files(table: Table, info: dict) -> int:
    """Every file the signed payload lists has that sha256 (compat.md, index.html, attestations…)."""
    loc: Location = info["location"]
    allowed = _KNOWN_FILES | {attestation_path(r.id) for r in table.rows}
    for name, digest in sorted(table.files.items()):
        if name not in allowed:  # a signed payload still must not steer reads outside the table
            raise TrustError(f"{loc.envelope}: lists an unexpected file {name!r}")
        path = loc.join(name)
        data = info["reader"].get(path, missing_ok=True)
        if data is None:
            raise TrustError(f"{path}: listed in the signed table but missing")
        if hashlib.sha256(data).hexdigest() != digest:
            raise TrustError(f"{path}: sha256 differs from the one the signed table lists (tampered?)")
    if not loc.remote:  # a folder can be listed: a file the signature does not cover is named
        import os
        extra = sorted(rel for d, _, fs in os.walk(loc.base) for f in fs
                       if (rel := os.path.relpath(os.path.join(d, f), loc.base)) not in table.files
                       and rel not in ("compat.json", "compat.json.dsse"))
        if extra:
            raise TrustError(f"{loc.base}: file(s) present but not listed in the signed table: "
                             + ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else ""))
    return len(table.files)


def verify_attestations(table: Table, info: dict, pubkey=None) -> int:
    """Each row with a digest has a signed Statement whose subject is that digest."""
    from .sign import IN_TOTO_PAYLOAD_TYPE, STATEMENT_TYPE

    loc: Location = info["location"]
    key = load_public_key(pubkey) if pubkey is not None else info["public_key"]  # the table's key
    n = 0
    for row in table.rows:
        digest = row.image.digest if row.image else None
        if not digest:
            continue
        path = loc.join(attestation_path(row.id))
        raw = info["reader"].get(path, missing_ok=True)
        if raw is None:
            raise VerifyError(f"{path}: missing attestation for {row.id}")
        payload, ptype = verify_envelope(parse_json(raw, path, "a DSSE envelope"), key, path)
        stmt = parse_json(payload, path, "an in-toto statement")
        if not isinstance(stmt, dict):
            stmt = {}
        subj = stmt.get("subject")
        first = subj[0] if isinstance(subj, list) and subj and isinstance(subj[0], dict) else {}
        sha = (first.get("digest") or {}).get("sha256") if isinstance(first.get("digest"), dict) else None
        if ptype != IN_TOTO_PAYLOAD_TYPE or stmt.get("_type") != STATEMENT_TYPE or digest != f"sha256:{sha}":
            raise VerifyError(f"{path}: statement does not name image {digest}")
        n += 1
    return n


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument("table", nargs="?", default=None,
                   help="table directory, compat.json, its .dsse envelope, or an https URL "
                        f"(default: $ENVBUILD_TABLE, `table` in config.toml, else ./{DEFAULT_TABLE})")
    p.add_argument("--attestations", action="store_true",
                   help="also verify every image's in-toto attestation in attestations/")
    p.add_argument("--json", action="store_true", help="print what was verified as JSON")
    add_trust_arguments(p)


def _looks_like_image_tag(s: str) -> bool:
    """`registry:5000/repo:tag` or `repo:tag`, and no such file or folder here."""
    if os.path.exists(s) or "://" in s:
        return False
    return bool(re.fullmatch(r"(?:[a-z0-9.-]+(?::\d+)?/)?[a-z0-9._/-]+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", s))


def run(args) -> int:
    if args.table and "@sha256:" in str(args.table):  # an image by digest: its attached attestations
        return verify_cli(args.table, args.pubkey, allow_rollback=args.allow_rollback)
    if args.table and _looks_like_image_tag(str(args.table)):
        raise InputError("command line", None, "TABLE", args.table, "an image by tag: a tag can move, so verify "
                         "an image by digest (IMAGE@sha256:…, from `envbuild pick` or `docker inspect`)")
    table, info = load_verified(args.table, args.pubkey, allow_rollback=args.allow_rollback, ca=args.ca,
                                allow_legacy=getattr(args, "allow_legacy", False), defer=True)
    n = verify_files(table, info)
    n_att = verify_attestations(table, info, args.pubkey) if args.attestations else None
    info["commit"]()  # every check passed: only now is the key pinned and the serial remembered
    if getattr(args, "json", False):
        print(json.dumps({"ok": True, "envelope": str(info["envelope"]), "keyid": info["keyid"], "key": str(info["key"]),
                          "rows": len(table.rows), "serial": table.serial, "generated": table.generated,
                          "expires": table.expires, "files": n, "attestations": n_att}, indent=2, sort_keys=True))
        return 0
    print(f"OK: {info['envelope']} signed by keyid {info['keyid']} ({info['key']}); {len(table.rows)} rows, "
          f"serial {table.serial}, generated {table.generated}, expires {table.expires}; "
          f"{n} listed files match")
    if n_att is not None:
        print(f"OK: {n_att} image attestations")
    return 0
