"""index.html in a real headless Chromium (Debian's `chromium`): grid, filters, details, offline.

The page keeps its filters and selection in the URL fragment, so a plain `--dump-dom` of
`index.html#cuda=12.6` shows the DOM after the script applied that filter - no driver needed.
"""

import base64
import functools
import http.server
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import zlib
from html.parser import HTMLParser

import pytest
from cdp import Browser
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.sign import write_keypair
from envbuild.table import publish

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # Any attempt to reach the network fails fast: no DNS, and a proxy that refuses.
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
         "--proxy-server=http://127.0.0.1:9"]

if not CHROMIUM:
    if os.environ.get("CI"):
        raise RuntimeError("chromium is required in CI (apt-get install -y chromium)")
    pytest.skip("chromium not installed (apt-get install -y chromium)", allow_module_level=True)

A = combo(verl="0.4.1", ev="0.8.4")                        # verified: contract
B = combo(verl="0.5.0", ev="0.8.4")                        # broken at contract
C = combo(verl="0.5.0", ev="0.8.5", torch="2.7.0", cuda="12.6")  # verified: gpu
D = combo(verl="0.4.1", engine="sglang", ev="0.4.6")       # broken at build
E = combo(verl="0.5.0", ev="0.8.5")                        # untested (built, not probed)
F = combo(verl="0.4.1", ev="0.8.4", python="3.12")         # broken variant in A's cell
CAUSE = "No module named 'vllm.worker.worker_base'"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page")
    res = tmp / "results"
    write_all(res, [
        rec(A, passed("env", "contract"), img=image(A), run=1),
        rec(B, {"env": verdict("pass"), "contract": verdict("fail", "import-error", CAUSE)}, img=image(B),
            status="fail", run=2),
        rec(C, passed("env", "contract", "gpu"), img=image(C), run=3, machine={"gpu": "NVIDIA H200"}),
        rec(D, stage="lock", status="fail", cause="unsatisfiable", detail="no solution", run=4),
        # built, never probed (an infrastructure error alone would not make a row at all)
        rec(E, {}, img=image(E), stage="build", status="ok", run=5),
        rec(F, {"env": verdict("fail", "pip-check")}, img=image(F), status="fail", run=6),
    ])
    priv, _, _ = write_keypair(tmp / "keys")
    publish(res, priv, tmp / "table")
    return tmp / "table"


def chromium(url: str, *extra: str, timeout: int = 90) -> str:
    with tempfile.TemporaryDirectory() as profile:
        p = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                           capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


class DomSummary(HTMLParser):
    """Collects the grid cells, row headers, filter options and the details text."""

    def __init__(self):
        super().__init__()
        self.cells, self.rowheads, self.options, self.details = [], [], {}, []
        self._stack, self._select, self.body = [], None, {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "td" and "cell" in a.get("class", ""):
            self.cells.append(a)
        if tag == "th" and "rowhead" in a.get("class", ""):
            self._stack.append("rowhead")
        if tag == "select":
            self._select = a.get("id")
            self.options[self._select] = []
        if tag == "option" and self._select:
            self.options[self._select].append((a.get("value"), "selected" in a))
        if a.get("id") == "details":
            self._stack.append("details")

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        if tag == "th" and self._stack and self._stack[-1] == "rowhead":
            self._stack.pop()

    def handle_data(self, data):
        if "rowhead" in self._stack:
            self.rowheads.append(data.strip())
        elif "details" in self._stack:
            self.details.append(data)


def dom(url: str) -> DomSummary:
    s = DomSummary()
    s.feed(chromium(url, "--dump-dom"))
    assert s.body.get("data-ready") == "1", "the page script did not finish"
    return s


def test_grid_renders_every_combination_with_status_and_cause(site):
    s = dom((site / "index.html").as_uri())
    filled = [c for c in s.cells if c["data-status"] != "none"]
    ids = " ".join(c["data-ids"] for c in filled).split()
    assert sorted(ids) == sorted([A["id"], B["id"], C["id"], D["id"], E["id"], F["id"]])
    assert set(s.rowheads) == {"vllm 0.8.4", "vllm 0.8.5", "sglang 0.4.6"}
    by_ids = {c["data-ids"]: c for c in filled}
    a = by_ids[f"{A['id']} {F['id']}"]  # best variant first; the broken one is counted, not hidden
    assert a["data-status"] == "verified" and a["data-level"] == "contract" and a["data-broken"] == "1"
    assert "s-contract" in a["class"] and "failed at env: pip-check" in a["title"]
    assert by_ids[B["id"]]["data-status"] == "broken" and CAUSE not in by_ids[B["id"]]["title"]
    assert "failed at contract: import-error" in by_ids[B["id"]]["title"]
    assert "failed at build: unsatisfiable" in by_ids[D["id"]]["title"]
    # vllm 0.8.5 x verl 0.5.0 has two variants (cu126 gpu-verified, cu124 untested): best shown first.
    both = next(c for c in filled if C["id"] in c["data-ids"])
    assert both["data-ids"].split() == [C["id"], E["id"]] and both["data-level"] == "gpu"
    assert both["data-broken"] == "0"
    assert "index-unreachable" not in both["data-status"]
    assert [v for v, _ in s.options["f-cuda"]] == ["", "cu126", "cu124"]
    assert [v for v, _ in s.options["f-engine"]] == ["", "sglang", "vllm"]


def test_filters_cuda_and_engine(site):
    s = dom((site / "index.html").as_uri() + "#cuda=cu126")
    filled = [c for c in s.cells if c["data-status"] != "none"]
    assert [c["data-ids"] for c in filled] == [C["id"]]
    assert ("cu126", True) in s.options["f-cuda"]
    s = dom((site / "index.html").as_uri() + "#engine=sglang")
    assert s.rowheads == ["sglang 0.4.6"]
    assert [c["data-status"] for c in s.cells if c["data-status"] != "none"] == ["broken"]
    s = dom((site / "index.html").as_uri() + "#engine=vllm&cuda=cu124&torch=2.6.0")
    assert set(s.rowheads) == {"vllm 0.8.4", "vllm 0.8.5"}
    assert {c["data-status"] for c in s.cells} == {"verified", "broken", "untested", "none"}


def test_click_target_shows_details_with_the_failure(site):
    s = dom((site / "index.html").as_uri() + f"#sel={B['id']}")
    text = " ".join(s.details)
    assert B["id"] in text and "contract: fail (import-error)" in text and CAUSE in text


def _png_pixels(path):
    """Minimal PNG decoder (8-bit RGB/RGBA, not interlaced) -> set of RGB colours."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0
    bpp = 4 if ctype == 6 else 3
    raw, stride, prev, colours = zlib.decompress(idat), w * bpp, bytearray(w * bpp), set()
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return colours


def test_screenshot_shows_coloured_cells(site, tmp_path):
    shot = tmp_path / "page.png"
    chromium((site / "index.html").as_uri(), f"--screenshot={shot}", "--window-size=1000,700")
    colours = _png_pixels(shot)
    for name, rgb in {"gpu green": "1a7f37", "contract green": "4ac26b", "broken red": "cf222e"}.items():
        assert bytes.fromhex(rgb) in colours, f"no {name} pixels in the screenshot"
    shutil.copy(shot, os.environ.get("ENVBUILD_PAGE_SHOT", str(tmp_path / "kept.png")))


def test_page_needs_no_network(site):
    html = (site / "index.html").read_text()
    assert not re.search(r"""src\s*=|@import|url\(|https?://(?!in-toto\.io)""", html), \
        "the page refers to something outside itself"
    # Links only to the files published next to it.
    links = re.findall(r'href\s*=\s*"([^"]*)"', html)
    assert set(links) == {"compat.json", "compat.json.dsse", "pubkey.json", "compat.md", "history/index.json"}
    seen = []

    class Recording(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.path)
            super().do_GET()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Recording, directory=str(site)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        s = dom(f"http://127.0.0.1:{srv.server_address[1]}/index.html#cuda=cu124")
    finally:
        srv.shutdown()
        srv.server_close()
    assert len([c for c in s.cells if c["data-status"] != "none"]) == 4
    # The page asked the server for itself (and at most a favicon), for its signature check the
    # signed table next to it, and whether the site has earlier tables: nothing else.
    assert set(seen) - {"/favicon.ico", "/compat.json", "/compat.json.dsse", "/history/index.json"} == {"/index.html"}


# ---------------------------------------------------------------- driven like a person: CDP over a pipe


class Served:
    """A folder over http://127.0.0.1 (the page reads its signed table from its own origin)."""

    def __init__(self, folder):
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
        self.origin = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def browser():
    b = Browser(CHROMIUM, FLAGS)
    yield b
    b.close()


def _open(browser, url):
    browser.open(url)
    browser.wait("document.body && document.body.getAttribute('data-sig-done') === '1'")
    return browser.eval("[document.getElementById('sigcheck').getAttribute('data-state'),"
                        " document.getElementById('sigcheck').textContent]")


def test_select_a_cell_and_copy_the_pull_command(site, browser):
    srv = Served(site)
    try:
        state, text = _open(browser, srv.origin + "/index.html")
        assert state == "valid" and text.startswith("signature valid"), text
        browser.send("Browser.grantPermissions", {"origin": srv.origin,
                                                  "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
                     session=False)
        # The grid shows torch and CUDA in each cell, and the legend explains the marks.
        cell = f'td.cell[data-ids~="{C["id"]}"]'
        assert browser.eval(f"document.querySelector('{cell} .sub').textContent") == "torch 2.7.0 · CUDA 12.6 · amd64"
        legend = browser.eval("document.getElementById('legend').textContent")
        assert "·N" in legend and "(N✗)" in legend and "no digest to pull" in legend
        browser.click(cell)
        browser.wait(f"document.querySelector('.pull-cmd[data-id=\"{C['id']}\"]')")
        assert f"sel={C['id']}" in browser.eval("decodeURIComponent(location.hash)")  # the selection is in the URL
        want = "docker pull " + image(C)["digest"]
        assert browser.eval(f"document.querySelector('.pull-cmd[data-id=\"{C['id']}\"]').textContent") == want
        browser.click(f'button.copy[data-id="{C["id"]}"]')
        browser.wait(f"document.querySelector('button.copy[data-id=\"{C['id']}\"]').getAttribute('data-copied')")
        assert browser.eval("navigator.clipboard.readText()") == want
        detail = browser.eval(f"document.querySelector('.variant[data-id=\"{C['id']}\"]').textContent")
        assert "≥ 560.28.03 (Linux, for CUDA 12.6)" in detail and "minor version compatibility" in detail
        # two CUDA 12 variants in the cell (C and E), one driver paragraph
        assert browser.eval("document.querySelectorAll('#details .variant').length") == 2
        assert browser.eval("document.querySelectorAll('#details .driver-note').length") == 1
        assert "ago)" in detail  # how old the verdict is
        # A broken cell: its failure's log excerpt, and no pull command for a broken image.
        browser.click(f'td.cell[data-ids~="{B["id"]}"]')
        browser.wait(f"document.querySelector('.variant[data-id=\"{B['id']}\"] pre.log')")
        log = browser.eval(f"document.querySelector('.variant[data-id=\"{B['id']}\"] pre.log').textContent")
        assert CAUSE in log
        assert browser.eval(f"document.querySelector('.variant[data-id=\"{B['id']}\"] .pull-cmd')") is None
        assert "to reproduce" in browser.eval(f"document.querySelector('.variant[data-id=\"{B['id']}\"] .image-ref').textContent")
        assert "≥ 550.54.14" in browser.eval(f"document.querySelector('.variant[data-id=\"{B['id']}\"] .driver').textContent")
    finally:
        srv.close()


def _tampered(site, tmp_path, change):
    t = tmp_path / "tampered"
    shutil.copytree(site, t)
    change(t)
    return t


def test_tampered_table_fails_the_in_page_signature_check(site, browser, tmp_path):
    def flip_a_row(t):  # what a forger wants: a broken stack shown as verified
        doc = json.loads((t / "compat.json").read_text())
        row = next(r for r in doc["rows"] if r["id"] == B["id"])
        row["status"], row["failure"] = "verified", None
        (t / "compat.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")

    srv = Served(_tampered(site, tmp_path, flip_a_row))
    try:
        state, text = _open(browser, srv.origin + "/index.html")
        assert state == "invalid" and text.startswith("signature INVALID") and "compat.json" in text, text
    finally:
        srv.close()


def test_forged_envelope_and_untrusted_key_fail(site, tmp_path):
    def forge_payload(t):
        env = json.loads((t / "compat.json.dsse").read_text())
        doc = json.loads(base64.b64decode(env["payload"]))
        doc["rows"][0]["status"] = "broken" if doc["rows"][0]["status"] != "broken" else "verified"
        data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        env["payload"] = base64.b64encode(data).decode()
        (t / "compat.json.dsse").write_text(json.dumps(env))
        (t / "compat.json").write_bytes(data)

    srv = Served(_tampered(site, tmp_path, forge_payload))
    b = Browser(CHROMIUM, FLAGS)
    try:
        state, text = _open(b, srv.origin + "/index.html")
        assert state == "invalid" and "does not match its signature" in text, text
    finally:
        b.close()
        srv.close()
    # The genuine site, but the reader pins another key in the URL: not signed by it.
    _, other_pub, _ = write_keypair(tmp_path / "other")
    other_hex = json.loads(open(other_pub).read())["keyval"]["public"]
    srv, b = Served(site), Browser(CHROMIUM, FLAGS)
    try:
        state, text = _open(b, srv.origin + "/index.html#key=" + other_hex)
        assert state == "invalid" and "not signed by the trusted key" in text, text
        state, text = _open(b, (site / "index.html").as_uri())  # from disk: the reader picks the files
        assert state == "unavailable" and "choose compat.json.dsse" in text
    finally:
        b.close()
        srv.close()


# ---------------------------------------------------------------- the selection follows the user (issue 50)


def _pick(run_cli, site, command: str):
    """A command the page printed, pasted into the command line (against this table and key)."""
    argv = command.split()
    assert argv[:2] == ["envbuild", "pick"], command
    return run_cli(*argv[1:], "--table", site, "--pubkey", site / "pubkey.json")


def test_a_clicked_cell_is_the_answer_and_its_command_runs_as_pasted(site, browser, run_cli):
    srv = Served(site)
    try:
        _open(browser, srv.origin + "/index.html")
        cmd = "document.querySelector('#answer div').textContent.replace('For this selection: ', '')"
        # A verified cell: the box answers that cell, and the command says which cell it is.
        browser.click(f'td.cell[data-ids~="{A["id"]}"]')
        browser.wait(f"document.getElementById('answer').getAttribute('data-id') === '{A['id']}'")
        printed = browser.eval(cmd)
        assert "--vllm 0.8.4" in printed and "--verl 0.4.1" in printed, printed
        hashed = browser.eval("decodeURIComponent(location.hash)")
        assert "verl=0.4.1" in hashed and "ev=vllm 0.8.4" in hashed and f"sel={A['id']}" in hashed
        p = _pick(run_cli, site, printed)
        assert p.returncode == 0 and p.stdout.split()[0] == image(A)["digest"], p.stderr
        assert browser.eval("document.getElementById('answer-cmd').textContent") == "docker pull " + p.stdout.split()[0]
        # A broken cell: no answer on the page, none on the command line (exit 1), for the same reason.
        browser.click(f'td.cell[data-ids~="{B["id"]}"]')
        browser.wait("document.getElementById('answer-none') !== null")
        printed = browser.eval(cmd)
        assert "--verl 0.5.0" in printed and "--vllm 0.8.4" in printed
        p = _pick(run_cli, site, printed)
        assert p.returncode == 1 and "broken at contract" in p.stderr, p.stderr
        # The engine filter alone: `--engine vllm` (a bare `--vllm` needs a version), and the same answer.
        browser.eval("(() => { const b = document.getElementById('f-engine'); b.value = 'vllm';"
                     " b.dispatchEvent(new Event('change')); })()")
        browser.wait("!decodeURIComponent(location.hash).includes('verl=')")
        printed = browser.eval(cmd)
        assert " --engine vllm" in printed and "--verl" not in printed, printed
        p = _pick(run_cli, site, printed)
        assert p.returncode == 0, p.stderr
        assert browser.eval("document.getElementById('answer').getAttribute('data-id')") == p.stderr.split(":")[0]
    finally:
        srv.close()


def test_the_address_takes_the_command_lines_spellings_and_follows_hashchange(site, browser):
    s = dom((site / "index.html").as_uri() + "#cuda=12.6&gpu=H200&platform=amd64")
    assert [c["data-ids"] for c in s.cells if c["data-status"] != "none"] == [C["id"]]
    assert ("cu126", True) in s.options["f-cuda"] and ("sm_90", True) in s.options["f-gpu"]
    assert ("linux/amd64", True) in s.options["f-platform"]
    srv = Served(site)
    try:
        _open(browser, srv.origin + "/index.html")
        assert browser.eval("document.querySelectorAll('td.cell:not([data-status=none])').length") == 4  # A+F, B, C+E, D
        browser.eval("location.hash = '#cuda=12.6'")  # edited by hand, or back/forward
        browser.wait("document.querySelectorAll('td.cell:not([data-status=none])').length === 1")
        assert browser.eval("document.getElementById('f-cuda').value") == "cu126"
    finally:
        srv.close()


def test_cells_that_are_no_answer_look_so_and_say_why_as_pick_does(site, run_cli):
    s = dom((site / "index.html").as_uri() + "#level=gpu")
    a = next(c for c in s.cells if c.get("data-ids", "").startswith(A["id"]))
    assert "s-below" in a["class"] and a["data-why"] == "verified only up to contract (< gpu)"
    p = run_cli("pick", "--vllm", "0.8.4", "--verl", "0.4.1", "--python", "3.11", "--level", "gpu",
                "--table", site, "--pubkey", site / "pubkey.json")
    assert p.returncode == 1 and a["data-why"] in p.stderr, p.stderr
    c = next(c for c in s.cells if c.get("data-ids", "").startswith(C["id"]))
    assert "s-below" not in c["class"] and "data-why" not in c  # an answer says nothing of the sort


def test_earlier_tables_are_linked_only_where_the_site_has_them(site, browser, tmp_path):
    for with_history in (False, True):
        t = tmp_path / f"site-{with_history}"
        shutil.copytree(site, t)
        if with_history:
            (t / "history").mkdir()
            (t / "history" / "index.json").write_text("[]\n")
        srv = Served(t)
        try:
            _open(browser, srv.origin + f"/index.html#sel={B['id']}")
            browser.wait("document.body.getAttribute('data-history-checked') === '1'")
            shown = browser.eval("document.getElementById('historylink').hasAttribute('data-found')")
            assert shown is with_history
            # the row's runs as a strip, oldest to newest, from the signed table
            strip = browser.eval("Array.from(document.querySelectorAll('#details .strip span')).map(x => x.className)")
            assert strip == ["h-fail"]
        finally:
            srv.close()

