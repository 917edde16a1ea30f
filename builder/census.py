"""`envbuild census [selectors]`: every combination judged without building an image.

For each combination: its lock (cached like `lock`'s), then the static contracts of verl's modules
of its engine (the import contract and the call-signature contract, builder/probe/staticimports.py
and staticcalls.py) read against the engine's and transformers' own source, from the very wheels
the lock pins (chosen by the lock's hashes, unpacked once per wheel hash: only the Python files and
the metadata). torch is not unpacked (hundreds of MB of a wheel for a few names): imports of torch
are left to the image's contract level. The result is a record with `place.kind = "census"`;
publish folds it beside the row's image verdicts as the census, a level below `env` that never
verifies anything: a failing census (the lock is unsatisfiable, or verl imports or calls what the
engine does not have) makes the row broken, a passing one leaves it untested.

A census of an unchanged lock and unchanged wheels with the same probe code is reused from the
cache: a warm census of the whole matrix is the locks' cache plus a table lookup per combination.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from .errors import EnvbuildError, InfraError
from .fsutil import write_json_atomic
from .progress import Progress
from .index import Metadata
from .lock import Locker
from .lockmodel import ordered_wheel_tags
from .lockfile import pins_of
from .matrix import matrix_from_args
from .expand import plan_from_args
from .outcome import OK, RECORD_ERROR, RECORD_FAIL, Verdict, exit_of_records, lock_record_status
from .paths import cache_dir
from .probe.hardware import parse_variant
from .probe.vocab import ENGINE, FAIL, dist_of
from .probe_exec import probe_code_hash
from .record import CENSUS, Record, machine_info, write_record
from .selector import add_selector_args
from .wheelhouse import _priority, choose_file, download

MEMBERS = (".py", "METADATA", "top_level.txt", "RECORD")  # what the static contracts read of a wheel


def wheels_for(c) -> list[str]:
    """The distributions whose source the census reads: verl, the engine, transformers."""
    names = ["verl", "transformers"]
    if ENGINE[c.engine].versioned:
        names.insert(1, dist_of(c.engine))
    return names


def unpacked(f: dict, cache: Path) -> Path:
    """The Python files and metadata of one wheel, unpacked once per sha256."""
    sha = f["hashes"]["sha256"]
    d = cache / "sites" / sha
    if (d / ".done").exists():
        return d
    whl = cache / "wheels" / f["filename"]
    download(f, whl)
    tmp = d.with_name(d.name + f".{os.getpid()}.tmp")
    with zipfile.ZipFile(whl) as z:
        for m in z.infolist():
            name = m.filename
            if name.endswith(MEMBERS) and ".." not in Path(name).parts and not name.startswith("/"):
                z.extract(m, tmp)
    (tmp / ".done").write_text(f["filename"] + "\n")
    try:
        os.replace(tmp, d)
    except OSError:  # another process unpacked it meanwhile
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    whl.unlink(missing_ok=True)  # the unpacked sources are what is kept
    return d


def judge(engine: str, sites: list[str], accelerator: str | None = None) -> dict:
    """The static contracts of one combination, as a contract-level verdict (a child process:
    the reading is pure Python, so combinations run in parallel only in processes). `accelerator`:
    the kind of the row's torch build, which the census does not unpack."""
    from .probe.contract import _static_checks
    from .probe.staticreport import static_report
    from .probe.verdict import NOT_APPLICABLE, Verdict

    t0 = time.perf_counter()
    rep = static_report(engine, sites, accelerator)
    v = Verdict(level="contract", engine=engine)
    for mod, o in sorted(rep["owners"].items()):
        if not o["judged"]:
            v.add(f"static:{mod}", NOT_APPLICABLE, o["detail"], o["cause"])
    _static_checks(v, rep)
    v.timings["census_static"] = round(time.perf_counter() - t0, 3)
    return v.to_dict()


class Census:
    def __init__(self, m, meta: Metadata, jobs: int):
        self.m, self.meta, self.jobs = m, meta, jobs
        self.locker = Locker(m, meta)
        self.cache = cache_dir() / "census"
        self.pool = ProcessPoolExecutor(max(1, jobs)) if jobs > 1 else None

    def one(self, c) -> Record:
        t0 = time.monotonic()
        rec = Record(combo=c.to_dict(), stage="lock", status=OK, machine=machine_info(),
                     place={"kind": CENSUS})
        res = self.locker.lock(c)
        rec.lock_hash = res.lock_hash
        rec.lock_notes = {"relaxed": res.relaxed} if res.relaxed else {}
        if not res.ok:
            rec.status, rec.cause, rec.detail = lock_record_status(res.status), res.status, res.detail[-3000:]
            rec.timings = {"lock": round(time.monotonic() - t0, 3)}
            return rec
        pins = pins_of(res.full_lock)
        prio = _priority(ordered_wheel_tags(c.python, c.glibc, c.platform))
        try:
            files = []
            for name in wheels_for(c):
                version, hashes = pins[name]
                f = choose_file(self.meta.files(name), version, hashes, prio)
                if f is None or not f["filename"].endswith(".whl"):
                    raise InfraError("missing-wheel", f"{name}=={version}: no wheel the lock's hashes allow")
                files.append(f)
        except (InfraError, KeyError) as e:
            rec.status, rec.cause = RECORD_ERROR, getattr(e, "cause", "missing-pin")
            rec.detail = str(e)
            return rec
        variant = parse_variant(c.cuda)
        kind = variant.kind if variant else None
        key = hashlib.sha256(json.dumps([c.engine, [f["hashes"]["sha256"] for f in files], probe_code_hash(), kind])
                             .encode()).hexdigest()
        hit = self.cache / "verdicts" / f"{key}.json"
        t1 = time.monotonic()
        if hit.exists():
            verdict, reused = json.loads(hit.read_text()), True
        else:
            sites = [str(unpacked(f, self.cache)) for f in files]
            verdict = (self.pool.submit(judge, c.engine, sites, kind).result() if self.pool
                       else judge(c.engine, sites, kind))
            write_json_atomic(hit, verdict)
            reused = False
        rec.stage = "probe"
        rec.probe = {"contract": Verdict.of(verdict, "contract")}
        rec.place = {"kind": CENSUS, "wheels": {f["filename"]: f["hashes"]["sha256"] for f in files},
                     "reused": reused, "read": "verl, the engine and transformers from their wheels; torch not read"}
        # Only a core failure condemns the row; one that only opted-in runs reach is a caveat (scope).
        failing = [ch for ch in rec.probe["contract"].checks if ch.status == FAIL and ch.problem]
        rec.status = RECORD_FAIL if failing else OK
        if failing:
            rec.cause, rec.detail = failing[0].cause or "static", failing[0].detail[:2000]
        rec.timings = {"lock": round(t1 - t0, 3), "static": round(time.monotonic() - t1, 3)}
        return rec

    def close(self):
        if self.pool:
            self.pool.shutdown()


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("--results", default="results", help="results directory (default: results)")
    p.add_argument("-j", "--jobs", type=int, default=min(4, os.cpu_count() or 1),
                   help="combinations at once (default: min(4, CPUs))")
    p.add_argument("--json", action="store_true", help="one JSON object per combination")


def _first_finding(rec) -> str:
    """What a failing census found, with its file:line (the check's detail leads with it), or the
    resolver's first line; "" for a pass."""
    if rec.status != RECORD_FAIL:
        return ""
    for v in rec.probe.values():
        if v.failing and v.first_detail():
            return " ".join(v.first_detail().split())[:300]
    lines = (rec.detail or "").strip().splitlines()
    return " ".join(lines[0].split())[:300] if lines else ""


def run(args) -> int:
    if args.jobs < 1:
        raise EnvbuildError("--jobs must be at least 1")
    m = matrix_from_args(args)
    meta = Metadata()
    pl = plan_from_args(args, meta)
    cen = Census(m, meta, args.jobs)
    t0 = time.monotonic()
    statuses = []
    pool = ThreadPoolExecutor(max(1, args.jobs))
    interrupted = False
    try:
        with Progress("census", len(pl.combos), "combinations") as beat:
            def one(c):  # counted as running while it runs, so a beat says which and for how long
                beat.start(c.id)
                return cen.one(c)

            for i, rec in enumerate(pool.map(one, pl.combos), 1):
                beat.finish(rec.combo["id"], f"{rec.combo['id']}: {rec.status}")
                write_record(args.results, rec)
                statuses.append(rec.status)
                where = _first_finding(rec)
                if args.json:
                    print(json.dumps({"id": rec.combo["id"], "status": rec.status, "cause": rec.cause,
                                      "finding": where, "reused": (rec.place or {}).get("reused"),
                                      "timings": rec.timings}), flush=True)
                else:
                    why = f" ({rec.cause})" if rec.cause else ""
                    print(f"[{i}/{len(pl.combos)}] {rec.combo['id']}: {rec.status}{why}", flush=True)
                    if where:
                        print(f"    {where}", flush=True)
    except KeyboardInterrupt:
        interrupted = True  # what is not started is cancelled; what runs is not waited for
        raise
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
        cen.close()
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    print(f"census: {len(statuses)} combinations in {time.monotonic() - t0:.1f} s: "
          + ", ".join(f"{n} {s}" for s, n in counts.items()), file=sys.stderr)
    return exit_of_records(statuses)
