"""Fold result records into the rows of the compatibility table (the stage between record and
table: `envbuild publish` signs what this returns).

What counts as verified, strictly (a table that says "works" for a broken stack is the worst
bug this project can have):
  - verdicts are per image: a level's verdict counts only for the image it was measured on;
  - a level's state is its newest *decisive* verdict (vocab.DECISIVE: pass, fail, timeout).
    "error" is the infrastructure failing and "needs-gpu" means the level could not be decided
    here: both are kept in history but never replace an earlier verdict, and never make a row
    broken;
  - a row is "verified" only if its image has a registry digest, its env level passed, and no
    level of that image failed; `best_level` is the highest level such that it and every lower
    level passed.
The row's image is the one with the newest decisive probe verdict (so a rebuild whose probe
errored leaves the earlier, probed image in place, and a rebuild that failed replaces it).
"""

from __future__ import annotations

import calendar
import time

from . import drivers
from .fsutil import safe_name
from .outcome import OK, RECORD_ERROR, RECORD_FAIL, Verdict
from .record import is_census, is_in_place, is_placed
from .values import combo_id, combo_tag
from .row import (BROKEN, UNPINNED, UNTESTED, VERIFIED, Combo, Entry, Failure, HistoryEntry, Image, Row, parse_pinned,
                  parse_utc)
from .probe.vocab import (ERROR, FAIL, LEVELS, NEEDS_GPU, PASS, TIMEOUT, is_decisive, is_failing, levels_upto,
                          worst_status)
from .probe.features import scope_label

_DETAIL_MAX = 600


def _short(text: object, n: int = _DETAIL_MAX) -> str:
    s = str(text or "").strip()
    return s if len(s) <= n else "…" + s[-(n - 1):]  # the tail of a log says the most


def expand_verdict(key: str, v: Verdict) -> dict[str, Verdict]:
    """{level: Verdict} for one probe verdict, which covers every level up to its own.

    A passing verdict at level L passes every level up to L. A non-passing one is split by its
    checks: a lower level passes only if its own checks pass and no unattributable check failed;
    a level without any checks gets the overall status (no evidence is not a pass).
    """
    level = key if key in LEVELS else v.level
    if level not in LEVELS:
        return {}
    upto = levels_upto(level)
    if v.status == PASS or not v.checks or v.status not in (FAIL, NEEDS_GPU, ERROR, TIMEOUT):
        return {lv: v for lv in upto}
    loose = [c for c in v.checks if c.level is None and c.problem]  # written outside a level: counts against all
    out = {}
    for lv in upto:
        mine = [c for c in v.checks if c.level == lv]  # the level the probe stamped (Check.from_dict types it)
        bad = [c for c in mine + loose if c.problem]
        if not mine and not loose:
            out[lv] = v if lv == level else Verdict.stated(lv, v.status, v.cause)
        elif bad:
            out[lv] = Verdict.stated(lv, worst_status([c.status for c in bad]), checks=bad)
        else:
            out[lv] = Verdict.stated(lv, PASS, checks=mine)
    if v.status == TIMEOUT:
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


def _level_entry(rec, level: str, v: Verdict) -> Entry:
    # Verdict.of made an unreadable verdict "error": it proves nothing either way.
    failed = v.status != PASS
    detail = str(v.extra.get("detail") or "") or v.first_detail()
    e = Entry(v.status, v.first_cause() if failed else None, _short(detail) if failed else "", rec.run_id, rec.created)
    if level == "gpu":
        g = (v.gpu or None) or rec.machine.get("gpu")
        if isinstance(g, dict):
            g = g.get("name") or g.get("device") or None
        if g:
            e.gpu = str(g)
    return e


def _row_status(levels: dict[str, Entry], build: Entry, pinned, has_image: bool) -> tuple[str, str | None]:
    """(status, best_level) - the rule in this module's docstring."""
    best = None
    for level in LEVELS:
        if levels[level].status != PASS:
            break
        best = level
    failed = any(is_failing(levels[lv].status) for lv in LEVELS)
    if failed or (build.status == FAIL and not has_image):
        status = BROKEN
    elif best and pinned:
        status = VERIFIED
    elif best:
        status = UNPINNED  # passed, but never pushed: nothing a user could pull by digest
    else:
        status = UNTESTED
    return status, best if status in (VERIFIED, UNPINNED, BROKEN) else None


def _failure(status: str, levels: dict[str, Entry], build: Entry) -> Failure | None:
    failed = [lv for lv in LEVELS if is_failing(levels[lv].status)]
    if failed:
        e = levels[failed[0]]
        return Failure(failed[0], e.cause or e.status, e.detail)
    if status == BROKEN:
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
    # The row's lock on a node, no image: folded apart; only runs of the row's current lock count
    # (an older lock's in-place verdicts stay in the history). The current lock is the one the
    # row's own lock, build or census records name where it has any: an in-place record cannot
    # move the row to another lock hash and so hide an in-place failure of the real one.
    lock_hash = next((r.lock_hash for r in reversed(recs) if r.lock_hash and not is_in_place(r)), recs[-1].lock_hash)
    places = [r for r in recs if is_in_place(r) and r.lock_hash == lock_hash]
    for r in recs:
        if is_placed(r):
            history.append(HistoryEntry(r.run_id, r.created, r.stage, r.status, r.cause,
                                        "in place" if is_in_place(r) else "census",
                                        {lv: v.status for lv, v in _expanded(r).items()} if is_in_place(r) else {},
                                        r.machine.get("gpu")))
            continue
        key = _image_key(r.image, id_to_digest)
        if key is not None and (parse_pinned(r.image.get("digest")) or key not in images):
            images[key] = r.image  # the newest record that names the image's digest describes it
        levels = per_image.setdefault(key, {})
        hist_levels = {}
        # Expand each verdict to the levels it covers; a verdict keyed at a level itself wins
        # over what a higher-level verdict of the same run implies about that level.
        expanded = _expanded(r)
        for level in LEVELS:
            if level not in expanded:
                continue
            e = _level_entry(r, level, expanded[level])
            hist_levels[level] = e.status
            slot = levels.setdefault(level, {})
            if is_decisive(e.status):
                slot["decisive"] = e
                newest_decisive[key] = r.run_id
            else:
                slot["undecided"] = e
        # Build outcome: an image means the build passed; a "fail" before the probe stage is
        # a verdict that the stack cannot be built; "error" is infrastructure, history only.
        if r.image and (r.image.get("id") or r.image.get("digest")):
            build = Entry(PASS, None, "", r.run_id, r.created)
        elif r.status == RECORD_FAIL and r.stage in ("lock", "render", "build"):
            build = Entry(FAIL, r.cause, _short(r.detail), r.run_id, r.created, stage=r.stage)
        elif r.status == RECORD_ERROR:
            last_build_any = Entry(ERROR, r.cause, _short(r.detail), r.run_id, r.created, stage=r.stage)
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
    if combo.get("cuda"):
        hardware = {**hardware, "min_driver": drivers.min_driver(combo["cuda"])}
    levels = {}
    for level in LEVELS:
        slot = per_image.get(row_key, {}).get(level, {})
        levels[level] = slot.get("decisive") or slot.get("undecided") or Entry("not-run")
    status, best = _row_status(levels, build, pinned, image is not None)
    failure = _failure(status, levels, build)
    in_place = _in_place(places)
    if in_place.get("status") == BROKEN and status != BROKEN:
        # The same lock failed on a GPU node: the stack is broken, whatever its image says.
        f = in_place["failure"]
        status, failure = BROKEN, Failure(f["level"], f["cause"], f"in place: {f['detail']}")
    census = _census([r for r in recs if is_census(r)])
    if census.get("status") == BROKEN and status != BROKEN:
        # The lock cannot be resolved, or verl imports or calls what the engine does not have.
        status, failure = BROKEN, Failure("census", census["cause"], f"census: {census['detail']}")
    scoped_from = [r for r in recs if is_census(r)][-1:] + \
        [r for r in recs if not is_placed(r) and _image_key(r.image, id_to_digest) == row_key and r.probe][-1:] + places[-1:]
    return Row(id=cid, combo=Combo.from_dict(combo), image=image, build=build, levels=levels,
               best_level=best, status=status, failure=failure,
               lock_hash=lock_hash, base=recs[-1].base, history=list(reversed(history)),
               versions=versions, hardware=hardware, notes=_notes(combo, recs[-1]), in_place=in_place, census=census,
               scopes=_scopes(scoped_from))


def _scopes(recs: list) -> dict:
    """The failures only some runs reach, from the row's newest census, its image's newest probed
    record and its newest in-place run: per scope, where it was found and the first file:line."""
    out: dict = {}
    for r in recs:
        where = "census" if is_census(r) else "in place" if is_in_place(r) else "image"
        for v in r.probe.values():
            for c in v.checks:
                if not c.scoped_failure:
                    continue
                e = out.setdefault(c.scope, {"label": scope_label(c.scope), "from": c.scope_from, "where": where,
                                             "checks": [], "detail": c.detail[:400]})  # file:line leads
                if c.name not in e["checks"]:
                    e["checks"].append(c.name)
    return {k: out[k] for k in sorted(out)}


def _expanded(r) -> dict[str, Verdict]:
    """A record's verdicts, each expanded to the levels it covers; a verdict keyed at a level itself
    wins over what a higher-level verdict of the same run implies about that level."""
    out: dict[str, Verdict] = {}
    for pkey, v in sorted(r.probe.items(), key=lambda kv: -LEVELS.index(kv[0]) if kv[0] in LEVELS else 1):
        out.update(expand_verdict(pkey, v))
    return out


def _in_place(places: list) -> dict:
    """What the row's lock did on nodes without an image (envbuild venv + probe --here): per level
    the newest verdict (a decisive one wins over a later undecided one, as for images), its status
    and best level by the same rule, and the node it ran on. An in-place verdict is about the stack,
    not an image digest: it never makes an image pickable, and a failure fails the row."""
    if not places:
        return {}
    slots: dict[str, dict] = {}
    decider = places[-1]
    for r in places:  # oldest first
        for level, v in _expanded(r).items():
            e = _level_entry(r, level, v)
            if is_decisive(e.status):
                slots.setdefault(level, {})["decisive"] = e
                decider = r
            else:
                slots.setdefault(level, {})["undecided"] = e
    levels = {lv: (slots.get(lv, {}).get("decisive") or slots.get(lv, {}).get("undecided") or Entry("not-run"))
              for lv in LEVELS}
    best = None
    for lv in LEVELS:
        if levels[lv].status != PASS:
            break
        best = lv
    failed = [lv for lv in LEVELS if is_failing(levels[lv].status)]
    status = BROKEN if failed else VERIFIED if best else UNTESTED
    place = decider.place or {}
    out = {"status": status, "best_level": best if status != UNTESTED else None,
           "levels": {lv: e.to_dict() for lv, e in levels.items()},
           "host": {k: place.get(k) for k in ("host", "gpu", "driver", "sm", "glibc", "cuda_runtime", "python")
                    if place.get(k) is not None},
           "reused": list(place.get("reused") or []), "lock_hash": decider.lock_hash,
           "run_id": decider.run_id, "created": decider.created}
    if failed:
        e = levels[failed[0]]
        out["failure"] = {"level": failed[0], "cause": e.cause or e.status, "detail": e.detail}
    if place.get("refused") and status == UNTESTED:
        out["refused"] = str(place["refused"])
    return out


def _census(recs: list) -> dict:
    """The newest census of the row (a level below env: pass leaves the row untested)."""
    if not recs:
        return {}
    r = max(recs, key=lambda x: x.run_id)
    status = {OK: PASS, RECORD_FAIL: BROKEN}.get(r.status, ERROR)
    out = {"status": status, "run_id": r.run_id, "created": r.created, "lock_hash": r.lock_hash,
           "stage": r.stage, "reused": bool((r.place or {}).get("reused"))}
    if status != PASS:
        out.update(cause=r.cause or r.status, detail=_short(r.detail))
    return out


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
        if is_placed(r) or _image_key(r.image, id_to_digest) != row_key:
            continue
        for v in r.probe.values():
            if v.versions:
                versions = {k: x for k, x in v.versions.items() if isinstance(x, (str, int, float, bool)) or x is None}
            if v.caveats:
                caveats = v.caveats
            hw = v.hardware
            if hw:
                arch = hw.get("gpu_arch") if isinstance(hw.get("gpu_arch"), dict) else {}
                # the row keeps the verdict (which GPUs, which package limits them), not the per-file lists
                hardware = {"gpu_arch": {"supports": list(arch.get("supports") or []),
                                         "lacking": dict(arch.get("lacking") or {})},
                            "min_shm_bytes": hw.get("min_shm_bytes")}
    if caveats:  # works, but the host must allow this: "fetches X at import", "writes to $HOME"
        hardware["caveats"] = [{k: str(c.get(k) or "") for k in ("kind", "module", "what")} for c in caveats]
    return versions, hardware


def refusal(r, now: float | None = None) -> str | None:
    """Why a record may not count for the row its `combo.id` names (None: it may). Its fields must
    make that id (a record cannot give a row another platform or verl version), and its run id is
    its own time, not a later one (a record from 2099 would outrank every later verdict)."""
    cid = r.combo.get("id")
    fields = [r.combo.get(k) for k in ("verl", "engine", "engine_version", "torch", "cuda", "python")]
    if not all(isinstance(f, str) for f in fields):
        return f"record {r.run_id} of {cid}: its combination lacks verl, engine, engine_version, torch, cuda or python"
    made = combo_id(combo_tag(*fields), r.combo.get("platform") if isinstance(r.combo.get("platform"), str) else None)
    if made != cid:
        return f"record {r.run_id} of {cid}: its combination's fields make {made}, not {cid}"
    when = _run_time(r.run_id)
    if when is not None:
        now = time.time() if now is None else now
        if when > now + _RUN_ID_SKEW_S:
            return f"record {r.run_id} of {cid}: its run id is later than now"
        try:
            made_at = parse_utc(r.created)
        except (TypeError, ValueError):
            made_at = None
        if made_at is not None and abs(made_at - when) > _RUN_ID_SKEW_S:
            return f"record {r.run_id} of {cid}: its run id is not its time ({r.created})"
    return None


_RUN_ID_SKEW_S = 86400  # clocks of runners and a slow job: a day either way


def _run_time(run_id: str) -> float | None:
    try:
        return calendar.timegm(time.strptime(str(run_id)[:15], "%Y%m%dT%H%M%S"))
    except ValueError:
        return None  # a run id of another shape (hand-made): nothing to compare


def fold(records, refused: list[str] | None = None) -> list[Row]:
    """The rows of the table; records `refusal` turns away are left out, their reasons appended
    to `refused` (publish says them)."""
    by_combo: dict[str, list] = {}
    for r in records:
        cid = r.combo.get("id") if isinstance(r.combo, dict) else None
        if isinstance(cid, str) and cid:  # a record without a combination id is not a row
            safe_name(cid, "combo.id", f"record {r.run_id}")
            why = refusal(r)
            if why:
                if refused is not None:
                    refused.append(why)
                continue
            by_combo.setdefault(cid, []).append(r)
    by_combo = {c: _bound(c, recs, refused) for c, recs in by_combo.items()}
    # A combination whose every record is an infrastructure error (an index that did not answer,
    # a daemon that was down) says nothing about the stack: it is not a row of the table.
    return [fold_combo(by_combo[c]) for c in sorted(by_combo)
            if by_combo[c] and not all(r.status == RECORD_ERROR and not r.image for r in by_combo[c])]


def made_here(r) -> bool:
    """A record of the run that made the image it names: the pipeline's, which locked and rendered
    the image's context and then built it or found it built (its timings say so), or one that
    ended at the build or the push."""
    return r.stage in ("build", "push") or (isinstance(r.timings, dict) and bool({"render", "build"} & set(r.timings)))


def _bound(cid: str, recs: list, refused: list[str] | None) -> list:
    """A record that only probed an image (the GPU runners' `ci probe`) counts only for an image
    that a record of this combination made: its verdicts cannot give the row a digest nobody
    built, nor land on an image of another combination."""
    id_to_digest = {r.image["id"]: _image_key(r.image) for r in recs
                    if r.image and r.image.get("id") and parse_pinned(r.image.get("digest"))}
    def key_of(image: dict):  # an image named only by its reference (a local build) is that reference
        return _image_key(image, id_to_digest) or (f"ref:{image['ref']}" if image.get("ref") else None)

    made = {key_of(r.image) for r in recs if r.image and made_here(r)}
    out = []
    for r in recs:
        if r.image and not is_placed(r) and not made_here(r):
            key = key_of(r.image)
            if key is None or key not in made:
                if refused is not None:
                    refused.append(f"record {r.run_id} of {cid}: it probed {key or 'an unnamed image'}, "
                                   f"which no build record of {cid} made")
                continue
        out.append(r)
    return out
