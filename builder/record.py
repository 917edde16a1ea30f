"""Result records: one immutable JSON file per combination per run.

Layout: RESULTS/records/<combo id>/<run id>.json. A record is written once, atomically, and
never rewritten, so a failed or interrupted run can never erase an earlier verdict. The table
(`envbuild publish`) folds all records; the newest record per combination and level wins.

Record fields (schema 1; envbuild.outcome says what the statuses mean):
  schema        1
  run_id        sortable, unique: "<UTC yyyymmddThhmmss>-<6 hex>"
  created       ISO-8601 UTC
  combo         the planned combination as a dict (values.Combo.to_dict: id, tag, verl, engine,
                engine_version, torch, cuda, python, platform, ...); never what the build observed
  stage         furthest stage reached: "lock" | "render" | "build" | "push" | "probe" (outcome.STAGES)
  status        "ok" | "fail" (a verdict: the stack is broken) | "error" (infrastructure)
  cause         classified cause when not ok, e.g. "unsatisfiable", "index-unreachable",
                "download-failure", "compile-failure", "missing-wheel", "timeout", "daemon-error"
  detail        one paragraph: the explanation or the last lines of the failing output
  base          {"kind": "nvidia"|"bootstrap"|"image", "ref", "digest"?}: what the image was built FROM
  image         {"ref", "tags", "content_hash", "id", "digest" ("repo@sha256:..." after push), "size", "reused",
                "push" (envbuild.push.PushReport: codec, tool, seconds, bytes read and sent, blobs)}
  lock_hash     sha256 of the combination's full lock
  probe         {level: Verdict} (probe.verdict) for levels "env"|"contract"|"gpu" (typed on read; written as
                the probe's JSON)
  timings       {stage: seconds}, plus base_wait and push_probe_wall (envbuild.build)
  machine       where it ran: {"hostname", "platform"} (record.machine_info), plus "gpu" for a probe on one
  log           build log path relative to RESULTS, if any
  lock_notes    what the lock had to do that a reader must know: {"relaxed": ["X taken from <date>: ..."],
                "built_from_source": ["name==version"]} (absent keys: nothing to say)
  place         None for an image's record; {"kind": "in-place", ...} for a probe of the row's lock
                materialized on a node without Docker (envbuild venv + probe --here): the host, its
                GPU, driver, glibc and CUDA runtime, and the node's distributions it reused
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from .fsutil import safe_name, write_json_atomic
from .outcome import RECORD_STATUSES, STAGES, Verdict

SCHEMA = 1
MAX_RECORD_BYTES = 16 << 20  # a record is a few kB to a few hundred kB (probe verdicts included)


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


@dataclass
class Record:
    combo: dict
    stage: str
    status: str
    cause: str | None = None
    detail: str = ""
    base: dict | None = None
    image: dict | None = None
    lock_hash: str | None = None
    probe: dict[str, Verdict] = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    log: str | None = None
    lock_notes: dict = field(default_factory=dict)
    place: dict | None = None
    run_id: str = field(default_factory=new_run_id)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    schema: int = SCHEMA

    def __post_init__(self):
        # Typed whatever the source: a verdict dict (the probe's JSON) becomes a Verdict (Verdict.of).
        self.probe = {str(k): Verdict.of(v, k) for k, v in (self.probe or {}).items()}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["probe"] = {k: v.to_dict() for k, v in self.probe.items()}
        return d

    @classmethod
    def from_dict(cls, d: object) -> "Record":
        """A record from its JSON (any schema so far: unknown keys are ignored). ValueError when
        it is not one: the fields every reader relies on must have their types."""
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        combo = known.get("combo")
        if not isinstance(combo, dict) or not isinstance(combo.get("id"), str) or not combo["id"]:
            raise ValueError("combo.id missing")
        for k, typ in (("stage", str), ("status", str), ("run_id", str), ("created", str), ("detail", str)):
            if k in known and not isinstance(known[k], typ):
                raise ValueError(f"{k} is not a {typ.__name__}")
        if known.get("status") not in RECORD_STATUSES:
            raise ValueError(f"status {known.get('status')!r} is not one of {', '.join(RECORD_STATUSES)}")
        if known.get("stage", "lock") not in STAGES:
            raise ValueError(f"stage {known.get('stage')!r} is not one of {', '.join(STAGES)}")
        for k in ("cause", "lock_hash", "log"):
            if known.get(k) is not None and not isinstance(known[k], str):
                raise ValueError(f"{k} is not a string")
        for k in ("probe", "timings", "machine", "lock_notes"):
            if k in known and not isinstance(known[k], dict):  # exactly an object: "" or 0 is not one
                raise ValueError(f"{k} is not an object")
        for k in ("image", "base", "place"):
            if known.get(k) is not None and not isinstance(known[k], dict):
                raise ValueError(f"{k} is not an object")
        img = known.get("image") or {}
        for k in ("id", "ref", "digest", "content_hash"):
            if img.get(k) is not None and not isinstance(img[k], str):
                raise ValueError(f"image.{k} is not a string")
        return cls(**known)


IN_PLACE = "in-place"  # place.kind of a record made on a node, not in an image
CENSUS = "census"  # place.kind of a record judged from the lock and wheels alone (envbuild census)


def is_in_place(rec: "Record") -> bool:
    return isinstance(rec.place, dict) and rec.place.get("kind") == IN_PLACE


def is_census(rec: "Record") -> bool:
    return isinstance(rec.place, dict) and rec.place.get("kind") == CENSUS


def is_placed(rec: "Record") -> bool:
    """Made without an image (in place, or the census): folded apart from image verdicts."""
    return is_in_place(rec) or is_census(rec)


def machine_info() -> dict:
    return {"hostname": platform.node(), "platform": platform.platform()}


def records_dir(results: str | os.PathLike) -> Path:
    return Path(results) / "records"


def write_record(results: str | os.PathLike, rec: Record) -> Path:
    # Names from data never become paths unchecked: an id like ../../x is refused (exit 2).
    cid = safe_name(rec.combo.get("id"), "combo.id", "record")
    path = records_dir(results) / cid / f"{safe_name(rec.run_id, 'run_id', 'record')}.json"
    if path.exists():  # immutable: never rewrite a record
        raise FileExistsError(path)
    if not rec.machine:
        rec.machine = machine_info()
    return write_json_atomic(path, rec.to_dict())


def iter_records(results: str | os.PathLike, only: set[str] | None = None) -> Iterator[Record]:
    """The records under RESULTS; with `only`, those whose path relative to RESULTS it names
    (the ones their jobs' signatures cover: envbuild.recordsig)."""
    root = records_dir(results)
    if not root.is_dir():
        return
    for p in sorted(root.glob("*/*.json")):
        if only is not None and str(p.relative_to(results)) not in only:
            continue
        try:
            if not p.is_file() or p.stat().st_size > MAX_RECORD_BYTES:
                continue
            rec = Record.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except (ValueError, TypeError, OSError, RecursionError):
            continue  # a foreign, truncated or hostile file is not a record (UnicodeDecodeError is a ValueError)
        yield rec


def latest(records, *, with_image: bool = False) -> dict[str, Record]:
    """The one rule for "the latest record per combination": the highest run id (sortable by
    time), optionally among the records that name an image (what a re-probe needs)."""
    out: dict[str, Record] = {}
    for r in records:
        img = r.image or {}
        if with_image and not (img.get("digest") or img.get("ref")):
            continue
        cid = r.combo.get("id")
        cur = out.get(cid)
        if cur is None or r.run_id > cur.run_id:
            out[cid] = r
    return out


def latest_by_combo(results: str | os.PathLike) -> dict[str, Record]:
    return latest(iter_records(results))
