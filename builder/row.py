"""The compatibility table's typed rows: one model, one (de)serialiser, a schema version.

compat.json (the signed payload) is `Table.to_dict()` written by table.table_bytes; every reader
(verify, pick, diff, doctor, the page) goes through `Table.from_dict`. Keys only ever get added:
schema 1 tables (no serial, expires, files) still read, and a row's JSON keeps the keys the
page and older readers use. Deliberately light (stdlib only): `pick` imports it at start-up.

Schema history:
  1  rows, counts, generated, keyid
  2  + serial (monotonic per signing key), expires (UTC), files ({name: sha256} of every other
     file published with the table: compat.md, index.html, attestations/*)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import InputError
from .values import parse_pinned  # noqa: F401 - readers of the table find it with the rows
from .probe.vocab import LEVELS

TABLE_PAYLOAD_TYPE = "application/vnd.envbuild.compat-table+json"  # the DSSE payload type of compat.json
SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
VERIFIED, BROKEN, UNTESTED, UNPINNED = "verified", "broken", "untested", "unpinned"
STATUSES = (VERIFIED, BROKEN, UNTESTED, UNPINNED)


def attestation_path(row_id: str) -> str:
    """Where a row's attestation lives, relative to the table folder (publish and verify)."""
    from .fsutil import safe_name

    return f"attestations/{safe_name(row_id, 'row id')}.dsse.json"


_UTC = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z")


def parse_utc(s: str) -> int:
    """'YYYY-MM-DDTHH:MM:SSZ' -> epoch seconds (ValueError otherwise).

    By hand (days from civil, H. Hinnant): calendar/datetime/_strptime cost pick ~15 ms to import.
    """
    m = _UTC.fullmatch(s) if isinstance(s, str) else None
    if not m:
        raise ValueError(f"not a UTC time: {s!r}")
    y, mo, d, h, mi, sec = map(int, m.groups())
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and sec < 61):
        raise ValueError(f"not a UTC time: {s!r}")
    y -= mo <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (mo + (-3 if mo > 2 else 9)) + 2) // 5 + d - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    return days * 86400 + h * 3600 + mi * 60 + sec


def _dict(v: object) -> dict:
    return v if v.__class__ is dict else {}


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def _strs(d: dict, keys: tuple) -> list:
    """d's values at keys as str or None, in one pass (pick types 1,000 rows at start-up)."""
    return [v if v is None or v.__class__ is str else str(v) for v in map(d.get, keys)]


@dataclass
class Entry:
    """One level's state (env/contract/gpu), or the build's: the verdict and where it came from."""

    status: str = "not-run"
    cause: str | None = None
    detail: str = ""
    run_id: str | None = None
    created: str | None = None
    gpu: str | None = None  # gpu level: the GPU it ran on
    stage: str | None = None  # build entry of a failed/errored record: the stage that stopped

    def to_dict(self) -> dict:
        d = {"status": self.status, "cause": self.cause, "detail": self.detail,
             "run_id": self.run_id, "created": self.created}
        if self.gpu is not None:
            d["gpu"] = self.gpu
        if self.stage is not None:
            d["stage"] = self.stage
        return d

    _KEYS = ("status", "cause", "detail", "run_id", "created", "gpu", "stage")

    @classmethod
    def from_dict(cls, d: object) -> "Entry":
        if d.__class__ is not dict:
            return cls()
        e = cls(*_strs(d, cls._KEYS))
        if not e.status:
            e.status = "not-run"
        if e.detail is None:
            e.detail = ""
        return e


@dataclass
class Image:
    ref: str | None = None
    digest: str | None = None  # "sha256:<hex>" when pushed
    pinned: str | None = None  # "repo@sha256:<hex>": what `pick` prints
    size: int | None = None

    def to_dict(self) -> dict:
        return {"ref": self.ref, "digest": self.digest, "pinned": self.pinned, "size": self.size}

    @classmethod
    def from_dict(cls, d: object) -> "Image | None":
        if d.__class__ is not dict:
            return None
        size = d.get("size")
        return cls(*_strs(d, ("ref", "digest", "pinned")), size if size.__class__ is int else None)


@dataclass
class Failure:
    level: str  # env | contract | gpu | build
    cause: str | None
    detail: str = ""

    def to_dict(self) -> dict:
        return {"level": self.level, "cause": self.cause, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: object) -> "Failure | None":
        if not isinstance(d, dict):
            return None
        return cls(str(d.get("level")), _opt_str(d.get("cause")), str(d.get("detail") or ""))


@dataclass
class Combo:
    """The combination's versions as recorded; fields this envbuild does not know are kept."""

    verl: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    tag: str | None = None
    platform: str | None = None  # None: a row made before the platform axis (linux/amd64)
    extra: dict = field(default_factory=dict)

    _NAMED = ("verl", "engine", "engine_version", "torch", "cuda", "python", "tag", "platform")

    def get(self, name: str) -> str | None:
        return getattr(self, name) if name in self._NAMED else self.extra.get(name)

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.update({k: getattr(self, k) for k in self._NAMED if getattr(self, k) is not None})
        return d

    @classmethod
    def from_dict(cls, d: object) -> "Combo":
        if d.__class__ is not dict:
            return cls()
        return cls(*_strs(d, cls._NAMED), {k: v for k, v in d.items() if k not in _COMBO_KNOWN})


_COMBO_KNOWN = frozenset(Combo._NAMED) | {"id"}


@dataclass
class HistoryEntry:
    run_id: str | None
    created: str | None
    stage: str | None
    status: str | None
    cause: str | None = None
    image: str | None = None
    levels: dict = field(default_factory=dict)  # {level: status}
    gpu: object = None

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "created": self.created, "stage": self.stage, "status": self.status,
                "cause": self.cause, "image": self.image, "levels": dict(self.levels), "gpu": self.gpu}

    _KEYS = ("run_id", "created", "stage", "status", "cause", "image")

    @classmethod
    def from_dict(cls, d: object) -> "HistoryEntry":
        d = d if d.__class__ is dict else {}
        lv = d.get("levels")
        return cls(*_strs(d, cls._KEYS), lv if lv.__class__ is dict else {}, d.get("gpu"))


@dataclass
class Row:
    id: str
    combo: Combo
    image: Image | None
    build: Entry
    levels: dict[str, Entry]  # every level in LEVELS
    best_level: str | None
    status: str  # verified | broken | untested | unpinned
    failure: Failure | None = None
    lock_hash: str | None = None
    base: dict | None = None
    history: list[HistoryEntry] = field(default_factory=list)  # newest first
    # Read from the image by the probe (newest verdict of the row's image): package versions
    # (transformers, flash-attn, ray, NCCL, cuDNN, glibc, ...) and what the host must provide:
    # gpu_arch {supports: [sm_XY], lacking: {sm_XY: [package]}}, min_shm_bytes, min_driver.
    versions: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)
    # What a reader must know about how the row was made: planned outside the matrix, a package
    # taken from after the era (no earlier release on the index), packages built from source.
    notes: list[str] = field(default_factory=list)
    # The row's lock judged on a node without Docker (envbuild venv + probe --here): {"status",
    # "best_level", "levels": {level: entry}, "host": {host, gpu, driver, ...}, "reused": [...],
    # "failure"?, "refused"?}; {} when never. About the stack, not an image digest (fold._in_place).
    in_place: dict = field(default_factory=dict)
    # The newest census (envbuild census: the lock and the static contracts from the wheels, no
    # image): {"status": pass|broken|error, "cause", "detail", "run_id", "created", "reused"}; {}
    # when never. A level below env: it condemns a row, it never verifies one (fold._census).
    census: dict = field(default_factory=dict)
    # Failures only some runs reach (fold._scopes): {scope: {"label", "from", "where", "checks",
    # "detail"}}, scope a feature name, `model:T[,U]` or `guard:G`. They leave `status` alone: a
    # reader whose run enters a scope reads the row as broken for that run (query.Ask.scopes).
    scopes: dict = field(default_factory=dict)

    def level(self, name: str) -> Entry:
        return self.levels.get(name) or Entry()

    @property
    def pinned(self) -> str | None:
        return self.image.pinned if self.image else None

    def newest(self) -> str:
        return max((e.created or "" for e in self.levels.values()), default="")

    def to_dict(self) -> dict:
        return {"id": self.id, "combo": self.combo.to_dict(), "image": self.image.to_dict() if self.image else None,
                "build": self.build.to_dict(), "levels": {k: v.to_dict() for k, v in self.levels.items()},
                "best_level": self.best_level, "status": self.status,
                "failure": self.failure.to_dict() if self.failure else None,
                "lock_hash": self.lock_hash, "base": self.base, "history": [h.to_dict() for h in self.history],
                "versions": self.versions, "hardware": self.hardware, "notes": self.notes, "in_place": self.in_place,
                "census": self.census, "scopes": self.scopes}

    @classmethod
    def from_dict(cls, d: object, where: str = "table", i: int = 0) -> "Row":
        if d.__class__ is not dict or d.get("id").__class__ is not str or not d["id"]:
            raise InputError(where, None, f"rows[{i}].id", d.get("id") if isinstance(d, dict) else d,
                             "every row needs a string id")
        get = d.get
        lv = get("levels")
        if lv.__class__ is not dict:
            lv = {}
        best, hist, base = get("best_level"), get("history"), get("base")
        return cls(
            d["id"], Combo.from_dict(get("combo")), Image.from_dict(get("image")), Entry.from_dict(get("build")),
            {k: Entry.from_dict(lv.get(k)) for k in LEVELS}, best if best in LEVELS else None,
            str(get("status")), Failure.from_dict(get("failure")), _opt_str(get("lock_hash")),
            base if base.__class__ is dict else None,
            [HistoryEntry.from_dict(h) for h in hist] if hist.__class__ is list else [],
            _dict(get("versions")), _dict(get("hardware")),
            [str(n) for n in get("notes")] if get("notes").__class__ is list else [], _dict(get("in_place")),
            _dict(get("census")), {str(k): _dict(v) for k, v in _dict(get("scopes")).items()})


class LazyRows(Sequence):
    """A read table's rows, typed on first access: `pick` reads every row's combination but the
    rest of only the few it matches (typing all 1,000 rows would cost most of its 200 ms budget).
    A malformed row still raises InputError, when it is reached."""

    def __init__(self, raw: list, where: str):
        self._raw, self._where = raw, where
        self._rows: list[Row | None] = [None] * len(raw)
        self._combos: list[Combo | None] = [None] * len(raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __eq__(self, other) -> bool:  # equal to the same rows, lazy or a plain list
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = self._rows[i]
        if row is None:
            row = self._rows[i] = Row.from_dict(self._raw[i], self._where, i)
        return row

    def combo(self, i: int) -> Combo:
        if self._rows[i] is not None:
            return self._rows[i].combo
        c = self._combos[i]
        if c is None:
            d = self._raw[i]
            c = self._combos[i] = Combo.from_dict(d.get("combo") if d.__class__ is dict else None)
        return c

    def where(self, pred) -> list[Row]:
        """The rows whose combination satisfies pred(Combo), typing only those."""
        return [self[i] for i in range(len(self._raw)) if pred(self.combo(i))]


# The records a table folds, packed beside it and listed (signed) in its payload.
RECORDS_ARCHIVE = "results.tar.gz"
TABLE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


def series_id(keyid: str, name: str) -> str:
    """The table id of the series `name` signed by `keyid`: the same on every machine that
    publishes it, so serials count across nights and runners (readers keep the newest per id)."""
    return hashlib.sha256(f"envbuild-table\n{keyid}\n{name}".encode()).hexdigest()[:32]


@dataclass
class Table:
    rows: list[Row]  # a LazyRows when read from JSON
    generated: str | None = None
    keyid: str | None = None
    serial: int | None = None  # None: a schema-1 table (published before serials)
    expires: str | None = None  # "YYYY-MM-DDTHH:MM:SSZ"
    files: dict[str, str] = field(default_factory=dict)  # {relative path: sha256 hex}
    schema: int = SCHEMA
    # Which table this is (signed): a reader that pinned a location refuses another table there,
    # and serials are remembered per table, not per key. With a name, the id is series_id(keyid,
    # name): every night of the nightly, from whichever fresh runner, is the same table.
    table_id: str | None = None
    name: str | None = None  # the table's series name (publish --name; the matrix's repository)

    def where(self, pred) -> list[Row]:
        """Rows whose combination satisfies pred(Combo)."""
        if isinstance(self.rows, LazyRows):
            return self.rows.where(pred)
        return [r for r in self.rows if pred(r.combo)]

    def combos(self):
        """Every row's combination (without typing the rest of a lazily read row)."""
        if isinstance(self.rows, LazyRows):
            return (self.rows.combo(i) for i in range(len(self.rows)))
        return (r.combo for r in self.rows)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.rows if r.status == s) for s in STATUSES}

    def to_dict(self) -> dict:
        d = {"schema": self.schema, "generated": self.generated, "keyid": self.keyid, "counts": self.counts,
             "rows": [r.to_dict() for r in self.rows]}
        if self.schema >= 2:
            d.update(serial=self.serial, expires=self.expires, files=dict(self.files))
            if self.table_id:
                d["table_id"] = self.table_id
            if self.name:
                d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: object, where: str = "table") -> "Table":
        if not isinstance(d, dict) or not isinstance(d.get("rows"), list):
            raise InputError(where, None, "rows", None, "not an envbuild table")
        schema = d.get("schema")
        if schema not in READABLE_SCHEMAS:
            raise InputError(where, None, "schema", schema,
                             f"this envbuild reads schemas {', '.join(map(str, READABLE_SCHEMAS))}; "
                             "upgrade envbuild")
        serial = d.get("serial")
        if serial is not None and (not isinstance(serial, int) or isinstance(serial, bool) or serial < 0):
            raise InputError(where, None, "serial", serial, "expected a non-negative integer")
        files = d.get("files") or {}
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise InputError(where, None, "files", "…", "expected {name: sha256}")
        return cls(rows=LazyRows(d["rows"], where),
                   generated=_opt_str(d.get("generated")), keyid=_opt_str(d.get("keyid")), serial=serial,
                   expires=_opt_str(d.get("expires")), files=files, schema=schema,
                   table_id=_opt_str(d.get("table_id")), name=_opt_str(d.get("name")))
