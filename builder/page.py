"""index.html: the whole table as one static page (no network beyond its own folder, no external files).

The table is embedded as JSON and drawn by a small script: a grid of engine versions (rows)
against verl versions (columns), each cell coloured by the best probe level reached and
showing the torch/CUDA it was verified with; broken cells red. A click shows the variants:
a copyable `docker pull REPO@sha256:...`, the minimum NVIDIA driver for the row's CUDA, the
other recorded versions, the failure's log excerpt, how old each verdict is. Filters and the
selection live in the URL's #fragment (a view can be linked, and tested).

The page checks the signature itself: it reads compat.json.dsse next to it (or files the user
picks, when opened from disk), verifies the Ed25519 signature over the DSSE PAE with WebCrypto
against the key it is told to trust (embedded at publish, or #key=<hex> in the URL), and
checks that compat.json, this page's rows and this page itself are what was signed.
Generated in Python so that the page ships inside the package without data-file plumbing.
Rows are read by key (old tables and new ones alike).
"""

from __future__ import annotations

import html
import json

from . import drivers
from .row import TABLE_PAYLOAD_TYPE

HISTORY_IN_PAGE = 10  # the page shows recent runs; compat.json keeps them all
ROW_KEYS = ("id", "combo", "image", "build", "levels", "best_level", "status", "failure", "versions")
STATUSES = ("verified", "broken", "untested", "unpinned")


def _row(r: dict) -> dict:
    out = {k: r.get(k) for k in ROW_KEYS if r.get(k) is not None}
    out.setdefault("combo", {})
    out.setdefault("levels", {})
    hist = r.get("history")
    out["history"] = hist[:HISTORY_IN_PAGE] if isinstance(hist, list) else []
    return out


def _page_data(table: dict, pubkey: dict) -> dict:
    rows = [_row(r) for r in table.get("rows") or [] if isinstance(r, dict) and isinstance(r.get("id"), str)]
    counts = table.get("counts") or {s: sum(1 for r in rows if r.get("status") == s) for s in STATUSES}
    keyval = pubkey.get("keyval") if isinstance(pubkey.get("keyval"), dict) else {}
    return {"generated": table.get("generated"), "schema": table.get("schema"), "serial": table.get("serial"),
            "expires": table.get("expires"), "keyid": pubkey.get("keyid"), "counts": counts, "rows": rows,
            "key": {"keyid": pubkey.get("keyid"), "public": keyval.get("public")},
            "payloadType": TABLE_PAYLOAD_TYPE, "drivers": drivers.page_table()}


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
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>envbuild compatibility table</title>
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em; color: #1f2328; }
 h1 { font-size: 1.4em; margin: 0 0 .2em; }
 h2 { font-size: 1.15em; }
 .meta { color: #59636e; margin-bottom: .4em; }
 .links a { margin-right: .8em; }
 #sigcheck { display: inline-block; padding: .1em .6em; border-radius: 3px; font-weight: 600; }
 #sigcheck[data-state=pending], #sigcheck[data-state=unavailable] { background: #eaeef2; color: #59636e; }
 #sigcheck[data-state=valid] { background: #dafbe1; color: #116329; }
 #sigcheck[data-state=expired] { background: #fff8c5; color: #7d4e00; }
 #sigcheck[data-state=invalid] { background: #cf222e; color: #fff; }
 #sigpick { display: none; margin-left: .5em; }
 .filters { display: flex; gap: 1em; flex-wrap: wrap; margin: .6em 0; }
 .filters label { display: flex; flex-direction: column; font-size: .85em; color: #59636e; }
 .filters select { font-size: 1.05em; padding: .15em; }
 table.grid { border-collapse: collapse; margin-top: .5em; }
 .grid th, .grid td { border: 1px solid #d0d7de; padding: .3em .55em; text-align: center; }
 .grid th.rowhead { text-align: left; white-space: nowrap; }
 .grid td.cell { cursor: pointer; min-width: 7.5em; font-weight: 600; }
 .grid td.cell .sub { display: block; font-weight: 400; font-size: .78em; opacity: .9; white-space: nowrap; }
 .grid td.cell:hover { outline: 2px solid #0969da; }
 .grid td.selected { outline: 3px solid #0969da; }
 .s-gpu { background: #1a7f37; color: #fff; }
 .s-contract { background: #4ac26b; color: #fff; }
 .s-env { background: #aceebb; }
 .s-unpinned { background: #ddf4ff; }
 .s-broken { background: #cf222e; color: #fff; }
 .s-untested { background: #eaeef2; color: #59636e; }
 .s-empty { background: #fff; color: #d0d7de; cursor: default; font-weight: 400; }
 .legend { display: flex; flex-wrap: wrap; gap: .3em 1.2em; align-items: center; font-size: .9em; }
 .legend .sw { display: inline-block; padding: .05em .5em; border-radius: 3px; }
 .legend .marks { color: #59636e; }
 #details { margin-top: 1em; padding: .8em; border: 1px solid #d0d7de; border-radius: 6px; max-width: 72em; }
 #details:empty { display: none; }
 #details pre { white-space: pre-wrap; background: #f6f8fa; padding: .5em; margin: .3em 0; }
 #details pre.log { background: #fff1f0; border-left: 3px solid #cf222e; max-height: 22em; overflow: auto; }
 .pull { display: flex; gap: .5em; align-items: center; margin: .4em 0; }
 .pull code { background: #f6f8fa; padding: .35em .5em; border: 1px solid #d0d7de; border-radius: 4px; font-size: .92em; word-break: break-all; }
 .pull button { font: inherit; padding: .25em .8em; cursor: pointer; }
 code { background: #f6f8fa; padding: 0 .25em; }
 .variant { border-top: 1px solid #d0d7de; padding-top: .5em; margin-top: .5em; }
 .facts { display: grid; grid-template-columns: max-content auto; gap: .1em 1em; margin: .3em 0; }
 .facts dt { color: #59636e; }
 .facts dd { margin: 0; }
 .note { color: #59636e; font-size: .88em; }
 .verify pre { background: #f6f8fa; padding: .6em; }
</style>
</head>
<body>
<h1>envbuild compatibility table</h1>
<div class="meta">Generated @@GENERATED@@ <span id="age"></span> &middot; <span id="serial"></span>
 signed by key <code id="keyid">@@KEYID@@</code> &middot; <span id="sigcheck" data-state="pending">checking signature&hellip;</span>
 <input type="file" id="sigpick" multiple accept=".dsse,.json" title="choose compat.json.dsse (and compat.json) to check"></div>
<div class="meta"><span id="counts"></span></div>
<div class="meta links">Files: <a href="compat.json">compat.json</a><a href="compat.json.dsse">signature (compat.json.dsse)</a><a href="pubkey.json">public key (pubkey.json)</a><a href="compat.md">compat.md</a><a href="history/index.json">earlier tables (history/)</a></div>
<div class="legend" id="legend">
 <span><span class="sw s-gpu">gpu ✓</span> passed on a GPU</span>
 <span><span class="sw s-contract">contract ✓</span> imports and API contract pass</span>
 <span><span class="sw s-env">env ✓</span> environment checks only</span>
 <span><span class="sw s-unpinned">(local)</span> passed, image not pushed: no digest to pull</span>
 <span><span class="sw s-broken">✗ level</span> broken at that level</span>
 <span><span class="sw s-untested">?</span> no verdict yet</span>
 <span class="marks"><b>·N</b> N variants (torch, CUDA, Python) in the cell, the best shown · <b>(N✗)</b> N of them broken · small line: torch and CUDA of the variant shown</span>
</div>
<div class="filters">
 <label>Engine <select id="f-engine"></select></label>
 <label>CUDA <select id="f-cuda"></select></label>
 <label>torch <select id="f-torch"></select></label>
 <label>Python <select id="f-python"></select></label>
 <label>Status <select id="f-status"></select></label>
</div>
<div id="shown"></div>
<table class="grid" id="grid"></table>
<div id="details"></div>
<noscript><p>This page draws the grid with JavaScript; the same data is in compat.md and compat.json.</p></noscript>
<section class="verify">
<h2>Verify before you trust it</h2>
<p>This page checks the signature of <code>compat.json.dsse</code> (Ed25519, DSSE) in your browser against the key
it was told to trust: keyid <code id="trusted-keyid"></code> <span id="trusted-from"></span>. To trust your own copy
of the key instead, open this page with <code>#key=&lt;hex of the Ed25519 public key&gt;</code> added to its address.
The check reads <code>compat.json.dsse</code>, <code>compat.json</code> and this page from the same folder; opened from
disk, the browser needs you to pick the files. The command line does the same, and checks the images' attestations:</p>
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
const FILTERS = ["engine", "cuda", "torch", "python", "status"];
const OTHER_VERSIONS = [["transformers", "transformers"], ["flash_attn", "flash-attn"], ["flash-attn", "flash-attn"],
  ["ray", "Ray"], ["nccl", "NCCL"], ["cuda_toolkit", "CUDA toolkit"], ["cudnn", "cuDNN"], ["glibc", "glibc"],
  ["base_image", "base image"]];

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
function field(r, f) { return f === "status" ? r.status : (r.combo || {})[f]; }
function lvl(r, lv) { return (r.levels || {})[lv] || {status: "not-run"}; }
function engineLabel(r) { const c = r.combo || {}; return c.engine + (c.engine_version ? " " + c.engine_version : ""); }
function score(r) { return (RANK[r.status] || 0) + (LRANK[r.best_level] || 0); }
function cellClass(r) { return r.status === "verified" ? "s-" + r.best_level : "s-" + r.status; }
function cudaVersion(s) {  // "cu124" | "12.4" | "12.4.1" -> "12.4"
  s = String(s || "").toLowerCase();
  let m = /^cu(\d{2})(\d)$/.exec(s) || /^(\d+)\.(\d+)(?:\.\d+)?$/.exec(s);
  return m ? (+m[1]) + "." + (+m[2]) : null;
}
function newest(r) {
  const ts = [r.build && r.build.created].concat(LEVELS.map(lv => lvl(r, lv).created)).filter(Boolean);
  return ts.sort().pop() || null;
}
function ago(iso) {
  const t = Date.parse(iso);
  if (!iso || isNaN(t)) return "";
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 172800) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " days ago";
}
function summary(r) {
  const c = r.combo || {};
  let s = r.id + "\n" + "torch " + c.torch + " · CUDA " + c.cuda + " · Python " + c.python + "\n" + r.status;
  if (r.best_level) s += ", passed up to " + r.best_level;
  if (r.failure) s += "\nfailed at " + r.failure.level + ": " + r.failure.cause;
  for (const lv of LEVELS) {
    const e = lvl(r, lv);
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
    const vals = uniq(DATA.rows.map(r => field(r, f))).sort(f === "engine" || f === "status" ? undefined : byVersionDesc);
    sel.appendChild(el("option", {value: ""}, "all"));
    for (const v of vals)
      sel.appendChild(el("option", v === state[f] ? {value: v, selected: ""} : {value: v}, f === "cuda" ? cudaVersion(v) || v : v));
    if (state[f] && vals.includes(state[f])) sel.value = state[f];
    else delete state[f];
    sel.addEventListener("change", () => { state[f] = sel.value; delete state.sel; writeHash(state); draw(); });
  }
}

function filtered() {
  return DATA.rows.filter(r => FILTERS.every(f => !state[f] || String(field(r, f)) === state[f]));
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
      const nbroken = variants.filter(r => r.status === "broken").length;
      if (variants.length > 1) {
        // The cell shows the best variant; say how many variants there are and how many broke.
        label += " ·" + variants.length + (nbroken && best.status !== "broken" ? " (" + nbroken + "✗)" : "");
      }
      const td = el("td", {"class": "cell " + cellClass(best), "data-status": best.status,
                           "data-level": best.best_level || "", "data-verl": v, "data-engine": eng,
                           "data-broken": nbroken, "data-ids": variants.map(r => r.id).join(" "),
                           "title": variants.map(summary).join("\n\n")}, label);
      td.appendChild(el("span", {"class": "sub"}, "torch " + best.combo.torch + " · CUDA " + (cudaVersion(best.combo.cuda) || best.combo.cuda)));
      if (state.sel && variants.some(r => r.id === state.sel)) td.classList.add("selected");
      td.addEventListener("click", () => { state.sel = best.id; writeHash(state); draw(); });
      tr.appendChild(td);
    }
    grid.appendChild(tr);
  }
  showDetails(rows);
}

async function copyText(text, btn) {
  let ok = false;
  try { await navigator.clipboard.writeText(text); ok = true; } catch (e) { ok = false; }
  if (!ok) {  // no clipboard permission (an old browser, a file:// page): the selection way
    const ta = el("textarea");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    ta.remove();
  }
  btn.textContent = ok ? "copied" : "select and copy";
  btn.setAttribute("data-copied", ok ? "1" : "0");
}

function facts(pairs) {
  const dl = el("dl", {"class": "facts"});
  for (const [k, v, attrs] of pairs) {
    if (v == null || v === "") continue;
    dl.appendChild(el("dt", {}, k));
    dl.appendChild(el("dd", attrs || {}, v));
  }
  return dl;
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
    const c = r.combo || {};
    const d = el("div", {"class": "variant", "data-id": r.id});
    d.appendChild(el("h3", {}, r.id + " — " + r.status + (r.best_level ? " (up to " + r.best_level + ")" : "")));
    const pinned = r.image && r.image.pinned;
    if (pinned && r.status !== "verified") {
      // A broken (or not yet judged) image is for reproducing, never something to copy and run.
      d.appendChild(el("div", {"class": "note image-ref"}, "image (" + r.status + ", to reproduce): " + pinned));
    } else if (pinned) {
      const p = el("div", {"class": "pull"});
      const cmd = "docker pull " + pinned;
      p.appendChild(el("code", {"class": "pull-cmd", "data-id": r.id}, cmd));
      const b = el("button", {"type": "button", "class": "copy", "data-id": r.id}, "copy");
      b.addEventListener("click", () => copyText(cmd, b));
      p.appendChild(b);
      d.appendChild(p);
    } else if (r.image && r.image.ref) {
      d.appendChild(el("div", {"class": "note"}, "image " + r.image.ref + " was not pushed: no digest to pull"));
    }
    const cu = cudaVersion(c.cuda);
    const drv = cu && DATA.drivers && DATA.drivers.min[cu];
    const floor = cu && DATA.drivers && DATA.drivers.floor[cu.split(".")[0]];
    const other = [];
    const seen = {};
    for (const src of [r.versions || {}, c]) {
      for (const [k, name] of OTHER_VERSIONS) {
        if (src[k] && !seen[name]) { seen[name] = 1; other.push(name + " " + src[k]); }
      }
    }
    const when = newest(r);
    const hw = r.hardware || {};
    const arch = hw.gpu_arch || {};
    const lacking = Object.entries(arch.lacking || {}).filter(([sm]) => Number(sm.slice(3)) >= 80)
      .map(([sm, pkgs]) => sm + " (" + pkgs.slice(0, 3).join(", ") + ")");
    const gpus = arch.supports ? arch.supports.join(", ") + (lacking.length ? "; not " + lacking.join("; ") : "")
                               : "not read (probed before envbuild read GPU architectures)";
    d.appendChild(facts([
      ["torch", c.torch], ["CUDA", cu || c.cuda], ["Python", c.python],
      ["NVIDIA driver", drv ? "≥ " + drv + " (Linux, for CUDA " + cu + ")" : "unknown for CUDA " + c.cuda, {"class": "driver"}],
      ["other versions", other.join(" · "), {"class": "versions"}],
      ["kernels for", gpus, {"class": "gpu-arch"}],
      ["host /dev/shm", hw.min_shm_bytes ? "≥ " + Math.round(hw.min_shm_bytes / 1048576) + " MiB (docker run --shm-size)" : "",
       {"class": "shm"}],
      ["verdict", when ? when + " (" + ago(when) + ")" : "", {"class": "age"}],
    ]));
    if (drv && floor) d.appendChild(el("div", {"class": "note"}, DATA.drivers.note.replace("{floor}", floor)));
    for (const n of r.notes || []) d.appendChild(el("div", {"class": "note row-note"}, n));
    for (const cv of hw.caveats || [])  // works, but the host must allow it (an air-gapped site wants to know)
      d.appendChild(el("div", {"class": "note caveat"}, "works, but " + cv.kind + ": " + cv.module + " " + cv.what));
    if (r.status === "broken" && r.failure) {
      d.appendChild(el("div", {}, "failed at " + r.failure.level + ": " + r.failure.cause));
      const lines = String(r.failure.detail || "").trim().split("\n");
      if (lines.length && lines[0]) d.appendChild(el("pre", {"class": "log"}, lines.slice(-40).join("\n")));
    }
    const ul = el("ul");
    const b = r.build || {};
    ul.appendChild(el("li", {}, "build: " + b.status + (b.cause ? " (" + b.cause + ")" : "") + (b.created ? " · " + b.created : "")));
    for (const lv of LEVELS) {
      const e = lvl(r, lv);
      ul.appendChild(el("li", {"data-level": lv}, lv + ": " + e.status + (e.cause ? " (" + e.cause + ")" : "") +
        (e.created ? " · " + e.created : "") + (e.gpu ? " · " + e.gpu : "") +
        (e.status === "error" || e.status === "needs-gpu" ? " — not a verdict" : "")));
      if (e.detail && !(r.failure && r.failure.level === lv)) ul.appendChild(el("pre", {}, e.detail));
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

// ---------------------------------------------------------------- the signature, checked here

const enc = new TextEncoder();
function hexBytes(h) { return new Uint8Array((String(h).match(/../g) || []).map(x => parseInt(x, 16))); }
function b64Bytes(s) { const bin = atob(s); return Uint8Array.from(bin, ch => ch.charCodeAt(0)); }
function concat(a, b) { const o = new Uint8Array(a.length + b.length); o.set(a); o.set(b, a.length); return o; }
function sameBytes(a, b) { return a.length === b.length && a.every((x, i) => x === b[i]); }
async function sha256hex(bytes) {
  return Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)), x => x.toString(16).padStart(2, "0")).join("");
}
function pae(type, payload) {  // DSSE v1 pre-authentication encoding: what the signature covers
  const t = enc.encode(type);
  return concat(enc.encode("DSSEv1 " + t.length + " " + type + " " + payload.length + " "), payload);
}
async function trustedKey() {
  const fromUrl = /^[0-9a-f]{64}$/i.test(state.key || "");
  const pub = (fromUrl ? state.key : (DATA.key || {}).public || "").toLowerCase();
  // securesystemslib's keyid: sha256 of the canonical JSON of the key body
  const body = '{"keytype":"ed25519","keyval":{"public":"' + pub + '"},"scheme":"ed25519"}';
  return {pub: pub, keyid: await sha256hex(enc.encode(body)), from: fromUrl ? "(from this page's address)" : "(embedded in this page at publish)"};
}
function sigState(st, text) {
  const box = document.getElementById("sigcheck");
  box.setAttribute("data-state", st);
  box.textContent = text;
}

async function verifySigned(envBytes, tableBytes, pageBytes) {
  const key = await trustedKey();
  document.getElementById("trusted-keyid").textContent = key.keyid;
  document.getElementById("trusted-from").textContent = key.from;
  if (!/^[0-9a-f]{64}$/.test(key.pub)) return sigState("invalid", "signature INVALID: no trusted key");
  let env, payload;
  try {
    env = JSON.parse(new TextDecoder().decode(envBytes));
    payload = b64Bytes(env.payload);
  } catch (e) { return sigState("invalid", "signature INVALID: compat.json.dsse is not a DSSE envelope"); }
  if (env.payloadType !== DATA.payloadType) return sigState("invalid", "signature INVALID: payload type " + env.payloadType);
  const ours = (env.signatures || []).filter(s => s && s.keyid === key.keyid);
  if (!ours.length) return sigState("invalid", "signature INVALID: not signed by the trusted key " + key.keyid.slice(0, 16) + "…");
  let ok = false;
  try {
    const k = await crypto.subtle.importKey("raw", hexBytes(key.pub), {name: "Ed25519"}, false, ["verify"]);
    for (const s of ours) {
      let sig;
      try { sig = b64Bytes(s.sig); } catch (e) { continue; }
      if (await crypto.subtle.verify({name: "Ed25519"}, k, sig, pae(env.payloadType, payload))) { ok = true; break; }
    }
  } catch (e) { return sigState("unavailable", "signature not checked: this browser has no Ed25519 in WebCrypto (" + e.name + ")"); }
  if (!ok) return sigState("invalid", "signature INVALID: compat.json.dsse does not match its signature (tampered?)");
  if (tableBytes && !sameBytes(tableBytes, payload))
    return sigState("invalid", "signature INVALID: compat.json differs from the signed payload (tampered?)");
  let signed;
  try { signed = JSON.parse(new TextDecoder().decode(payload)); } catch (e) { return sigState("invalid", "signature INVALID: payload is not JSON"); }
  // The grid is drawn from this page's copy: it must be the signed table's.
  const sig = r => JSON.stringify([r.id, r.status, r.best_level || null, (r.image || {}).pinned || null, (r.failure || {}).cause || null]);
  const mine = DATA.rows.map(sig).sort().join("\n"), theirs = (signed.rows || []).map(sig).sort().join("\n");
  if (mine !== theirs) return sigState("invalid", "signature INVALID: this page's rows differ from the signed table");
  if (pageBytes && signed.files && signed.files["index.html"] && await sha256hex(pageBytes) !== signed.files["index.html"])
    return sigState("invalid", "signature INVALID: this page is not the index.html the signed table lists");
  if (signed.expires && Date.parse(signed.expires) < Date.now())
    return sigState("expired", "signature valid, but the table EXPIRED at " + signed.expires + ": its publisher stopped publishing");
  sigState("valid", "signature valid" + (signed.serial ? " (serial " + signed.serial + ")" : ""));
}

async function fetchBytes(name) {
  const r = await fetch(name, {cache: "no-store"});
  if (!r.ok) throw new Error(name + ": HTTP " + r.status);
  return new Uint8Array(await r.arrayBuffer());
}

async function checkSignature() {
  let envBytes, tableBytes, pageBytes = null;
  try {
    [envBytes, tableBytes] = await Promise.all([fetchBytes("compat.json.dsse"), fetchBytes("compat.json")]);
  } catch (e) {
    // Opened from disk: the browser does not let a page read its folder; the user picks the files.
    sigState("unavailable", "signature not checked here: choose compat.json.dsse and compat.json →");
    const pick = document.getElementById("sigpick");
    pick.style.display = "inline";
    pick.addEventListener("change", async () => {
      const files = Array.from(pick.files);
      const envF = files.find(f => f.name.endsWith(".dsse")), tabF = files.find(f => f.name.endsWith("compat.json"));
      if (!envF) return sigState("unavailable", "choose compat.json.dsse");
      await verifySigned(new Uint8Array(await envF.arrayBuffer()), tabF ? new Uint8Array(await tabF.arrayBuffer()) : null, null);
    });
    return;
  }
  try { pageBytes = await fetchBytes(location.pathname.split("/").pop() || "index.html"); } catch (e) { pageBytes = null; }
  await verifySigned(envBytes, tableBytes, pageBytes);
}

const c = DATA.counts || {};
document.getElementById("counts").textContent =
  (c.verified || 0) + " verified · " + (c.broken || 0) + " broken · " + (c.untested || 0) + " untested · " + (c.unpinned || 0) + " not pushed";
document.getElementById("age").textContent = DATA.generated ? "(" + ago(DATA.generated) + ")" : "";
document.getElementById("serial").textContent = (DATA.serial ? "serial " + DATA.serial + " · " : "") + (DATA.expires ? "expires " + DATA.expires + " ·" : "");
setupFilters();
draw();
document.body.setAttribute("data-ready", "1");
checkSignature().catch(e => sigState("invalid", "signature INVALID: " + e)).finally(() => document.body.setAttribute("data-sig-done", "1"));
</script>
</body>
</html>
"""
