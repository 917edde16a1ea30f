"""The user's own envbuild files: configuration and trust state (never inside the package).

config dir  $ENVBUILD_CONFIG, else $XDG_CONFIG_HOME/envbuild, else ~/.config/envbuild
            config.toml, for example:
                table  = "https://tables.example.org/envbuild/"   # pick/verify/doctor default
                pubkey = "team-pubkey.json"     # the key you trust (relative to this folder)
                ca = "/etc/ssl/team-ca.pem"     # extra CA bundle for https tables (else SSL_CERT_FILE)
                fetch_deadline_s = 30           # whole download of a remote table
                max_table_mib = 64              # refuse a larger response
            The environment wins over the file: ENVBUILD_TABLE, ENVBUILD_PUBKEY.
state dir   $ENVBUILD_STATE, else $XDG_STATE_HOME/envbuild, else ~/.local/state/envbuild
            trust.json: the key trusted on first use per table location, and the highest table
            serial seen per signing key (rollback protection). Written atomically.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InfraError, InputError

CONFIG_NAME = "config.toml"
TRUST_NAME = "trust.json"
CONFIG_MAX_BYTES = 64 * 1024
TRUST_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_DEADLINE_S = 30.0
DEFAULT_MAX_MIB = 64


def _xdg(env: str, xdg: str, fallback: str) -> Path:
    own = os.environ.get(env)
    if own:
        return Path(own)
    base = os.environ.get(xdg) or os.path.expanduser(fallback)
    return Path(base) / "envbuild"


def config_dir() -> Path:
    return _xdg("ENVBUILD_CONFIG", "XDG_CONFIG_HOME", "~/.config")


def state_dir() -> Path:
    return _xdg("ENVBUILD_STATE", "XDG_STATE_HOME", "~/.local/state")


def config_path() -> Path:
    return config_dir() / CONFIG_NAME


@dataclass(frozen=True)
class Config:
    table: str | None = None
    pubkey: str | None = None
    ca: str | None = None
    fetch_deadline_s: float = DEFAULT_DEADLINE_S
    max_table_bytes: int = DEFAULT_MAX_MIB * 1024 * 1024
    source: str | None = None  # the file read, if any


_KEYS = {"table": str, "pubkey": str, "ca": str, "fetch_deadline_s": (int, float), "max_table_mib": (int, float)}


def _read_bounded(path: Path, limit: int = CONFIG_MAX_BYTES) -> bytes:
    """A regular file of bounded size (a FIFO or a device would hang or flood the reader)."""
    try:
        st = path.stat()
    except OSError as e:
        raise InputError(str(path), None, "config", str(path), f"cannot read ({e.strerror})")
    if not path.is_file():
        raise InputError(str(path), None, "config", str(path), "not a regular file")
    if st.st_size > limit:
        raise InputError(str(path), None, "config", f"{st.st_size} bytes", f"larger than {limit} bytes")
    with open(path, "rb") as f:
        return f.read(limit + 1)


def load_config() -> Config:
    """The config file (if any) with the environment applied; bad values are exit 2."""
    path = config_path()
    values: dict = {}
    if path.exists():
        import tomllib  # here: only when a config file exists (pick's start-up is measured)

        raw = _read_bounded(path)
        try:
            values = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise InputError(str(path), None, "config", f"byte {e.start}", "not UTF-8")
        except tomllib.TOMLDecodeError as e:
            raise InputError(str(path), getattr(e, "lineno", None), "config", str(path), f"not TOML ({e})")
        for k, v in values.items():
            if k not in _KEYS:
                raise InputError(str(path), None, k, v, f"unknown key (known: {', '.join(_KEYS)})")
            if not isinstance(v, _KEYS[k]) or isinstance(v, bool):
                raise InputError(str(path), None, k, v, "wrong type")
            if k in ("fetch_deadline_s", "max_table_mib") and not 0 < v <= 10 ** 6:
                raise InputError(str(path), None, k, v, "must be a positive number")
    pubkey = values.get("pubkey")
    if pubkey and not os.path.isabs(os.path.expanduser(pubkey)):
        pubkey = str(config_dir() / pubkey)  # relative to the config folder, not the working dir
    return Config(
        table=os.environ.get("ENVBUILD_TABLE") or values.get("table"),
        pubkey=os.environ.get("ENVBUILD_PUBKEY") or (os.path.expanduser(pubkey) if pubkey else None),
        ca=values.get("ca"),
        fetch_deadline_s=float(values.get("fetch_deadline_s", DEFAULT_DEADLINE_S)),
        max_table_bytes=int(values.get("max_table_mib", DEFAULT_MAX_MIB) * 1024 * 1024),
        source=str(path) if values else None,
    )


# ---------------------------------------------------------------- trust state


@dataclass
class TrustStore:
    """trust.json: {"keys": {location: {keyid, public, first_seen}}, "serials": {keyid: {...}}}."""

    path: Path
    keys: dict = field(default_factory=dict)
    serials: dict = field(default_factory=dict)

    @classmethod
    def load(cls) -> "TrustStore":
        path = state_dir() / TRUST_NAME
        if not path.exists():
            return cls(path)
        try:
            d = json.loads(_read_bounded(path, TRUST_MAX_BYTES))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(str(path), None, "trust state", str(path), f"unreadable ({e}); fix or remove it")
        if not isinstance(d, dict) or not isinstance(d.get("keys", {}), dict) \
                or not isinstance(d.get("serials", {}), dict):
            raise InputError(str(path), None, "trust state", str(path), "not an envbuild trust file; fix or remove it")
        return cls(path, d.get("keys", {}), d.get("serials", {}))

    def pinned(self, location: str) -> dict | None:
        k = self.keys.get(location)
        return k if isinstance(k, dict) else None

    def last_serial(self, keyid: str) -> int | None:
        s = self.serials.get(keyid)
        return s.get("serial") if isinstance(s, dict) and isinstance(s.get("serial"), int) else None

    def pin(self, location: str, key: dict) -> None:
        """Pin a key (and its table id) for a location; a table id is added to an existing pin of
        the same key, never replaced."""
        def up(d):
            cur = d["keys"].get(location)
            if not isinstance(cur, dict):
                d["keys"][location] = {**key, "first_seen": _now()}
            elif cur.get("keyid") == key.get("keyid") and not cur.get("table_id") and key.get("table_id"):
                cur["table_id"] = key["table_id"]
        self._update(up)

    def saw(self, keyid: str, serial: int, source: str) -> None:
        """Remember the highest serial seen for a key (another process may have raised it meanwhile)."""
        def up(d):
            cur = d["serials"].get(keyid)
            if not (isinstance(cur, dict) and isinstance(cur.get("serial"), int) and cur["serial"] >= serial):
                d["serials"][keyid] = {"serial": serial, "source": source, "seen": _now()}
        self._update(up)

    def _update(self, change) -> None:
        """Read, change and write trust.json under an exclusive lock: concurrent readers (40 first
        uses at once) each see the others' pins."""
        from .fsutil import write_json_atomic  # here: reading trust state must not import tempfile

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.parent / (TRUST_NAME + ".lock"), "a")
        except OSError as e:
            raise InfraError("state-unwritable", f"trust state {self.path}: cannot write ({e.strerror or e}); "
                             "set ENVBUILD_STATE to a writable folder") from None
        with lock:
            from .fsutil import wait_lock

            wait_lock(lock, self.path.parent / (TRUST_NAME + ".lock"), f"the trust state {self.path}", 60.0)
            fresh = TrustStore.load() if self.path.exists() else TrustStore(self.path)
            d = {"schema": 1, "keys": fresh.keys, "serials": fresh.serials}
            change(d)
            try:
                write_json_atomic(self.path, d)
            except OSError as e:
                raise InfraError("state-unwritable", f"trust state {self.path}: cannot write ({e.strerror or e})") from None
        self.keys, self.serials = d["keys"], d["serials"]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
