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

Output (in --out): compat.json, compat.json.dsse (DSSE envelope whose payload is exactly
compat.json's bytes), compat.md, index.html, pubkey.json, attestations/<row id>.dsse.json (one
signed in-toto Statement per image, test-result predicate, subject = image digest).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from .errors import InputError

SCHEMA = 1
TABLE_PAYLOAD_TYPE = "application/vnd.envbuild.compat-table+json"
LEVELS = ("env", "contract", "gpu")
DECISIVE = {"pass", "fail", "timeout"}  # probe statuses that are a verdict on the stack
DEFAULT_RESULTS = "results"
DEFAULT_OUT = "table"
DEFAULT_KEY = os.path.join("keys", "envbuild.key")

_PINNED = re.compile(r"^(?P<repo>[^@\s]+)@sha256:(?P<hex>[0-9a-f]{64})$")
_DETAIL_MAX = 600
# Check statuses that do not explain a non-passing verdict (see envbuild.probe.verdict).
_NOT_A_PROBLEM = (None, "pass", "ok", "skipped", "not-applicable")


def _short(text: object, n: int = _DETAIL_MAX) -> str:
    s = str(text or "").strip()
    return s if len(s) <= n else "…" + s[-(n - 1):]  # the tail of a log says the most


def parse_pinned(ref: object) -> tuple[str, str] | None:
    """'repo@sha256:hex' -> (repo, hex); anything else (a tag, None) -> None."""
    m = _PINNED.match(ref) if isinstance(ref, str) else None
    return (m["repo"], m["hex"]) if m else None


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


def _level_entry(rec, level: str, v: dict) -> dict:
    status = v.get("status") if isinstance(v, dict) else None
    if status not in ("pass", "fail", "timeout", "needs-gpu", "error"):
        status = "error"  # an unreadable verdict proves nothing either way
    e = {"status": status, "cause": _verdict_cause(v) if status != "pass" else None,
         "detail": _verdict_detail(v) if status != "pass" else "",
         "run_id": rec.run_id, "created": rec.created}
    if level == "gpu":
        g = (v.get("gpu") if isinstance(v, dict) else None) or rec.machine.get("gpu")
        if isinstance(g, dict):
            g = g.get("name") or g.get("device") or None
        if g:
            e["gpu"] = str(g)
    return e


def fold_combo(records: list) -> dict:
    """One table row from all records of one combination (any order)."""
    recs = sorted(records, key=lambda r: r.run_id)
    combo = dict(recs[-1].combo)
    cid = combo.pop("id")

    # Per image: per level, the newest decisive entry and the newest undecided one.
    per_image: dict[str | None, dict] = {}
    images: dict[str | None, dict] = {}
    newest_decisive: dict[str | None, str] = {}
    build = {"status": "not-run", "cause": None, "detail": "", "run_id": None, "created": None}
    last_build_any: dict | None = None
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
            hist_levels[level] = e["status"]
            slot = levels.setdefault(level, {})
            if e["status"] in DECISIVE:
                slot["decisive"] = e
                newest_decisive[key] = r.run_id
            else:
                slot["undecided"] = e
        # Build outcome: an image means the build passed; a "fail" before the probe stage is
        # a verdict that the stack cannot be built; "error" is infrastructure, history only.
        if r.image and (r.image.get("id") or r.image.get("digest")):
            build = {"status": "pass", "cause": None, "detail": "", "run_id": r.run_id, "created": r.created}
        elif r.status == "fail" and r.stage in ("lock", "render", "build"):
            build = {"status": "fail", "cause": r.cause, "detail": _short(r.detail), "run_id": r.run_id,
                     "created": r.created, "stage": r.stage}
        elif r.status == "error":
            last_build_any = {"status": "error", "cause": r.cause, "detail": _short(r.detail),
                              "run_id": r.run_id, "created": r.created, "stage": r.stage}
        history.append({
            "run_id": r.run_id, "created": r.created, "stage": r.stage, "status": r.status,
            "cause": r.cause, "image": (r.image or {}).get("digest") or (r.image or {}).get("ref"),
            "levels": hist_levels, "gpu": r.machine.get("gpu"),
        })
    if build["status"] == "not-run" and last_build_any:
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
        image = {"ref": img.get("ref"), "digest": f"sha256:{pinned[1]}" if pinned else None,
                 "pinned": img.get("digest") if pinned else None, "size": img.get("size")}

    levels = {}
    for level in LEVELS:
        slot = per_image.get(row_key, {}).get(level, {})
        levels[level] = slot.get("decisive") or slot.get("undecided") or {
            "status": "not-run", "cause": None, "detail": "", "run_id": None, "created": None}

    best = None
    for level in LEVELS:
        if levels[level]["status"] != "pass":
            break
        best = level
    failed = [lv for lv in LEVELS if levels[lv]["status"] in ("fail", "timeout")]
    if failed or (build["status"] == "fail" and not image):
        status = "broken"
    elif best and pinned:
        status = "verified"
    elif best:
        status = "unpinned"  # passed, but never pushed: nothing a user could pull by digest
    else:
        status = "untested"
    if failed:
        lv = failed[0]
        failure = {"level": lv, "cause": levels[lv]["cause"] or levels[lv]["status"],
                   "detail": levels[lv]["detail"]}
    elif status == "broken":
        failure = {"level": "build", "cause": build["cause"] or "build-failed", "detail": build["detail"]}
    else:
        failure = None

    return {
        "id": cid, "combo": combo, "image": image, "build": build, "levels": levels,
        "best_level": best if status in ("verified", "unpinned", "broken") else None,
        "status": status, "failure": failure,
        "lock_hash": recs[-1].lock_hash, "base": recs[-1].base,
        "history": list(reversed(history)),
    }


def fold(records) -> list[dict]:
    by_combo: dict[str, list] = {}
    for r in records:
        cid = r.combo.get("id") if isinstance(r.combo, dict) else None
        if isinstance(cid, str) and cid:  # a record without a combination id is not a row
            by_combo.setdefault(cid, []).append(r)
    return [fold_combo(by_combo[c]) for c in sorted(by_combo)]


def _generated() -> str:
    # SOURCE_DATE_EPOCH makes a publish reproducible byte for byte (reproducible-builds.org).
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    t = time.gmtime(int(epoch)) if epoch and epoch.isdigit() else time.gmtime()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", t)


def build_table(rows: list[dict], keyid: str | None = None) -> dict:
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("verified", "broken", "untested", "unpinned")}
    return {"schema": SCHEMA, "generated": _generated(), "keyid": keyid, "counts": counts, "rows": rows}


def table_bytes(table: dict) -> bytes:
    return (json.dumps(table, indent=1, sort_keys=True) + "\n").encode()


# ---------------------------------------------------------------- attestations


def image_statement(row: dict) -> dict | None:
    """An in-toto test-result Statement for a row's image, or None without a digest."""
    from .sign import TEST_RESULT_PREDICATE, statement

    img = row.get("image") or {}
    pinned = parse_pinned(img.get("pinned"))
    if not pinned:
        return None
    passed = [f"envbuild-probe/{lv}" for lv in LEVELS if row["levels"][lv]["status"] == "pass"]
    failed = [f"envbuild-probe/{lv}" for lv in LEVELS if row["levels"][lv]["status"] in ("fail", "timeout")]
    warned = [f"envbuild-probe/{lv}" for lv in LEVELS
              if row["levels"][lv]["status"] in ("needs-gpu", "error", "not-run")]
    result = "FAILED" if failed else "WARNED" if warned or not passed else "PASSED"
    config = [{"name": "envbuild-combination", "annotations": {"id": row["id"], **row["combo"]}}]
    if row.get("lock_hash"):
        config.append({"name": "lock", "digest": {"sha256": row["lock_hash"]}})
    return statement(pinned[0], pinned[1], TEST_RESULT_PREDICATE, {
        "result": result, "configuration": config,
        "passedTests": passed, "warnedTests": warned, "failedTests": failed,
        "envbuild": {"best_level": row["best_level"], "status": row["status"], "levels": row["levels"]},
    })


# ---------------------------------------------------------------- publish


def publish(results: str | os.PathLike, key: str | os.PathLike, out: str | os.PathLike) -> dict:
    from . import page
    from .fsutil import write_atomic  # here, not at module level: `pick` imports this module
    from .record import iter_records
    from .sign import (IN_TOTO_PAYLOAD_TYPE, load_signer, public_key_of, sign_envelope,
                       sign_statement)

    if not Path(results).is_dir():
        raise InputError(str(results), None, "--results", str(results), "no such directory")
    signer = load_signer(key)  # fail on a bad key before writing anything
    pub = public_key_of(signer)
    rows = fold(iter_records(results))
    table = build_table(rows, pub.keyid)
    data = table_bytes(table)
    envelope = sign_envelope(data, TABLE_PAYLOAD_TYPE, signer)

    out = Path(out)
    att_dir = out / "attestations"
    written = set()
    for row in rows:
        stmt = image_statement(row)
        if stmt is None:
            continue
        env = sign_statement(stmt, signer)
        assert env["payloadType"] == IN_TOTO_PAYLOAD_TYPE
        name = f"{row['id']}.dsse.json"
        write_atomic(att_dir / name, json.dumps(env, indent=1) + "\n")
        written.add(name)
    if att_dir.is_dir():  # attestations of images no longer in the table would mislead
        for p in att_dir.glob("*.dsse.json"):
            if p.name not in written:
                p.unlink()
    write_atomic(out / "pubkey.json", json.dumps(pub.to_dict(), indent=2) + "\n")
    write_atomic(out / "compat.md", render_markdown(table))
    write_atomic(out / "index.html", page.render_html(table, pub.to_dict()))
    # The table and its signature last: a reader always sees a matching pair or an old pair;
    # a crash between the two leaves a mismatch that `verify` rejects, never a silent one.
    write_atomic(out / "compat.json", data)
    write_atomic(out / "compat.json.dsse", json.dumps(envelope, indent=1) + "\n")
    return table


def render_markdown(table: dict) -> str:
    c = table["counts"]
    lines = [
        "# envbuild compatibility table", "",
        f"Generated {table['generated']} · schema {table['schema']} · signed by key `{table.get('keyid')}`", "",
        f"{c['verified']} verified · {c['broken']} broken · {c['untested']} untested · "
        f"{c['unpinned']} unpinned (passed, not pushed)", "",
        "Verify before use: `envbuild verify compat.json --pubkey pubkey.json`", "",
        "| verl | engine | torch | CUDA | python | status | best level | env | contract | gpu | cause | image |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table["rows"]:
        cb, lv = r["combo"], r["levels"]
        cause = ""
        if r["failure"]:
            cause = f"{r['failure']['level']}: {r['failure']['cause']}"
        elif r["build"]["status"] == "fail":
            cause = f"rebuild fails: {r['build']['cause']}"
        else:
            undecided = [f"{k}: {v['cause'] or v['status']}" for k, v in lv.items() if v["status"] in ("error", "needs-gpu")]
            if r["build"]["status"] == "error":
                undecided.insert(0, f"build error (not a verdict): {r['build']['cause']}")
            cause = "; ".join(undecided)
        img = (r["image"] or {}).get("pinned") or (r["image"] or {}).get("ref") or ""
        cells = [cb.get("verl", ""), f"{cb.get('engine', '')} {cb.get('engine_version', '') or ''}".strip(),
                 cb.get("torch", ""), cb.get("cuda", ""), cb.get("python", ""), r["status"],
                 r["best_level"] or "-", lv["env"]["status"], lv["contract"]["status"], lv["gpu"]["status"],
                 cause, f"`{img}`" if img else ""]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"results directory (default: {DEFAULT_RESULTS})")
    p.add_argument("--key", default=os.environ.get("ENVBUILD_SIGNING_KEY", DEFAULT_KEY),
                   help=f"Ed25519 private key PEM (default: $ENVBUILD_SIGNING_KEY or {DEFAULT_KEY})")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})")


def run(args) -> int:
    table = publish(args.results, args.key, args.out)
    c = table["counts"]
    print(f"{len(table['rows'])} combinations: {c['verified']} verified, {c['broken']} broken, "
          f"{c['untested']} untested, {c['unpinned']} unpinned")
    print(f"wrote {args.out}/compat.json (+ .dsse), compat.md, index.html, pubkey.json (keyid {table['keyid']})")
    return 0
