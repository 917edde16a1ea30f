"""Load a signed table and believe it only after checking it (`load_verified`): the trust every
reader of a table goes through (pick, diff, notify, doctor, `envbuild verify`).

A table location is a directory (or URL ending in '/') holding compat.json + compat.json.dsse,
the compat.json file itself, or the .dsse envelope. The envelope's payload is the table; when
compat.json is present next to it, it must be byte-identical to the signed payload. A local
folder is resolved once (publish switches a symlink), so every file read comes from one set.

Trust (TUF-style, see the README's "Trust" notes):
  key        --pubkey, else the configured key ($ENVBUILD_PUBKEY or `pubkey` in config.toml,
             see envbuild.state), else trust on first use: the pubkey.json next to the table is
             pinned for that location in the state dir, loudly; a different key there later is
             refused. A key found next to the table is never trusted on its own after that.
  freshness  the payload carries `serial` and `expires`: an expired table, or a serial lower than
             the highest seen for its table (state dir), is refused; --allow-rollback reads it anyway.
             A named table's id is derived from its key and name (publish --name), so every night
             of a nightly is one table whichever runner signed it: night 1 after night 2 is a
             rollback, and a reader that pinned night 1 takes night 2.
  coverage   the payload lists the sha256 of compat.md, index.html, pubkey.json and every
             attestation; `verify` recomputes each.
  transport  remote tables over https only (plain http, and a redirect away from https, need
             --insecure); a response larger than the cap is cut off, and the whole download of a
             table has one deadline (config: max_table_mib, fetch_deadline_s; CA: --ca, `ca`,
             SSL_CERT_FILE).
Every failure is one line: TrustError (exit 2) for anything not to be believed, InputError for a
bad argument, InfraError (exit 3) for a server that cannot be reached in time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

from .errors import InputError, TrustError
from .row import TABLE_PAYLOAD_TYPE, Table, parse_utc, series_id
from .sign import PublicKey, VerifyError, load_public_key, parse_public_key, parse_public_key_bytes, verify_envelope
from .state import Config, TrustStore, config_path, load_config
from .tablesource import ENVELOPE_SUFFIX, PUBKEY_NAME, TABLE_NAME, Location, Reader, locate, parse_json, table_location



# ---------------------------------------------------------------- which key


@dataclass
class _Key:
    key: PublicKey
    how: str  # "--pubkey" | "configured" | "trusted on first use"
    pin_after: bool = False  # first use: pin once the signature verified


class NoTable(InputError):
    """Nothing is published at that location yet (the nightly's first night), as opposed to a table
    that is there and fails."""


def _resolve_key(pubkey, loc: Location, reader: Reader, cfg: Config, store: TrustStore) -> _Key:
    if pubkey is not None:
        return _Key(load_public_key(pubkey), "--pubkey")
    if cfg.pubkey:
        return _Key(load_public_key(cfg.pubkey), "configured")
    adjacent = reader.get(loc.join(PUBKEY_NAME), missing_ok=True)
    there = parse_public_key_bytes(adjacent, loc.join(PUBKEY_NAME)) if adjacent is not None else None
    pinned = store.pinned(loc.identity)
    if pinned:
        try:
            key = parse_public_key({k: pinned.get(k) for k in ("keyid", "keytype", "scheme", "keyval")}, str(store.path))
        except InputError:
            raise TrustError(f"{store.path}: the key pinned for {loc.identity} is damaged; fix or remove it")
        if there is not None and there.keyid != key.keyid:
            raise TrustError(
                f"{loc.identity}: the key next to the table changed (trusted since {pinned.get('first_seen')}: "
                f"{key.keyid[:16]}…, now {there.keyid[:16]}…): refused. If the publisher rotated its key, check "
                f"the new one with them and pass --pubkey NEW (or remove this location from {store.path})")
        return _Key(key, "trusted on first use")
    if there is None:
        raise TrustError(f"{loc.identity}: no key to check the table against: pass --pubkey KEY, or configure "
                         f"`pubkey` in {config_path()} (or $ENVBUILD_PUBKEY)")
    return _Key(there, "trusted on first use", pin_after=True)


# ---------------------------------------------------------------- load


def load_verified(src: str | os.PathLike | None = None, pubkey=None, insecure: bool = False,
                  quiet: bool = False, allow_rollback: bool = False, fresh: bool = True,
                  ca: str | None = None, allow_legacy: bool = False, defer: bool = False) -> tuple[Table, dict]:
    """(table, info) after verification; info says what was checked (keyid, how the key was chosen).

    What a reader remembers of a table (the key pinned on first use, the highest serial seen) is
    written only once the table passed every check: defer=True leaves it to info["commit"](), for
    a caller with checks of its own (verify's file list), so that a failing table pins nothing.

    fresh=False skips expiry and rollback (diff's OLD table is old by design); allow_rollback
    reads an expired or rolled-back table with a warning (forensics).
    """
    cfg = load_config()
    src = table_location(src, cfg)
    loc = locate(src)
    reader = Reader.from_config(cfg, insecure, ca)
    info = {"source": src, "envelope": loc.envelope, "keyid": None, "verified": False, "key": None,
            "location": loc, "reader": reader}
    if insecure:
        # Skip the signature, not the parsing: prefer the plain table, else the envelope payload.
        data = reader.get(loc.table, missing_ok=True) if loc.table else None
        if data is None:
            raw = reader.get(loc.envelope, missing_ok=True)
            if raw is None:
                raise InputError(src, None, "table", src, "no compat.json or compat.json.dsse there")
            import base64
            env = parse_json(raw, loc.envelope, "a DSSE envelope")
            try:
                data = base64.b64decode(env.get("payload", "") if isinstance(env, dict) else "")
            except ValueError:
                raise TrustError(f"{loc.envelope}: payload is not base64")
        return _parse_table(data, loc.table or loc.envelope), info

    raw = reader.get(loc.envelope, missing_ok=True)
    if raw is None:
        if loc.table and reader.get(loc.table, missing_ok=True) is not None:
            raise VerifyError(f"{loc.table}: unsigned (no {TABLE_NAME + ENVELOPE_SUFFIX} next to it)")
        raise NoTable(src, None, "table", src, f"no signed table ({TABLE_NAME + ENVELOPE_SUFFIX}) there; "
                      "run `envbuild publish`, or pass --table URL|PATH")
    env = parse_json(raw, loc.envelope, "a DSSE envelope")
    store = TrustStore.load()
    k = _resolve_key(pubkey, loc, reader, cfg, store)
    payload, ptype = verify_envelope(env, k.key, loc.envelope)
    if ptype != TABLE_PAYLOAD_TYPE:
        raise VerifyError(f"{loc.envelope}: payloadType {ptype!r} is not an envbuild table")
    if loc.table:
        plain = reader.get(loc.table, missing_ok=True)
        if plain is not None and plain != payload:
            raise VerifyError(f"{loc.table}: differs from the signed payload in its envelope (tampered?)")
    table = _parse_table(payload, loc.envelope)
    if table.serial is None and not allow_legacy:
        # Schema 1 (older envbuild): no serial, expiry or file list, so no rollback or freshness
        # check can hold for it.
        raise TrustError(f"{loc.envelope}: a schema-{table.schema} table (no serial, expiry or file list): "
                         "its publisher must publish again with this envbuild; --allow-legacy reads it anyway")
    if table.name and table.table_id != series_id(k.key.keyid, table.name):
        raise TrustError(f"{loc.envelope}: table id {table.table_id} is not the id of the table named "
                         f"{table.name!r} under key {k.key.keyid[:16]}… (not published by envbuild as signed?)")
    pinned = store.pinned(loc.identity) or {}
    if pinned.get("table_id") and table.table_id != pinned["table_id"] and not allow_rollback:
        raise TrustError(f"{loc.envelope}: table {_label(table)} is not the table {pinned['table_id']} pinned "
                         f"for {loc.identity} (another table signed by the same key served here?); "
                         "--allow-rollback reads it anyway")
    remember = check_fresh(table, k.key.keyid, loc.envelope, store, allow_rollback, quiet, record=False) \
        if fresh else None

    def commit() -> None:
        if remember is not None:
            remember()
        if k.pin_after or (pinned and not pinned.get("table_id") and table.table_id):
            store.pin(loc.identity, {**k.key.to_dict(), "table_id": table.table_id})
        if k.pin_after:
            print(f"envbuild: FIRST USE of the table at {loc.identity}: trusting its key {k.key.keyid} from now on "
                  f"(pinned in {store.path}). Check this keyid with the table's publisher; pass --pubkey or "
                  "configure `pubkey` to trust a key you obtained separately.", file=sys.stderr)

    info.update(keyid=k.key.keyid, verified=True, key=k.how, public_key=k.key)
    if defer:
        info["commit"] = commit
    else:
        commit()
    return table, info


def _label(table: Table) -> str:
    return f"{table.name!r} ({table.table_id})" if table.name else str(table.table_id)


def check_fresh(table: Table, keyid: str, where: str, store: TrustStore, allow_rollback: bool, quiet: bool,
                record: bool = True):
    """Refuse an expired table or one older than the newest seen for this key; remember the newest
    (record=False: return the function that remembers it, for when every other check passed)."""
    problems = []
    if table.expires:
        try:
            expired = time.time() > parse_utc(table.expires)
        except ValueError:
            raise TrustError(f"{where}: expires={table.expires!r} is not a UTC time")
        if expired:
            problems.append(f"expired at {table.expires} (serial {table.serial}); its publisher must publish again")
    elif not quiet:
        print(f"note: {where} has no expiry (published by an older envbuild)", file=sys.stderr)
    series = f"{keyid}/{table.table_id}" if table.table_id else keyid  # serials count per table
    last = store.last_serial(series)
    serial = table.serial or 0  # a table without a serial predates every table that has one
    if last is not None and serial < last:
        problems.append(f"serial {serial} is older than serial {last} already seen for "
                        + (f"table {table.name!r} of " if table.name else "") + f"key {keyid[:16]}… "
                        "(a rollback, or a stale mirror)")
    if problems and not allow_rollback:
        raise TrustError(f"{where}: " + "; ".join(problems) + "; --allow-rollback reads it anyway (forensics)")
    if problems:
        print(f"warning: {where}: " + "; ".join(problems) + " (read because of --allow-rollback)", file=sys.stderr)
        return None

    def remember() -> None:
        if table.serial is not None and (last is None or table.serial > last):
            store.saw(series, table.serial, where)
    if not record:
        return remember
    remember()
    return None


def _parse_table(data: bytes, where: str) -> Table:
    try:
        d = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise InputError(where, None, "table", where, f"not JSON ({type(e).__name__})")
    return Table.from_dict(d, where)


def add_trust_arguments(p, pubkey_help: str = "public key JSON to verify against") -> None:
    """The flags every command that reads a table shares (verify, pick, diff)."""
    p.add_argument("--pubkey", help=f"{pubkey_help} (default: $ENVBUILD_PUBKEY, `pubkey` in config.toml, "
                                    "else the key pinned on first use)")
    p.add_argument("--allow-rollback", action="store_true",
                   help="read an expired table, one older than the newest seen, or another table than "
                        "the one pinned for its location (forensics only)")
    p.add_argument("--allow-legacy", action="store_true",
                   help="read a schema-1 table (no serial, expiry or file list: published by an older envbuild)")
    p.add_argument("--ca", metavar="FILE", help="CA bundle for an https table (default: config `ca`, SSL_CERT_FILE)")
