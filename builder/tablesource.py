"""Where a signed table is and how its files are read: a folder, a file in it, or an https URL
(canonical forms, so that one table has one name whatever the spelling), read as regular files
or over https within one size cap and one deadline. envbuild.trust verifies what is read.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InfraError, InputError, TrustError, UsageError
from .state import Config, config_path, load_config

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


def parse_json(data: bytes, where: str, what: str):
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise TrustError(f"{where}: not {what} ({type(e).__name__}: {str(e)[:80]})")
