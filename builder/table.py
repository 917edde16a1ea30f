"""Sign the compatibility table and publish its site (`envbuild publish` is publish_cmd): the rows come from
envbuild.fold, the page and compat.md from envbuild.views.

Output (--out is a symlink to the current set, see "publish" below): compat.json, compat.json.dsse
(DSSE envelope whose payload is exactly compat.json's bytes), compat.md, index.html, pubkey.json,
attestations/<row id>.dsse.json (one signed in-toto Statement per image, test-result predicate,
subject = image digest; the file name passes fsutil.safe_name). The signed payload (row.Table,
schema 2) carries a serial (higher than the table it replaces), an expiry (--expires-days) and
the sha256 of every other file, so `verify` covers them all.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from .views import render_html, render_markdown
from .errors import InputError
from .fold import fold
from .fsutil import exclusive, write_atomic
from .record import iter_records
from .archive import files_under, pack
from .row import RECORDS_ARCHIVE, TABLE_NAME_RE, TABLE_PAYLOAD_TYPE, Row, Table, attestation_path, parse_pinned, series_id
from .sign import IN_TOTO_PAYLOAD_TYPE, TEST_RESULT_PREDICATE, load_signer, public_key_of, sign_envelope, sign_statement, statement
from .probe.vocab import LEVELS, PASS, is_failing

DEFAULT_EXPIRES_DAYS = 30
SITE_FILES = ("compat.json", "compat.json.dsse", "compat.md", "index.html", "pubkey.json", "attestations",
              RECORDS_ARCHIVE)
KEEP_SITES = 2  # the current site and the one before: a reader that resolved the old one can finish


def _epoch() -> int:
    # SOURCE_DATE_EPOCH makes a publish reproducible byte for byte (reproducible-builds.org).
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return int(epoch) if epoch and epoch.isdigit() else int(time.time())


def _utc(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def build_table(rows: list[Row], keyid: str | None = None, serial: int | None = None,
                expires_days: float = DEFAULT_EXPIRES_DAYS) -> Table:
    now = _epoch()
    return Table(rows=rows, generated=_utc(now), keyid=keyid, serial=now if serial is None else serial,
                 expires=_utc(now + int(expires_days * 86400)))


def table_bytes(table: Table) -> bytes:
    return (json.dumps(table.to_dict(), indent=1, sort_keys=True) + "\n").encode()


# ---------------------------------------------------------------- attestations


def image_statement(row: Row) -> dict | None:
    """An in-toto test-result Statement for a row's image, or None without a digest."""
    pinned = parse_pinned(row.pinned)
    if not pinned:
        return None
    st = {lv: row.level(lv).status for lv in LEVELS}
    passed = [f"envbuild-probe/{lv}" for lv in LEVELS if st[lv] == PASS]
    failed = [f"envbuild-probe/{lv}" for lv in LEVELS if is_failing(st[lv])]
    warned = [f"envbuild-probe/{lv}" for lv in LEVELS if st[lv] != PASS and not is_failing(st[lv])]
    result = "FAILED" if failed else "WARNED" if warned or not passed else "PASSED"
    config = [{"name": "envbuild-combination", "annotations": {"id": row.id, **row.combo.to_dict()}}]
    if row.lock_hash:
        config.append({"name": "lock", "digest": {"sha256": row.lock_hash}})
    return statement(pinned[0], pinned[1], TEST_RESULT_PREDICATE, {
        "result": result, "configuration": config,
        "passedTests": passed, "warnedTests": warned, "failedTests": failed,
        "envbuild": {"best_level": row.best_level, "status": row.status,
                     "levels": {k: v.to_dict() for k, v in row.levels.items()}},
    })


# ---------------------------------------------------------------- publish
#
# The site is published as a set: every file is written into a fresh folder next to --out
# (.NAME.sites/<serial>-<random>/), then --out, a symlink, is switched to it with one rename.
# A reader resolves --out once and sees the old set or the new one, never a mix; a crash before
# the switch leaves the old set in place and verifiable (the half-written folder is removed by
# the next publish).


def _table_id(sites: Path) -> str:
    """This publish folder's table id: made once, kept beside its sites (written with the first
    site; a new id is a new table to every reader that pinned this location)."""
    try:
        got = (sites / "table-id").read_text().strip()
        if got:
            return got
    except OSError:
        pass
    return secrets.token_hex(16)


def _sites_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.sites"


def _previous(out: Path) -> tuple[Table | None, bytes | None]:
    """The table currently in --out (unverified: only its serial and bytes are used)."""
    try:
        data = (out / "compat.json").read_bytes()
        return Table.from_dict(json.loads(data), str(out / "compat.json")), data
    except (OSError, ValueError, InputError):
        return None, None


def _check_adoptable(out: Path) -> None:
    """--out may be a real folder only if it holds nothing but a table (an older envbuild's)."""
    extra = sorted(p.name for p in out.iterdir() if p.name not in SITE_FILES)
    if extra:
        raise InputError(str(out), None, "--out", str(out),
                         f"is a folder holding other files ({', '.join(extra[:3])}); publish into a new "
                         "folder: envbuild replaces --out as a whole")


def _adopt_legacy_dir(out: Path, sites: Path) -> None:
    """A real folder from an older envbuild (or an empty one) becomes the first site."""
    _check_adoptable(out)
    dest = sites / f"0-legacy-{secrets.token_hex(4)}"
    os.rename(out, dest)  # the one non-atomic step, once per table folder: --out is missing meanwhile
    _switch(out, dest)


def _switch(out: Path, site: Path) -> None:
    tmp = out.parent / f".{out.name}.link-{secrets.token_hex(4)}"
    os.symlink(os.path.relpath(site, out.parent), tmp)
    os.replace(tmp, out)  # atomic: readers see the old target or the new one


def _prune(sites: Path, keep: set[str]) -> None:
    """Remove sites that are neither current nor the one before (and crashed half-written ones)."""
    for p in sites.iterdir():
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def publish(results: str | os.PathLike, key: str | os.PathLike, out: str | os.PathLike,
            expires_days: float = DEFAULT_EXPIRES_DAYS, name: str | None = None,
            refused: list[str] | None = None, only: set[str] | None = None) -> Table:
    """Fold the records under `results` into a signed site at `out`. `name` makes the table one
    series with every table of that name signed by this key, wherever it is published (the
    nightly publishes from a fresh runner each night); without it the table is this folder's.
    Records fold.refusal turns away are not folded; their reasons go to `refused`. With `only`, the
    records folded, and carried in the table's records archive, are those it names (paths under
    `results`: the ones their jobs signed, envbuild.recordsig)."""
    if not Path(results).is_dir():
        raise InputError(str(results), None, "--results", str(results), "no such directory")
    if not 0 < expires_days <= 3650:
        raise InputError("--expires-days", None, "--expires-days", expires_days, "must be in (0, 3650]")
    if name is not None and not TABLE_NAME_RE.fullmatch(name):
        raise InputError("--name", None, "--name", name, "expected letters, digits and . _ / - (at most 128)")
    signer = load_signer(key)  # fail on a bad key before writing anything
    pub = public_key_of(signer)
    rows = fold(iter_records(results, only), refused)  # an unsafe combination id stops here, before any write

    out = Path(os.path.abspath(out))
    if out.is_symlink() and Path(os.path.realpath(out)).parent != Path(os.path.realpath(_sites_dir(out))):
        out = Path(os.path.realpath(out))  # a user's own link to the table folder: publish there
    sites = _sites_dir(out)
    prev, prev_bytes = _previous(out)

    table = build_table(rows, pub.keyid, expires_days=expires_days)
    table.name = name
    table.table_id = series_id(pub.keyid, name) if name else _table_id(sites)
    attestations: dict[str, bytes] = {}
    for row in rows:
        stmt = image_statement(row)
        if stmt is not None:
            env = sign_statement(stmt, signer)
            assert env["payloadType"] == IN_TOTO_PAYLOAD_TYPE
            attestations[attestation_path(row.id)] = (json.dumps(env, indent=1) + "\n").encode()

    # The records this table folds, signed with it (listed in its payload): the next night folds
    # its results onto these after verifying this table (`envbuild ci earlier`), never onto an
    # archive nobody signed.
    records = pack(results, [f for f in files_under(results, "records/*/*.json") if only is None or f in only])

    def views() -> dict[str, bytes]:  # the files the signed payload lists, for table.serial as set
        files = {**attestations, RECORDS_ARCHIVE: records,
                 "pubkey.json": (json.dumps(pub.to_dict(), indent=2) + "\n").encode(),
                 "compat.md": render_markdown(table).encode(),
                 "index.html": render_html(table, pub.to_dict()).encode()}
        table.files = {name: _sha256(data) for name, data in sorted(files.items())}
        return files

    # Serial: higher than the table it replaces (monotonic for readers), time-based in a fresh
    # folder (a new CI machine still moves forward); an identical republish keeps its serial so
    # that SOURCE_DATE_EPOCH reproduces it byte for byte.
    if prev is not None and prev.serial is not None:
        table.serial = prev.serial
        files = views()
        if table_bytes(table) != prev_bytes:
            table.serial = max(prev.serial + 1, _epoch())
            files = views()
    else:
        files = views()
    data = table_bytes(table)
    envelope = sign_envelope(data, TABLE_PAYLOAD_TYPE, signer)
    files["compat.json"] = data
    files["compat.json.dsse"] = (json.dumps(envelope, indent=1) + "\n").encode()

    if out.exists() and not out.is_symlink():
        if not out.is_dir():
            raise InputError(str(out), None, "--out", str(out), "exists and is not a folder")
        _check_adoptable(out)  # before anything is written next to it
    sites.mkdir(parents=True, exist_ok=True)
    with exclusive(sites / ".lock", f"the table folder {out}, which another publish is writing"):  # one after the other
        if out.is_dir() and not out.is_symlink():
            _adopt_legacy_dir(out, sites)
        current = os.path.realpath(out) if out.is_symlink() else None
        if not name and not (sites / "table-id").exists():
            write_atomic(sites / "table-id", table.table_id + "\n")
        site = sites / f"{table.serial}-{secrets.token_hex(4)}"
        for name, blob in files.items():
            write_atomic(site / name, blob)
        _switch(out, site)
        _prune(sites, {site.name, ".lock", "table-id"} | ({Path(current).name} if current else set()))
    return table
