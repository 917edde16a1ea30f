"""The table's views: index.html and compat.md, each rendered from a Jinja2 template file
(dockerfiles/index.html.j2, dockerfiles/compat.md.j2) with data that the one query made
(envbuild.query). Pure functions of a typed table: no file is read but the templates.

What a row shows is listed here once: every field of a row is in ROW_FIELDS (shown, with how) or in
HIDDEN_FIELDS (not shown, and why); tests/test_views.py fails when a row grows a field that is
on neither list.
"""

from __future__ import annotations

import json
from functools import lru_cache

from . import drivers
from .query import Ask, Facts, cells, facts, rank_key
from .row import BROKEN, STATUSES, TABLE_PAYLOAD_TYPE, VERIFIED, Row, Table
from .probe.vocab import ENGINE_SPECS, ERROR, FAIL, LEVELS, NEEDS_GPU, PASS, level_rank
from .probe.features import FEATURE_SPECS
from .probe.hardware import DEFAULT_PLATFORM, PLATFORMS, arch_key, gpu_names, parse_variant

HISTORY_IN_PAGE = 10  # the page shows recent runs; compat.json keeps them all

# Row fields the detail pane and compat.md show: field -> label.
ROW_FIELDS = {
    "id": "combination", "combo": "versions (verl, engine, torch, CUDA, Python, platform)", "image": "image",
    "build": "build", "levels": "levels", "best_level": "best level", "status": "status", "failure": "failure",
    "versions": "other versions", "hardware": "host needs (GPU kernels, NVIDIA driver, /dev/shm, caveats)",
    "notes": "notes", "base": "base image", "history": "recent runs",
    "in_place": "in place (the row's lock judged on a GPU node without Docker: envbuild venv)",
    "census": "census (the lock, and verl against the engine's wheels, without an image: below env)",
    "scopes": "broken only for some runs (a feature, a model type, a run-time guard), with file:line",
}
# Row fields neither shows, and why.
HIDDEN_FIELDS = {
    "lock_hash": "an identity for provenance (the attestation and compat.json carry it), nothing to decide on",
}


def _env():
    import jinja2

    from .paths import templates_dir

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined, autoescape=jinja2.select_autoescape(["html.j2"]))


@lru_cache(maxsize=None)
def _template(name: str):
    return _env().get_template(name)


# ---------------------------------------------------------------- shared facts


def engine_label(row: Row) -> str:
    c = row.combo
    return f"{c.engine or ''} {c.engine_version or ''}".strip()


def gpu_label(sm: str) -> str:
    """`sm_90` -> `sm_90 (H100, H200, H20, GH200)`."""
    names = [n for n, arch in gpu_names().items() if arch == sm]
    return f"{sm} ({', '.join(names)})" if names else sm


def _facts_json(f: Facts, rank: int) -> dict:
    return {"eligible": f.eligible, "supports": list(f.supports) if f.supports is not None else None,
            "min_driver": f.min_driver, "standing": f.standing, "rank": rank, "broken_scopes": list(f.broken_scopes)}


def _platforms(table: Table) -> list[str]:
    have = {r.combo.platform or DEFAULT_PLATFORM for r in table.rows}
    return [p for p in PLATFORMS if p in have] + sorted(have - set(PLATFORMS))


# ---------------------------------------------------------------- the page


def page_data(table: Table, pubkey: dict) -> dict:
    """What index.html embeds: the rows (as compat.json holds them, plus each row's query facts
    under `q`) and, per platform, the answer of every cell at the default ask: the page's script
    draws from these and combines the facts the way query.qualifies does for any other ask."""
    rows = list(table.rows)
    order = {r.id: i for i, r in enumerate(sorted(rows, key=rank_key))}
    out_rows = []
    for r in rows:
        d = r.to_dict()
        d["history"] = d["history"][:HISTORY_IN_PAGE]
        d["q"] = _facts_json(facts(r), order[r.id])
        out_rows.append(d)
    platforms = _platforms(table)
    best = {}
    for pf in platforms:
        for (p, eng, verl), ans in cells(table, Ask().on(pf)).items():
            best[f"{p}|{eng}|{verl}"] = {"best": ans.best.id if ans.best else None, "shown": ans.shown.id}
    keyval = pubkey.get("keyval") if isinstance(pubkey.get("keyval"), dict) else {}
    # Every GPU a user may have (the known ones, and any a row's kernels name): choosing one the
    # table has no kernels for must say so, not hide the choice.
    known = set(gpu_names().values()) | {s for r in rows for s in (facts(r).supports or ())}
    gpus = sorted(known, key=arch_key)
    return {"generated": table.generated, "schema": table.schema, "serial": table.serial, "expires": table.expires,
            "keyid": pubkey.get("keyid"), "counts": table.counts, "rows": out_rows,
            "key": {"keyid": pubkey.get("keyid"), "public": keyval.get("public")},
            "payloadType": TABLE_PAYLOAD_TYPE, "drivers": drivers.page_table(), "levels": list(LEVELS),
            "platforms": platforms, "defaultPlatform": DEFAULT_PLATFORM if DEFAULT_PLATFORM in platforms else
            (platforms[0] if platforms else ""), "gpus": [[s, gpu_label(s)] for s in gpus],
            "defaultLevel": Ask().level, "best": best, "statuses": list(STATUSES),
            "fields": {"shown": ROW_FIELDS, "hidden": HIDDEN_FIELDS},
            "features": [[f.name, f.label] for f in FEATURE_SPECS],
            # the command line's spellings, for the page's address and the commands it prints
            "engines": [[e.name, e.versioned] for e in ENGINE_SPECS],
            "gpuNames": {n.lower(): arch for n, arch in gpu_names().items()},
            "variantNames": _variant_names(rows)}


def _variant_names(rows) -> dict[str, str]:
    """Every spelling the command line takes for the table's variants (`12.8`, `cuda 12.8`, `cu128`)
    -> the tag, as hardware.parse_variant reads them."""
    out = {}
    for tag in sorted({r.combo.cuda for r in rows if r.combo.cuda}):
        v = parse_variant(tag)
        if v is not None:
            for spelling in (v.tag, v.version, v.label):
                if spelling:
                    out[spelling.lower()] = v.tag
    return out


def render_html(table: Table, pubkey: dict) -> str:
    d = page_data(table, pubkey)
    data = json.dumps(d, sort_keys=True, separators=(",", ":"))
    data = data.replace("<", "\\u003c")  # nothing in the data can close the <script> element
    return _template("index.html.j2").render(data=data, keyid=str(pubkey.get("keyid")),
                                             generated=str(table.generated), driver_label=d["drivers"]["label"])


# ---------------------------------------------------------------- compat.md


def _md(s: object) -> str:
    """One table cell: no pipe, newline or backtick can break out of it."""
    return str(s if s is not None else "").replace("|", "\\|").replace("\n", " ").replace("`", "'").strip()


def _cause(r: Row) -> str:
    if r.failure:
        return f"{r.failure.level}: {r.failure.cause}"
    if r.build.status == FAIL:
        return f"rebuild fails: {r.build.cause}"
    undecided = [f"{k}: {v.cause or v.status}" for k, v in r.levels.items() if v.status in (ERROR, NEEDS_GPU)]
    if r.build.status == ERROR:
        undecided.insert(0, f"build error (not a verdict): {r.build.cause}")
    return "; ".join(undecided)


def needs(r: Row) -> list[str]:
    """What the host must provide, in words: GPU kernels, driver, /dev/shm, caveats."""
    hw = r.hardware or {}
    out = []
    f = facts(r)
    out.append("kernels for " + (", ".join(f.supports) if f.supports else "unknown GPUs (not read)"))
    var = parse_variant(r.combo.cuda)
    if f.min_driver:
        out.append(f"{drivers.driver_label(r.combo.cuda)} >= {f.min_driver} ({var.label if var else r.combo.cuda})")
    if hw.get("min_shm_bytes"):
        out.append(f"/dev/shm >= {int(hw['min_shm_bytes']) >> 20} MiB")
    for c in hw.get("caveats") or []:
        out.append(f"{c.get('kind')}: {c.get('module')} {c.get('what')}".strip())
    return out


def md_row(r: Row) -> dict:
    c = r.combo
    img = (r.image.pinned or r.image.ref or "") if r.image else ""
    return {"verl": _md(c.verl), "engine": _md(engine_label(r)), "torch": _md(c.torch),
            "cuda": _md(c.cuda), "python": _md(c.python), "platform": _md(c.platform or DEFAULT_PLATFORM),
            "status": _md(r.status), "best": _md(r.best_level or "-"),
            "levels": [_md(r.level(lv).status) for lv in LEVELS], "cause": _md(_cause(r)),
            "needs": _md("; ".join(needs(r))), "notes": _md("; ".join(r.notes)),
            "base": _md((r.base or {}).get("ref") or ""), "image": _md(img), "id": _md(r.id),
            "in_place": _md(in_place_text(r)), "census": _md(census_text(r)), "scopes": _md(scopes_text(r))}


def scopes_text(r: Row) -> str:
    """"broken with <scope>: file:line …" per scope ("" when none): what a run that opts in meets."""
    out = []
    for sc, e in r.scopes.items():
        first = (str(e.get("detail") or "").splitlines() or [""])[0]
        out.append(f"broken with {e.get('label') or sc} [{sc}, from {e.get('from') or 'code'}]: {first}")
    return "; ".join(out)


def census_text(r: Row) -> str:
    """The row's census in words ("" when never run)."""
    c = r.census or {}
    if not c:
        return ""
    if c.get("status") == PASS:
        return f"pass ({c.get('created') or c.get('run_id')})"
    return f"{c.get('status')}: {c.get('cause')}"


def in_place_text(r: Row) -> str:
    """The row's in-place verdict in words ("" when never judged in place)."""
    ip = r.in_place or {}
    if not ip:
        return ""
    host = ip.get("host") or {}
    on = ", ".join(host.get("gpu") or []) or host.get("host") or "a node"
    if ip.get("refused"):
        return f"not judged on {on}: {ip['refused']}"
    what = {"verified": f"verified up to {ip.get('best_level')}", "broken": "broken at "
            + str((ip.get("failure") or {}).get("level")) + f" ({(ip.get('failure') or {}).get('cause')})"}.get(
        ip.get("status"), str(ip.get("status")))
    reused = ip.get("reused") or []
    return (f"{what} on {on}, driver {host.get('driver')}, CUDA runtime {host.get('cuda_runtime')}"
            + (f"; {len(reused)} distributions the node had (" + ", ".join(f"{x['name']} {x['version']}"
               for x in reused[:6]) + (", …" if len(reused) > 6 else "") + ")" if reused else ""))


def render_markdown(table: Table) -> str:
    best = []
    for pf in _platforms(table):
        for (p, eng, verl), ans in cells(table, Ask().on(pf)).items():
            row = ans.best
            best.append({"platform": _md(p), "engine": _md(eng), "verl": _md(verl),
                         "answer": _md(row.id) if row else "-", "level": _md(row.best_level) if row else "-",
                         "image": _md(row.pinned) if row else "", "shown": _md(ans.shown.status)})
    return _template("compat.md.j2").render(
        table=table, counts=table.counts, levels=LEVELS, rows=[md_row(r) for r in table.rows], best=best,
        in_place=sum(1 for r in table.rows if (r.in_place or {}).get("status") == VERIFIED),
        census={s: sum(1 for r in table.rows if (r.census or {}).get("status") == s) for s in (PASS, BROKEN)},
        default_level=Ask().level, level_rank=level_rank)
