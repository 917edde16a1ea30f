"""Fold result records into the signed compatibility table (`envbuild publish`).

What counts as verified, strictly (a table that says "works" for a broken stack is the worst
bug this project can have):
  - verdicts are per image: a level's verdict counts only for the image it was measured on;
  - a level's state is its newest *decisive* verdict (pass, fail, timeout). "error" is the
    infrastructure failing and "needs-gpu" means the level could not be decided here: both are
    kept in history but never replace an earlier verdict, and never make a row broken;
  - a row is "verified" only if its image has a registry digest, its env level passed, and no
    level of that image failed; `best_level` is the highest level such that it and every lower
    level passed.
The row's image is the one with the newest decisive probe verdict (so a rebuild whose probe
errored leaves the earlier, probed image in place, and a rebuild that failed replaces it).

Output (--out is a symlink to the current set, see "publish" below): compat.json, compat.json.dsse
(DSSE envelope whose payload is exactly compat.json's bytes), compat.md, index.html, pubkey.json,
attestations/<row id>.dsse.json (one signed in-toto Statement per image, test-result predicate,
subject = image digest; the file name passes fsutil.safe_name). The signed payload (row.Table,
schema 2) carries a serial (higher than the table it replaces), an expiry (--expires-days) and
the sha256 of every other file, so `verify` covers them all.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from . import drivers, page
from .errors import InputError
from .fsutil import safe_name, write_atomic
from .row import (SCHEMA, TABLE_PAYLOAD_TYPE, Combo, Entry, Failure, HistoryEntry, Image, Row, Table,  # noqa: F401 (re-exported)
                  parse_pinned, parse_utc)
from .vocab import CAVEATS, LEVELS
from .sign import IN_TOTO_PAYLOAD_TYPE, TEST_RESULT_PREDICATE, load_signer, public_key_of, sign_envelope, sign_statement, statement
from .record import iter_records

DECISIVE = {"pass", "fail", "timeout"}  # probe statuses that are a verdict on the stack
DEFAULT_RESULTS = "results"
DEFAULT_OUT = "table"
DEFAULT_KEY = os.path.join("keys", "envbuild.key")
DEFAULT_EXPIRES_DAYS = 30
SITE_FILES = ("compat.json", "compat.json.dsse", "compat.md", "index.html", "pubkey.json", "attestations")
KEEP_SITES = 2  # the current site and the one before: a reader that resolved the old one can finish

_DETAIL_MAX = 600
# Check statuses that do not explain a non-passing verdict (see envbuild.probe.verdict).
_NOT_A_PROBLEM = (None, "pass", "ok", "skipped", "not-applicable", *CAVEATS)  # caveats go on the row


def _short(text: object, n: int = _DETAIL_MAX) -> str:
    s = str(text or "").strip()
    return s if len(s) <= n else "…" + s[-(n - 1):]  # the tail of a log says the most


def _verdict_cause(v: dict) -> str | None:
    """The probe's overall cause, else the cause of its first non-passing check."""
    if v.get("cause"):
        return v["cause"]
    checks = v.get("checks")
    items = checks.values() if isinstance(checks, dict) else checks if isinstance(checks, list) else []
    for c in items:
        if isinstance(c, dict) and c.get("status") not in _NOT_A_PROBLEM:
            return c.get("cause") or c.get("name") or c.get("status")
    return None


def _verdict_detail(v: dict) -> str:
    if v.get("detail"):
        return _short(v["detail"])
    checks = v.get("checks")
    items = checks.items() if isinstance(checks, dict) else enumerate(checks) if isinstance(checks, list) else []
    for name, c in items:
        if isinstance(c, dict) and c.get("status") not in _NOT_A_PROBLEM:
            label = c.get("name", name)
            return _short(f"{label}: {c.get('detail', '')}")
    return ""


# Which probe level a check belongs to, by its name (envbuild.probe: a verdict at level L holds
# the checks of every level up to L). A check may also carry its own "level".
_ENV_CHECKS = {"python", "import-torch", "torch-version", "torch-cuda", "cxx11-abi", "engine-version",
               "verl-version", "cudnn", "nccl", "pip-check"}


def _check_level(c: dict) -> str | None:
    if c.get("level") in LEVELS:
        return c["level"]
    name = str(c.get("name", ""))
    if name.startswith("gpu:"):
        return "gpu"
    if name.startswith(("import:", "api:", "native")) or name == "verl-modules":
        return "contract"
    if name in _ENV_CHECKS:
        return "env"
    return None  # unknown (e.g. "probe" = the probe itself broke): counts against every level


def _worst(statuses) -> str:
    """The probe's precedence: error > fail > timeout > needs-gpu > pass."""
    for s in ("error", "fail", "timeout", "needs-gpu"):
        if s in statuses:
            return s
    return "pass"


def expand_verdict(key: str, v: object) -> dict[str, dict]:
    """{level: verdict-like dict} for one probe verdict, which covers every level up to its own.

    A passing verdict at level L passes every level up to L. A non-passing one is split by its
    checks: a lower level passes only if its own checks pass and no unattributable check failed;
    a level without any checks gets the overall status (no evidence is not a pass).
    """
    if not isinstance(v, dict):
        return {key: {}} if key in LEVELS else {}
    level = key if key in LEVELS else v.get("level")
    if level not in LEVELS:
        return {}
    upto = LEVELS[: LEVELS.index(level) + 1]
    status = v.get("status")
    if status == "pass":
        return {lv: v for lv in upto}
    checks = [c for c in (v.get("checks") or []) if isinstance(c, dict)] if isinstance(v.get("checks"), list) else []
    if not checks or status not in ("fail", "needs-gpu", "error", "timeout"):
        return {lv: v for lv in upto}
    loose = [c for c in checks if _check_level(c) is None and c.get("status") not in _NOT_A_PROBLEM]
    out = {}
    for lv in upto:
        mine = [c for c in checks if _check_level(c) == lv]
        bad = [c for c in mine + loose if c.get("status") not in _NOT_A_PROBLEM]
        if not mine and not loose:
            out[lv] = v if lv == level else {"status": status, "cause": v.get("cause"), "checks": []}
        elif bad:
            out[lv] = {"status": _worst([c.get("status") for c in bad]), "checks": bad}
        else:
            out[lv] = {"status": "pass", "checks": mine}
    if status == "timeout":
        out[level] = v  # killed at its time limit: the top level did not finish, whatever ran before
    return out


def _image_key(image: dict | None, id_to_digest: dict | None = None) -> str | None:
    """Identity of an image across records: registry digest, else local id, else content hash.

    A run that probed an already pushed image without pushing again records only its local id:
    `id_to_digest` (from the records that have both) maps it back to the same image.
    """
    if not image:
        return None
    pinned = parse_pinned(image.get("digest"))
    if pinned:
        return "sha256:" + pinned[1]
    if id_to_digest and image.get("id") in id_to_digest:
        return id_to_digest[image["id"]]
    return image.get("id") or image.get("content_hash") or None


def _level_entry(rec, level: str, v: dict) -> Entry:
    status = v.get("status") if isinstance(v, dict) else None
    if status not in ("pass", "fail", "timeout", "needs-gpu", "error"):
        status = "error"  # an unreadable verdict proves nothing either way
    e = Entry(status, _verdict_cause(v) if status != "pass" else None,
              _verdict_detail(v) if status != "pass" else "", rec.run_id, rec.created)
    if level == "gpu":
        g = (v.get("gpu") if isinstance(v, dict) else None) or rec.machine.get("gpu")
        if isinstance(g, dict):
            g = g.get("name") or g.get("device") or None
        if g:
            e.gpu = str(g)
    return e


def _row_status(levels: dict[str, Entry], build: Entry, pinned, has_image: bool) -> tuple[str, str | None]:
    """(status, best_level) - the rule in this module's docstring."""
    best = None
    for level in LEVELS:
        if levels[level].status != "pass":
            break
        best = level
    failed = any(levels[lv].status in ("fail", "timeout") for lv in LEVELS)
    if failed or (build.status == "fail" and not has_image):
        status = "broken"
    elif best and pinned:
        status = "verified"
    elif best:
        status = "unpinned"  # passed, but never pushed: nothing a user could pull by digest
    else:
        status = "untested"
    return status, best if status in ("verified", "unpinned", "broken") else None


def _failure(status: str, levels: dict[str, Entry], build: Entry) -> Failure | None:
    failed = [lv for lv in LEVELS if levels[lv].status in ("fail", "timeout")]
    if failed:
        e = levels[failed[0]]
        return Failure(failed[0], e.cause or e.status, e.detail)
    if status == "broken":
        return Failure("build", build.cause or "build-failed", build.detail)
    return None


def fold_combo(records: list) -> Row:
    """One table row from all records of one combination (any order)."""
    recs = sorted(records, key=lambda r: r.run_id)
    combo = dict(recs[-1].combo)
    cid = safe_name(combo.pop("id"), "combo.id", f"record {recs[-1].run_id}")

    # Per image: per level, the newest decisive entry and the newest undecided one.
    per_image: dict[str | None, dict] = {}
    images: dict[str | None, dict] = {}
    newest_decisive: dict[str | None, str] = {}
    build = Entry("not-run")
    last_build_any: Entry | None = None
    history = []
    id_to_digest = {r.image["id"]: _image_key(r.image) for r in recs
                    if r.image and r.image.get("id") and parse_pinned(r.image.get("digest"))}
    for r in recs:
        key = _image_key(r.image, id_to_digest)
        if key is not None and (parse_pinned(r.image.get("digest")) or key not in images):
            images[key] = r.image  # the newest record that names the image's digest describes it
        levels = per_image.setdefault(key, {})
        hist_levels = {}
        # Expand each verdict to the levels it covers; a verdict keyed at a level itself wins
        # over what a higher-level verdict of the same run implies about that level.
        expanded: dict[str, dict] = {}
        for pkey, v in sorted((r.probe or {}).items(), key=lambda kv: -LEVELS.index(kv[0]) if kv[0] in LEVELS else 1):
            expanded.update(expand_verdict(pkey, v))
        for level in LEVELS:
            if level not in expanded:
                continue
            v = expanded[level]
            e = _level_entry(r, level, v if isinstance(v, dict) else {})
            hist_levels[level] = e.status
            slot = levels.setdefault(level, {})
            if e.status in DECISIVE:
                slot["decisive"] = e
                newest_decisive[key] = r.run_id
            else:
                slot["undecided"] = e
        # Build outcome: an image means the build passed; a "fail" before the probe stage is
        # a verdict that the stack cannot be built; "error" is infrastructure, history only.
        if r.image and (r.image.get("id") or r.image.get("digest")):
            build = Entry("pass", None, "", r.run_id, r.created)
        elif r.status == "fail" and r.stage in ("lock", "render", "build"):
            build = Entry("fail", r.cause, _short(r.detail), r.run_id, r.created, stage=r.stage)
        elif r.status == "error":
            last_build_any = Entry("error", r.cause, _short(r.detail), r.run_id, r.created, stage=r.stage)
        history.append(HistoryEntry(r.run_id, r.created, r.stage, r.status, r.cause,
                                    (r.image or {}).get("digest") or (r.image or {}).get("ref"),
                                    hist_levels, r.machine.get("gpu")))
    if build.status == "not-run" and last_build_any:
        build = last_build_any  # only infrastructure errors so far: say so, as "error"

    # The row's image: newest decisive probe verdict wins; else the newest image built.
    if newest_decisive:
        row_key = max(newest_decisive, key=newest_decisive.get)
    else:
        row_key = next((_image_key(r.image, id_to_digest) for r in reversed(recs) if _image_key(r.image)), None)
    img = images.get(row_key) or {}
    pinned = parse_pinned(img.get("digest"))
    image = None
    if img:
        image = Image(img.get("ref"), f"sha256:{pinned[1]}" if pinned else None,
                      img.get("digest") if pinned else None, img.get("size"))

    versions, hardware = _read_from_image(recs, row_key, id_to_digest)
    hardware = {**hardware, "min_driver": drivers.min_driver(combo.get("cuda"))} if combo.get("cuda") else hardware
    levels = {}
    for level in LEVELS:
        slot = per_image.get(row_key, {}).get(level, {})
        levels[level] = slot.get("decisive") or slot.get("undecided") or Entry("not-run")
    status, best = _row_status(levels, build, pinned, image is not None)
    return Row(id=cid, combo=Combo.from_dict(combo), image=image, build=build, levels=levels,
               best_level=best, status=status, failure=_failure(status, levels, build),
               lock_hash=recs[-1].lock_hash, base=recs[-1].base, history=list(reversed(history)),
               versions=versions, hardware=hardware, notes=_notes(combo, recs[-1]))


def _notes(combo: dict, newest) -> list[str]:
    notes = [combo["note"]] if combo.get("note") else []
    ln = newest.lock_notes or {}
    notes += [str(x) for x in ln.get("relaxed") or []]
    if ln.get("built_from_source"):
        notes.append("built from source (build dependencies pinned by the lock): "
                     + ", ".join(map(str, ln["built_from_source"])))
    return notes


def _read_from_image(recs, row_key, id_to_digest) -> tuple[dict, dict]:
    """The newest versions and hardware facts the probe read from the row's image."""
    versions: dict = {}
    hardware: dict = {}
    caveats: list = []
    for r in recs:  # oldest first: newer verdicts overwrite
        if _image_key(r.image, id_to_digest) != row_key:
            continue
        for v in (r.probe or {}).values():
            if not isinstance(v, dict):
                continue
            if isinstance(v.get("versions"), dict) and v["versions"]:
                versions = {k: x for k, x in v["versions"].items() if isinstance(x, (str, int, float, bool)) or x is None}
            if isinstance(v.get("caveats"), list):
                caveats = [c for c in v["caveats"] if isinstance(c, dict)]
            hw = v.get("hardware")
            if isinstance(hw, dict) and hw:
                arch = hw.get("gpu_arch") if isinstance(hw.get("gpu_arch"), dict) else {}
                # the row keeps the verdict (which GPUs, which package limits them), not the per-file lists
                hardware = {"gpu_arch": {"supports": list(arch.get("supports") or []),
                                         "lacking": dict(arch.get("lacking") or {})},
                            "min_shm_bytes": hw.get("min_shm_bytes")}
    if caveats:  # works, but the host must allow this: "fetches X at import", "writes to $HOME"
        hardware["caveats"] = [{k: str(c.get(k) or "") for k in ("kind", "module", "what")} for c in caveats]
    return versions, hardware


def fold(records) -> list[Row]:
    by_combo: dict[str, list] = {}
    for r in records:
        cid = r.combo.get("id") if isinstance(r.combo, dict) else None
        if isinstance(cid, str) and cid:  # a record without a combination id is not a row
            by_combo.setdefault(cid, []).append(r)
    return [fold_combo(by_combo[c]) for c in sorted(by_combo)]


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
    passed = [f"envbuild-probe/{lv}" for lv in LEVELS if st[lv] == "pass"]
    failed = [f"envbuild-probe/{lv}" for lv in LEVELS if st[lv] in ("fail", "timeout")]
    warned = [f"envbuild-probe/{lv}" for lv in LEVELS if st[lv] in ("needs-gpu", "error", "not-run")]
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


def attestation_path(row_id: str) -> str:
    """Where a row's attestation lives, relative to the table folder (verify uses the same)."""
    return f"attestations/{safe_name(row_id, 'row id')}.dsse.json"


# ---------------------------------------------------------------- publish
#
# The site is published as a set: every file is written into a fresh folder next to --out
# (.NAME.sites/<serial>-<random>/), then --out, a symlink, is switched to it with one rename.
# A reader resolves --out once and sees the old set or the new one, never a mix; a crash before
# the switch leaves the old set in place and verifiable (the half-written folder is removed by
# the next publish).


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
            expires_days: float = DEFAULT_EXPIRES_DAYS) -> Table:
    if not Path(results).is_dir():
        raise InputError(str(results), None, "--results", str(results), "no such directory")
    if not 0 < expires_days <= 3650:
        raise InputError("--expires-days", None, "--expires-days", expires_days, "must be in (0, 3650]")
    signer = load_signer(key)  # fail on a bad key before writing anything
    pub = public_key_of(signer)
    rows = fold(iter_records(results))  # an unsafe combination id stops here, before any write

    out = Path(os.path.abspath(out))
    if out.is_symlink() and Path(os.path.realpath(out)).parent != Path(os.path.realpath(_sites_dir(out))):
        out = Path(os.path.realpath(out))  # a user's own link to the table folder: publish there
    sites = _sites_dir(out)
    prev, prev_bytes = _previous(out)

    table = build_table(rows, pub.keyid, expires_days=expires_days)
    attestations: dict[str, bytes] = {}
    for row in rows:
        stmt = image_statement(row)
        if stmt is not None:
            env = sign_statement(stmt, signer)
            assert env["payloadType"] == IN_TOTO_PAYLOAD_TYPE
            attestations[attestation_path(row.id)] = (json.dumps(env, indent=1) + "\n").encode()

    def views() -> dict[str, bytes]:  # the files the signed payload lists, for table.serial as set
        files = {**attestations, "pubkey.json": (json.dumps(pub.to_dict(), indent=2) + "\n").encode(),
                 "compat.md": render_markdown(table).encode(),
                 "index.html": page.render_html(table.to_dict(), pub.to_dict()).encode()}
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
    with open(sites / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two publishes into one --out: one after the other
        if out.is_dir() and not out.is_symlink():
            _adopt_legacy_dir(out, sites)
        current = os.path.realpath(out) if out.is_symlink() else None
        site = sites / f"{table.serial}-{secrets.token_hex(4)}"
        for name, blob in files.items():
            write_atomic(site / name, blob)
        _switch(out, site)
        _prune(sites, {site.name, ".lock"} | ({Path(current).name} if current else set()))
    return table


def render_markdown(table: Table) -> str:
    c = table.counts
    lines = [
        "# envbuild compatibility table", "",
        f"Generated {table.generated} · serial {table.serial} · expires {table.expires} · "
        f"schema {table.schema} · signed by key `{table.keyid}`", "",
        f"{c['verified']} verified · {c['broken']} broken · {c['untested']} untested · "
        f"{c['unpinned']} unpinned (passed, not pushed)", "",
        "Verify before use, against the key you trust (not a copy fetched with the table): "
        "`envbuild verify TABLE --pubkey KEY`", "",
        "| verl | engine | torch | CUDA | python | status | best level | env | contract | gpu | cause | image |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.rows:
        cb, lv = r.combo, r.levels
        if r.failure:
            cause = f"{r.failure.level}: {r.failure.cause}"
        elif r.build.status == "fail":
            cause = f"rebuild fails: {r.build.cause}"
        else:
            undecided = [f"{k}: {v.cause or v.status}" for k, v in lv.items() if v.status in ("error", "needs-gpu")]
            if r.build.status == "error":
                undecided.insert(0, f"build error (not a verdict): {r.build.cause}")
            cause = "; ".join(undecided)
        img = (r.image.pinned or r.image.ref or "") if r.image else ""
        cells = [cb.verl or "", f"{cb.engine or ''} {cb.engine_version or ''}".strip(),
                 cb.torch or "", cb.cuda or "", cb.python or "", r.status,
                 r.best_level or "-", r.level("env").status, r.level("contract").status, r.level("gpu").status,
                 cause, f"`{img}`" if img else ""]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"results directory (default: {DEFAULT_RESULTS})")
    p.add_argument("--key", default=os.environ.get("ENVBUILD_SIGNING_KEY", DEFAULT_KEY),
                   help=f"Ed25519 private key PEM (default: $ENVBUILD_SIGNING_KEY or {DEFAULT_KEY})")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"output: a symlink to the current site, switched atomically (default: {DEFAULT_OUT})")
    p.add_argument("--expires-days", type=float, default=DEFAULT_EXPIRES_DAYS, metavar="N",
                   help=f"readers refuse the table N days after publishing (default: {DEFAULT_EXPIRES_DAYS}); "
                        "publish again before then")
    p.add_argument("--json", action="store_true", help="print what was published as JSON")


def run(args) -> int:
    table = publish(args.results, args.key, args.out, args.expires_days)
    c = table.counts
    if getattr(args, "json", False):
        print(json.dumps({"out": str(args.out), "rows": len(table.rows), "counts": c, "keyid": table.keyid,
                          "serial": table.serial, "expires": table.expires}, indent=2, sort_keys=True))
        return 0
    print(f"{len(table.rows)} combinations: {c['verified']} verified, {c['broken']} broken, "
          f"{c['untested']} untested, {c['unpinned']} unpinned")
    print(f"wrote {args.out}/compat.json (+ .dsse), compat.md, index.html, pubkey.json (keyid {table.keyid}); "
          f"serial {table.serial}, expires {table.expires}")
    return 0
