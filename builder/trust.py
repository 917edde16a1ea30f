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
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InfraError, InputError, TrustError, UsageError
from .row import TABLE_PAYLOAD_TYPE, Table, parse_utc, series_id
from .sign import PublicKey, VerifyError, load_public_key, parse_public_key, parse_public_key_bytes, verify_envelope
from .state import Config, TrustStore, config_path, load_config

TABLE_NAME = "compat.json"
ENVELOPE_SUFFIX = ".dsse"
PUBKEY_NAME = "pubkey.json"
DEFAULT_TABLE = "table"


def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))


def _normalize(src) -> str:
    src = str(src)
    if src.startswith("file://"):
        from urllib.parse import unquote, urlparse
        src = unquote(urlparse(src).path)
    return src


def table_location(arg: str | os.PathLike | None, cfg: Config | None = None) -> str:
    """--table if given, else the configured default, else ./table if it exists; else say what to do."""
    if arg:
        return str(arg)
    cfg = cfg or load_config()
    if cfg.table:
        return cfg.table
    if os.path.lexists(DEFAULT_TABLE):
        return DEFAULT_TABLE
    raise UsageError(
        f"no table to read: there is no ./{DEFAULT_TABLE} here and no default is configured. Either run "
        f"`envbuild publish` (writes ./{DEFAULT_TABLE}), pass --table URL|PATH, or configure your team's "
        f"table once: `table = \"https://…/\"` and `pubkey = \"/path/to/pubkey.json\"` in {config_path()} "
        "(or set ENVBUILD_TABLE and ENVBUILD_PUBKEY)")


@dataclass
class Location:
    """Where a table's files are: `identity` names it for trust-on-first-use, `base` is read from."""

    envelope: str
    table: str | None
    base: str  # folder (resolved once for a local table) or URL ending in '/'
    identity: str
    remote: bool

    def join(self, name: str) -> str:
        return self.base + name if self.remote else str(Path(self.base) / name)


def locate(src: str) -> Location:
    src = _normalize(src)
    if _is_url(src):
        if src.endswith(ENVELOPE_SUFFIX):
            table = src[: -len(ENVELOPE_SUFFIX)]
        elif src.endswith(".json"):
            table = src
        else:
            table = (src if src.endswith("/") else src + "/") + TABLE_NAME
        base = table.rsplit("/", 1)[0] + "/"
        return Location(table + ENVELOPE_SUFFIX, table, base, canonical_url(base), True)
    p = Path(src)
    if src.endswith(ENVELOPE_SUFFIX):
        folder, table = p.parent, p.name[: -len(ENVELOPE_SUFFIX)]
    elif p.is_dir():
        folder, table = p, TABLE_NAME
    else:
        folder, table = p.parent, p.name
    real = os.path.realpath(folder)  # once: publish may switch the folder while we read
    return Location(str(Path(real) / (table + ENVELOPE_SUFFIX)), str(Path(real) / table), real,
                    canonical_folder(real), False)


def canonical_url(url: str) -> str:
    """One spelling per folder URL: scheme and host lower case, no default port, no empty, `.` or
    `..` path segments, no query or fragment (`//static/`, `/static/./` and `/static//` are one)."""
    from urllib.parse import urlsplit, urlunsplit
    import posixpath
    u = urlsplit(url)
    host = (u.hostname or "").lower()
    port = u.port if u.port not in (None, {"http": 80, "https": 443}.get(u.scheme.lower())) else None
    path = posixpath.normpath("/" + u.path.lstrip("/")) if u.path else "/"
    path = "/" + path.lstrip("/")  # normpath keeps a leading '//'
    if not path.endswith("/"):
        path += "/"
    return urlunsplit((u.scheme.lower(), host + (f":{port}" if port else ""), path, "", ""))


def canonical_folder(real: str) -> str:
    """A table folder by its real path; a publish site (`DIR/.NAME.sites/SERIAL-…`, which changes
    with every publish) by the link publish keeps switching to it (`DIR/NAME`). Symlinks to either
    name the same table."""
    parent = os.path.dirname(real)
    name = os.path.basename(parent)
    if name.startswith(".") and name.endswith(".sites") and len(name) > len("..sites"):
        return os.path.join(os.path.dirname(parent), name[1:-len(".sites")])
    return real


# ---------------------------------------------------------------- reading, bounded


class _NotFound(Exception):
    pass


@dataclass
class Reader:
    """Reads a table's files: local regular files or https, within one size cap and one deadline."""

    insecure: bool = False
    ca: str | None = None
    max_bytes: int = 64 * 1024 * 1024
    deadline_s: float = 30.0
    _end: float = field(default=0.0, repr=False)

    @classmethod
    def from_config(cls, cfg: Config, insecure: bool = False, ca: str | None = None) -> "Reader":
        return cls(insecure, ca or cfg.ca, cfg.max_table_bytes, cfg.fetch_deadline_s)

    def get(self, loc: str, missing_ok: bool = False) -> bytes | None:
        try:
            return self._http(loc) if _is_url(loc) else self._file(loc)
        except _NotFound:
            if missing_ok:
                return None
            raise TrustError(f"{loc}: not found")

    def _file(self, loc: str) -> bytes:
        try:
            st = os.stat(loc)
        except FileNotFoundError:
            raise _NotFound
        except OSError as e:
            raise InputError(loc, None, "table", loc, f"cannot read ({e.strerror})")
        import stat as _stat
        if not _stat.S_ISREG(st.st_mode):  # a FIFO or device would hang or never end
            raise InputError(loc, None, "table", loc, "not a regular file")
        if st.st_size > self.max_bytes:
            raise InputError(loc, None, "table", f"{st.st_size} bytes", f"larger than the cap of {self.max_bytes} "
                             "bytes (max_table_mib in config.toml)")
        with open(loc, "rb") as f:
            return f.read(self.max_bytes + 1)

    def _http(self, url: str) -> bytes:
        import threading

        if url.startswith("http://") and not self.insecure:
            raise TrustError(f"{url}: plain http is refused (anyone on the path could replay or withhold the "
                             "table); use https, or --insecure")
        if not self._end:
            self._end = time.monotonic() + self.deadline_s  # one deadline for every file of this table
        remaining = self._end - time.monotonic()
        if remaining <= 0:
            raise InfraError("table-deadline", f"{url}: the table's download took longer than {self.deadline_s:g} s")
        box: dict = {}
        stop = threading.Event()

        def work():
            try:
                box["data"] = self._download(url, remaining, stop)
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e

        # A thread, so that the deadline holds whatever the server does (a byte a second, a
        # header that never ends): the caller stops waiting; the worker stops at its next read.
        t = threading.Thread(target=work, daemon=True, name="envbuild-fetch")
        t.start()
        t.join(remaining)
        if t.is_alive():
            stop.set()
            raise InfraError("table-deadline", f"{url}: not downloaded within {self.deadline_s:g} s "
                             "(fetch_deadline_s in config.toml)")
        if "error" in box:
            raise box["error"]
        return box["data"]

    def _download(self, url: str, timeout: float, stop) -> bytes:
        import http.client
        import ssl
        import urllib.error  # here: urllib.request costs ~25 ms to import; local tables never need it
        import urllib.request
        from urllib.parse import urlparse

        insecure = self.insecure

        class NoDowngrade(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, req, fp, code, msg, headers, newurl):
                if urlparse(newurl).scheme != "https" and not insecure:
                    raise TrustError(f"{req.full_url}: redirected to {newurl}, away from https: refused "
                                     "(--insecure allows it)")
                return super().redirect_request(req, fp, code, msg, headers, newurl)

        try:
            ctx = ssl.create_default_context(cafile=self.ca) if self.ca else ssl.create_default_context()
        except (OSError, ssl.SSLError) as e:
            raise InputError(str(self.ca), None, "ca", self.ca, f"not a CA bundle ({e})")
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx), NoDowngrade())
        req = urllib.request.Request(url, headers={"User-Agent": "envbuild"})
        try:
            with opener.open(req, timeout=min(timeout, 10)) as resp:
                size = resp.headers.get("Content-Length")
                if size and size.isdigit() and int(size) > self.max_bytes:
                    raise InfraError("table-too-large", f"{url}: {size} bytes, over the cap of {self.max_bytes}")
                chunks, total = [], 0
                while not stop.is_set():
                    b = resp.read1(1 << 16)
                    if not b:
                        if size and size.isdigit() and total < int(size):  # the connection ended early
                            raise InfraError("table-unreachable", f"{url}: {total} of {size} bytes arrived (truncated)")
                        return b"".join(chunks)
                    total += len(b)
                    if total > self.max_bytes:
                        raise InfraError("table-too-large", f"{url}: more than the cap of {self.max_bytes} bytes "
                                         "(max_table_mib in config.toml)")
                    chunks.append(b)
                return b""
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise _NotFound
            raise InfraError("table-unreachable", f"{url}: HTTP {e.code}")
        except http.client.HTTPException as e:  # a bad status line, 100+ headers, a bad chunk size, cut short
            raise InfraError("table-unreachable", f"{url}: malformed HTTP from the server ({type(e).__name__})")
        except ssl.SSLCertVerificationError as e:
            raise TrustError(f"{url}: TLS certificate not trusted ({e.verify_message}); pass --ca FILE or set "
                             "SSL_CERT_FILE")
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise TrustError(f"{url}: TLS certificate not trusted ({reason.verify_message}); pass --ca FILE "
                                 "or set SSL_CERT_FILE")
            raise InfraError("table-unreachable", f"{url}: {reason}")


def _json(data: bytes, where: str, what: str):
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TrustError(f"{where}: not {what} ({type(e).__name__}: {str(e)[:80]})")


# ---------------------------------------------------------------- which key


@dataclass
class _Key:
    key: PublicKey
    how: str  # "--pubkey" | "configured" | "trusted on first use"
    pin_after: bool = False  # first use: pin once the signature verified


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
            env = _json(raw, loc.envelope, "a DSSE envelope")
            try:
                data = base64.b64decode(env.get("payload", "") if isinstance(env, dict) else "")
            except ValueError:
                raise TrustError(f"{loc.envelope}: payload is not base64")
        return _parse_table(data, loc.table or loc.envelope), info

    raw = reader.get(loc.envelope, missing_ok=True)
    if raw is None:
        if loc.table and reader.get(loc.table, missing_ok=True) is not None:
            raise VerifyError(f"{loc.table}: unsigned (no {TABLE_NAME + ENVELOPE_SUFFIX} next to it)")
        raise InputError(src, None, "table", src, f"no signed table ({TABLE_NAME + ENVELOPE_SUFFIX}) there; "
                         "run `envbuild publish`, or pass --table URL|PATH")
    env = _json(raw, loc.envelope, "a DSSE envelope")
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
