"""index.html: the whole table as one static page (no network, no external files).

The table is embedded as JSON and drawn by a small script: a grid of engine versions (rows)
against verl versions (columns), each cell coloured by the best probe level reached, broken
cells red with the cause on hover and the full details on click; filters by engine, CUDA,
torch and Python (kept in the URL's #fragment, so a filtered view can be linked and tested).
Generated in Python so that the page ships inside the package without data-file plumbing.
"""

from __future__ import annotations

import html
import json

HISTORY_IN_PAGE = 10  # the page shows recent runs; compat.json keeps them all


def _page_data(table: dict, pubkey: dict) -> dict:
    rows = []
    for r in table["rows"]:
        rows.append({k: r.get(k) for k in ("id", "combo", "image", "build", "levels", "best_level",
                                           "status", "failure")} | {"history": r.get("history", [])[:HISTORY_IN_PAGE]})
    return {"generated": table.get("generated"), "schema": table.get("schema"), "keyid": pubkey.get("keyid"),
            "counts": table.get("counts"), "rows": rows}


def render_html(table: dict, pubkey: dict) -> str:
    data = json.dumps(_page_data(table, pubkey), sort_keys=True, separators=(",", ":"))
    data = data.replace("<", "\\u003c")  # nothing in the data can close the <script> element
    return (_TEMPLATE
            .replace("@@KEYID@@", html.escape(str(pubkey.get("keyid"))))
            .replace("@@GENERATED@@", html.escape(str(table.get("generated"))))
            .replace("@@DATA@@", data))


_TEMPLATE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>envbuild compatibility table</title>
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em; color: #1f2328; }
 h1 { font-size: 1.4em; margin: 0 0 .2em; }
 .meta { color: #59636e; margin-bottom: .8em; }
 .filters { display: flex; gap: 1em; flex-wrap: wrap; margin: .6em 0; }
 .filters label { display: flex; flex-direction: column; font-size: .85em; color: #59636e; }
 .filters select { font-size: 1.05em; padding: .15em; }
 table.grid { border-collapse: collapse; margin-top: .5em; }
 .grid th, .grid td { border: 1px solid #d0d7de; padding: .35em .6em; text-align: center; }
 .grid th.rowhead { text-align: left; white-space: nowrap; }
 .grid td.cell { cursor: pointer; min-width: 6.5em; font-weight: 600; }
 .grid td.cell:hover { outline: 2px solid #0969da; }
 .grid td.selected { outline: 3px solid #0969da; }
 .s-gpu { background: #1a7f37; color: #fff; }
 .s-contract { background: #4ac26b; color: #fff; }
 .s-env { background: #aceebb; }
 .s-unpinned { background: #ddf4ff; }
 .s-broken { background: #cf222e; color: #fff; }
 .s-untested { background: #eaeef2; color: #59636e; }
 .s-empty { background: #fff; color: #d0d7de; cursor: default; font-weight: 400; }
 .legend span { display: inline-block; padding: .1em .5em; margin-right: .4em; border-radius: 3px; }
 #details { margin-top: 1em; padding: .8em; border: 1px solid #d0d7de; border-radius: 6px; max-width: 70em; }
 #details:empty { display: none; }
 #details pre { white-space: pre-wrap; background: #f6f8fa; padding: .5em; margin: .3em 0; }
 code { background: #f6f8fa; padding: 0 .25em; }
 .variant { border-top: 1px solid #d0d7de; padding-top: .5em; margin-top: .5em; }
 .verify pre { background: #f6f8fa; padding: .6em; }
</style>
</head>
<body>
<h1>envbuild compatibility table</h1>
<div class="meta">Generated @@GENERATED@@ &middot; signed by key <code id="keyid">@@KEYID@@</code> &middot; <span id="counts"></span></div>
<div class="legend">
 <span class="s-gpu">gpu</span><span class="s-contract">contract</span><span class="s-env">env</span>
 <span class="s-unpinned">passed, not pushed</span><span class="s-broken">broken</span><span class="s-untested">no verdict yet</span>
</div>
<div class="filters">
 <label>Engine <select id="f-engine"></select></label>
 <label>CUDA <select id="f-cuda"></select></label>
 <label>torch <select id="f-torch"></select></label>
 <label>Python <select id="f-python"></select></label>
</div>
<div id="shown"></div>
<table class="grid" id="grid"></table>
<div id="details"></div>
<noscript><p>This page draws the grid with JavaScript; the same data is in compat.md and compat.json.</p></noscript>
<section class="verify">
<h2>Verify before you trust it</h2>
<p>This page is a view. The signed data is <code>compat.json</code> with its DSSE envelope
<code>compat.json.dsse</code> (Ed25519, keyid <code>@@KEYID@@</code>), and one signed in-toto
test-result Statement per image in <code>attestations/</code>, whose subject is the image digest.</p>
<pre>envbuild verify compat.json --pubkey pubkey.json --attestations
envbuild pick --vllm 0.8.4 --cuda 12.4 --table . --pubkey pubkey.json   # prints repo@sha256:&hellip;</pre>
<p>Pin the public key you trust (obtained separately, and check its keyid) rather than the copy next to the table.
Pull images by digest, never by tag: a tag can move, a digest cannot.</p>
</section>
<script id="data" type="application/json">@@DATA@@</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const LEVELS = ["env", "contract", "gpu"];
const RANK = {verified: 40, unpinned: 30, untested: 20, broken: 10};
const LRANK = {gpu: 3, contract: 2, env: 1};
const FILTERS = ["engine", "cuda", "torch", "python"];

function vkey(v) {  // "0.10.2" > "0.9.1": compare numerically, part by part
  return String(v == null ? "" : v).split(/[.+-]/).map(p => /^\d+$/.test(p) ? p.padStart(6, "0") : p).join(".");
}
function byVersionDesc(a, b) { return vkey(b) < vkey(a) ? -1 : vkey(b) > vkey(a) ? 1 : 0; }
function uniq(xs) { return Array.from(new Set(xs.filter(x => x != null && x !== ""))); }
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}
function engineLabel(r) { return r.combo.engine + (r.combo.engine_version ? " " + r.combo.engine_version : ""); }
function score(r) { return (RANK[r.status] || 0) + (LRANK[r.best_level] || 0); }
function cellClass(r) {
  if (r.status === "verified") return "s-" + r.best_level;
  return "s-" + r.status;
}
function summary(r) {
  const c = r.combo;
  let s = r.id + "\n" + "torch " + c.torch + " · CUDA " + c.cuda + " · Python " + c.python + "\n" + r.status;
  if (r.best_level) s += ", passed up to " + r.best_level;
  if (r.failure) s += "\nfailed at " + r.failure.level + ": " + r.failure.cause;
  for (const lv of LEVELS) {
    const e = r.levels[lv];
    if (e.status === "error" || e.status === "needs-gpu")
      s += "\n" + lv + ": " + e.status + (e.cause ? " (" + e.cause + ")" : "") + " - not a verdict";
  }
  if (r.build && r.build.status === "fail" && r.status !== "broken") s += "\nrebuild fails: " + r.build.cause;
  return s;
}

function readHash() {
  const st = {};
  for (const part of location.hash.replace(/^#/, "").split("&")) {
    const i = part.indexOf("=");
    if (i > 0) st[decodeURIComponent(part.slice(0, i))] = decodeURIComponent(part.slice(i + 1));
  }
  return st;
}
function writeHash(st) {
  const parts = Object.entries(st).filter(([k, v]) => v).map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(v));
  history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname + location.search);
}

const state = readHash();

function setupFilters() {
  for (const f of FILTERS) {
    const sel = document.getElementById("f-" + f);
    const vals = uniq(DATA.rows.map(r => r.combo[f])).sort(f === "engine" ? undefined : byVersionDesc);
    sel.appendChild(el("option", {value: ""}, "all"));
    for (const v of vals) sel.appendChild(el("option", v === state[f] ? {value: v, selected: ""} : {value: v}, v));
    if (state[f] && vals.includes(state[f])) sel.value = state[f];
    else delete state[f];
    sel.addEventListener("change", () => { state[f] = sel.value; delete state.sel; writeHash(state); draw(); });
  }
}

function filtered() {
  return DATA.rows.filter(r => FILTERS.every(f => !state[f] || String(r.combo[f]) === state[f]));
}

function draw() {
  const rows = filtered();
  const grid = document.getElementById("grid");
  grid.textContent = "";
  const verls = uniq(rows.map(r => r.combo.verl)).sort(byVersionDesc);
  const engines = uniq(rows.map(engineLabel)).sort((a, b) => {
    const [ea, va] = a.split(" "), [eb, vb] = b.split(" ");
    return ea < eb ? -1 : ea > eb ? 1 : byVersionDesc(va, vb);
  });
  document.getElementById("shown").textContent =
    rows.length + " of " + DATA.rows.length + " combinations shown (" + engines.length + " engine versions × " + verls.length + " verl versions)";
  const head = el("tr");
  head.appendChild(el("th", {}, "engine \\ verl"));
  for (const v of verls) head.appendChild(el("th", {"class": "colhead"}, v));
  grid.appendChild(head);
  for (const eng of engines) {
    const tr = el("tr");
    tr.appendChild(el("th", {"class": "rowhead"}, eng));
    for (const v of verls) {
      const variants = rows.filter(r => engineLabel(r) === eng && r.combo.verl === v).sort((a, b) => score(b) - score(a));
      if (!variants.length) { tr.appendChild(el("td", {"class": "cell s-empty", "data-status": "none"}, "–")); continue; }
      const best = variants[0];
      let label = best.status === "verified" ? best.best_level + " ✓" :
                  best.status === "broken" ? "✗ " + (best.failure ? best.failure.level : "") :
                  best.status === "unpinned" ? best.best_level + " (local)" : "?";
      if (variants.length > 1) {
        // The cell shows the best variant; say how many variants there are and how many broke.
        const nbroken = variants.filter(r => r.status === "broken").length;
        label += " ·" + variants.length + (nbroken && best.status !== "broken" ? " (" + nbroken + "✗)" : "");
      }
      const td = el("td", {"class": "cell " + cellClass(best), "data-status": best.status,
                           "data-level": best.best_level || "", "data-verl": v, "data-engine": eng,
                           "data-broken": variants.filter(r => r.status === "broken").length,
                           "data-ids": variants.map(r => r.id).join(" "), "title": variants.map(summary).join("\n\n")}, label);
      if (state.sel && variants.some(r => r.id === state.sel)) td.classList.add("selected");
      td.addEventListener("click", () => { state.sel = best.id; writeHash(state); draw(); });
      tr.appendChild(td);
    }
    grid.appendChild(tr);
  }
  showDetails(rows);
}

function showDetails(rows) {
  const box = document.getElementById("details");
  box.textContent = "";
  const picked = rows.find(r => r.id === state.sel);
  if (!picked) return;
  const variants = rows.filter(r => engineLabel(r) === engineLabel(picked) && r.combo.verl === picked.combo.verl)
                       .sort((a, b) => score(b) - score(a));
  box.appendChild(el("h2", {}, "verl " + picked.combo.verl + " + " + engineLabel(picked)));
  for (const r of variants) {
    const d = el("div", {"class": "variant", "data-id": r.id});
    d.appendChild(el("h3", {}, r.id + " — " + r.status + (r.best_level ? " (up to " + r.best_level + ")" : "")));
    d.appendChild(el("div", {}, "torch " + r.combo.torch + " · CUDA " + r.combo.cuda + " · Python " + r.combo.python));
    if (r.image) d.appendChild(el("div", {}, "image: ")).appendChild(el("code", {}, r.image.pinned || (r.image.ref + " (no digest: not pushed)")));
    const ul = el("ul");
    const b = r.build || {};
    ul.appendChild(el("li", {}, "build: " + b.status + (b.cause ? " (" + b.cause + ")" : "") + (b.created ? " · " + b.created : "")));
    for (const lv of LEVELS) {
      const e = r.levels[lv];
      ul.appendChild(el("li", {"data-level": lv}, lv + ": " + e.status + (e.cause ? " (" + e.cause + ")" : "") +
        (e.created ? " · " + e.created : "") + (e.gpu ? " · " + e.gpu : "") +
        (e.status === "error" || e.status === "needs-gpu" ? " — not a verdict" : "")));
      if (e.detail) ul.appendChild(el("pre", {}, e.detail));
    }
    d.appendChild(ul);
    if (r.history && r.history.length) {
      d.appendChild(el("div", {}, "recent runs:"));
      const hl = el("ul");
      for (const h of r.history)
        hl.appendChild(el("li", {}, h.created + " " + h.stage + " " + h.status + (h.cause ? " (" + h.cause + ")" : "") + " " +
          Object.entries(h.levels || {}).map(([k, v]) => k + "=" + v).join(" ")));
      d.appendChild(hl);
    }
    box.appendChild(d);
  }
}

const c = DATA.counts || {};
document.getElementById("counts").textContent =
  (c.verified || 0) + " verified · " + (c.broken || 0) + " broken · " + (c.untested || 0) + " untested · " + (c.unpinned || 0) + " not pushed";
setupFilters();
draw();
document.body.setAttribute("data-ready", "1");
</script>
</body>
</html>
"""
