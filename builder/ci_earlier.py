"""`envbuild ci earlier --table URL --out DIR`: what the nightly carries over from the last
published night, taken only as far as that night's signed table vouches for it.

The records come from the table's own `results.tar.gz`, whose sha256 the signed payload lists;
the table itself is verified first with the CI's key (--pubkey, or the public half of --key),
its expiry and serial checked. Nothing else from the site is folded: an archive nobody signed
could give any row the CI key's signature the next night. The earlier tables of `history.tar.gz`
(a convenience copy) are kept only where each verifies as a table signed by that key, and only as
plain files. No table there yet is a first run (exit 0); a table or archive that does not verify
stops the nightly (exit 2), as the diff step does.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

from .archive import unpack
from .errors import TrustError
from .row import RECORDS_ARCHIVE, TABLE_PAYLOAD_TYPE
from .sign import VerifyError, load_signer, public_key_of, verify_envelope
from .tablesource import table_location
from .trust import NoTable, load_verified

HISTORY_ARCHIVE = "history.tar.gz"
_RECORD = re.compile(r"records/[^/]+/[^/]+\.json")
_HISTORY_ENTRY = re.compile(r"[0-9TZ]{1,32}\.compat\.json\.dsse")


def add_arguments(p) -> None:
    p.add_argument("--table", required=True, help="the last published table: a folder holding what the site "
                                                  "served (compat.json.dsse, results.tar.gz, history.tar.gz), or a URL")
    p.add_argument("--out", required=True, help="results folder: the last table's records go to OUT/records")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--pubkey", help="the public key the table must verify with")
    key.add_argument("--key", help="the signing key (private PEM): the table must verify with its public half")
    p.add_argument("--history", default=None, metavar="DIR",
                   help="also keep the site's earlier tables (history.tar.gz) that verify with that key, in DIR")


def run(args) -> int:
    pub = public_key_of(load_signer(args.key)) if args.key else args.pubkey
    src = table_location(args.table)
    table, info = _verified(src, pub)
    if table is None:
        print(f"No earlier results at {src} (first run): the table holds tonight's results only.")
        return 0
    reader, loc = info["reader"], info["location"]
    digest = table.files.get(RECORDS_ARCHIVE)
    if digest is None:
        info["commit"]()
        print(f"The last table at {src} (serial {table.serial}) lists no records (an older envbuild published it): "
              "the table holds tonight's results only.")
        return 0
    where = loc.join(RECORDS_ARCHIVE)
    data = reader.get(where, missing_ok=True)
    if data is None:
        raise TrustError(f"{where}: listed in the signed table but missing")
    if hashlib.sha256(data).hexdigest() != digest:
        raise TrustError(f"{where}: sha256 differs from the one the signed table lists (tampered?)")
    got = unpack(data, args.out, where, accept=lambda rel: bool(_RECORD.fullmatch(rel)))
    info["commit"]()  # the table and its archive passed: only now remembered
    print(f"Earlier results: {len(got)} records from {src} (its signed table, serial {table.serial}, "
          f"key {info['keyid'][:16]}…)")
    if args.history:
        kept, dropped = _history(reader, loc, info["public_key"], Path(args.history))
        print(f"Earlier tables: {kept} kept from {HISTORY_ARCHIVE}" + (f", {dropped} dropped (not signed by that key)"
                                                                        if dropped else ""))
    return 0


def _verified(src: str, pub):
    """(table, info) of the last night, or (None, None) when nothing is published there yet."""
    try:
        return load_verified(src, pubkey=pub, quiet=True, defer=True)
    except NoTable:
        return None, None


def _history(reader, loc, key, dest: Path) -> tuple[int, int]:
    data = reader.get(loc.join(HISTORY_ARCHIVE), missing_ok=True)
    if data is None:
        return 0, 0
    staged = dest.with_name(dest.name + ".unverified")
    names = unpack(data, staged, loc.join(HISTORY_ARCHIVE), accept=lambda rel: bool(_HISTORY_ENTRY.fullmatch(rel)))
    kept = dropped = 0
    for name in names:
        raw = (staged / name).read_bytes()
        try:
            _, ptype = verify_envelope(json.loads(raw), key, name)
            ok = ptype == TABLE_PAYLOAD_TYPE
        except (VerifyError, ValueError):
            ok = False
        if ok:
            dest.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(raw)
            kept += 1
        else:
            dropped += 1
    shutil.rmtree(staged, ignore_errors=True)
    if dropped:
        print(f"warning: {dropped} entr{'y' if dropped == 1 else 'ies'} of {loc.join(HISTORY_ARCHIVE)} not signed "
              "by the table's key: dropped", file=sys.stderr)
    return kept, dropped
