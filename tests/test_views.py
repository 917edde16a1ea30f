"""The table's views (index.html, compat.md): every row field is shown or listed as hidden, the
platform axis decides what a cell and its `docker pull` say, and the detail pane shows what a user
decides on (platform, GPU kernels, minimum driver, /dev/shm, notes, caveats, base)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from table_fixtures import combo, image, passed, rec, verdict, write_all

from envbuild.fold import fold
from envbuild.row import Row
from envbuild.sign import write_keypair
from envbuild.table import build_table, publish
from envbuild.views import HIDDEN_FIELDS, ROW_FIELDS, page_data, render_markdown

PUB = {"keyid": "ab" * 32, "keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": "cd" * 32}}

# The case: verl 0.8.0 + vLLM 0.11.0 verified at gpu on arm64, broken on amd64 (two variants).
ARM = combo(verl="0.8.0", ev="0.11.0", torch="2.8.0", cuda="cu128", platform="linux/arm64")
AMD = combo(verl="0.8.0", ev="0.11.0", torch="2.8.0", cuda="cu128", platform="linux/amd64")
AMD12 = combo(verl="0.8.0", ev="0.11.0", torch="2.8.0", cuda="cu128", python="3.12", platform="linux/amd64")
HOPPER = {"gpu_arch": {"supports": ["sm_80", "sm_90"], "lacking": {"sm_100": ["flash_attn"]}}, "min_shm_bytes": 1 << 30}


def _records():
    probe = passed("env", "contract", "gpu")
    probe["env"]["hardware"] = HOPPER
    probe["env"]["caveats"] = [{"kind": "needs-network", "check": "import", "module": "tiktoken",
                                "what": "fetches a vocabulary at import"}]
    arm = rec(ARM, probe, img=image(ARM), run=1, machine={"gpu": "NVIDIA GH200"})
    arm.combo = {**arm.combo, "note": "outside the matrix: a test note"}
    arm.base = {"kind": "bootstrap", "ref": "127.0.0.1:5000/envbuild/base:bookworm-py3-abc"}
    return [arm,
            rec(AMD, {"env": verdict("pass"), "contract": verdict("fail", "import-error", "No module named 'x'")},
                img=image(AMD), status="fail", run=2),
            rec(AMD12, {"env": verdict("fail", "pip-check")}, img=image(AMD12), status="fail", run=3)]


def test_every_row_field_is_shown_or_listed_hidden():
    fields = {f.name for f in dataclasses.fields(Row)}
    assert fields == set(ROW_FIELDS) | set(HIDDEN_FIELDS), (
        f"shown nowhere and not listed as hidden: {sorted(fields - set(ROW_FIELDS) - set(HIDDEN_FIELDS))}")
    assert not set(ROW_FIELDS) & set(HIDDEN_FIELDS)
    assert set(Row.from_dict({"id": "x"}).to_dict()) == fields  # what compat.json carries, too


def test_page_data_answers_per_platform():
    table = build_table(fold(_records()))
    d = page_data(table, PUB)
    assert d["platforms"] == ["linux/amd64", "linux/arm64"] and d["defaultPlatform"] == "linux/amd64"
    amd = d["best"]["linux/amd64|vllm 0.11.0|0.8.0"]
    arm = d["best"]["linux/arm64|vllm 0.11.0|0.8.0"]
    assert amd["best"] is None and amd["shown"] in (AMD["id"], AMD12["id"])  # both amd64 variants broken
    assert arm == {"best": ARM["id"], "shown": ARM["id"]}
    row = next(r for r in d["rows"] if r["id"] == ARM["id"])
    assert row["q"]["supports"] == ["sm_80", "sm_90"] and row["q"]["min_driver"] == "570.26"
    assert row["hardware"]["caveats"][0]["module"] == "tiktoken" and row["notes"] == ["outside the matrix: a test note"]
    gpus = dict(d["gpus"])
    assert "H200" in gpus["sm_90"] and "B200" in gpus["sm_100"]  # every known GPU can be chosen


def test_compat_md_shows_the_platform_and_what_the_host_needs():
    md = render_markdown(build_table(fold(_records())))
    assert f"| linux/arm64 | 0.8.0 | vllm 0.11.0 | {ARM['id']} | gpu |" in md
    assert "| linux/amd64 | 0.8.0 | vllm 0.11.0 | - | - |  | broken |" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 0.8.0 |") and "linux/arm64" in ln)
    for want in ("kernels for sm_80, sm_90", "NVIDIA driver >= 570.26 (CUDA 12.8)", "/dev/shm >= 1024 MiB",
                 "needs-network: tiktoken fetches a vocabulary at import", "outside the matrix: a test note",
                 "127.0.0.1:5000/envbuild/base:bookworm-py3-abc"):
        assert want in line, want


# ---------------------------------------------------------------- in a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("views")
    write_all(tmp / "results", _records())
    priv, _, _ = write_keypair(tmp / "keys")
    publish(tmp / "results", priv, tmp / "table")
    return tmp / "table"


@pytest.mark.skipif(not CHROMIUM, reason="chromium not installed (ci/test.sh installs it)")
def test_the_page_answers_for_the_chosen_platform(site):
    from cdp import Browser
    from test_page_browser import FLAGS

    b = Browser(CHROMIUM, FLAGS)
    try:
        cell = 'td.cell[data-verl="0.8.0"]'
        b.open((site / "index.html").as_uri())
        b.wait("document.body.getAttribute('data-ready') === '1'")
        # amd64, the default: both variants broken; no docker pull is offered for the selection.
        assert b.eval(f"document.querySelector('{cell}').getAttribute('data-status')") == "broken"
        assert b.eval(f"document.querySelector('{cell}').getAttribute('data-platform')") == "linux/amd64"
        assert b.eval("document.getElementById('answer').getAttribute('data-id')") == ""
        assert b.eval("document.getElementById('answer-cmd')") is None
        assert "platform=linux%2Famd64" in b.eval("location.hash")
        # arm64: the gpu-verified variant, and its pull.
        b.open((site / "index.html").as_uri() + "#platform=linux/arm64")
        b.wait("document.body.getAttribute('data-ready') === '1'")
        assert b.eval(f"document.querySelector('{cell}').getAttribute('data-answer')") == ARM["id"]
        assert "s-gpu" in b.eval(f"document.querySelector('{cell}').className")
        pull = b.eval("document.getElementById('answer-cmd').textContent")
        assert pull == "docker pull " + image(ARM)["digest"]
        assert "--platform linux/arm64" in b.eval("document.getElementById('answer').textContent")
        # A GPU the image has no kernels for: verified, but not an answer.
        b.open((site / "index.html").as_uri() + "#platform=linux/arm64&gpu=sm_100")
        b.wait("document.body.getAttribute('data-ready') === '1'")
        assert b.eval(f"document.querySelector('{cell}').getAttribute('data-answer')") == ""
        assert "s-below" in b.eval(f"document.querySelector('{cell}').className")
        assert b.eval("document.getElementById('answer-cmd')") is None
        # A driver older than CUDA 12.8 needs: not an answer either.
        b.open((site / "index.html").as_uri() + "#platform=linux/arm64&driver=550.54.14")
        b.wait("document.body.getAttribute('data-ready') === '1'")
        assert b.eval("document.getElementById('answer-cmd')") is None
        b.open((site / "index.html").as_uri() + "#platform=linux/arm64&driver=570.86.10&gpu=sm_90")
        b.wait("document.body.getAttribute('data-ready') === '1'")
        assert b.eval("document.getElementById('answer').getAttribute('data-id')") == ARM["id"]
    finally:
        b.close()


@pytest.mark.skipif(not CHROMIUM, reason="chromium not installed (ci/test.sh installs it)")
def test_the_detail_pane_shows_what_a_user_decides_on(site):
    from cdp import Browser
    from test_page_browser import FLAGS

    b = Browser(CHROMIUM, FLAGS)
    try:
        b.open((site / "index.html").as_uri() + f"#platform=linux/arm64&sel={ARM['id']}")
        b.wait(f"document.querySelector('.variant[data-id=\"{ARM['id']}\"]')")
        text = b.eval(f"document.querySelector('.variant[data-id=\"{ARM['id']}\"]').textContent")
        for want in ("linux/arm64", "sm_80, sm_90; not sm_100 (flash_attn)", "≥ 570.26 (Linux, for CUDA 12.8)",
                     "≥ 1024 MiB", "outside the matrix: a test note", "needs-network: tiktoken fetches a vocabulary",
                     "bootstrap: 127.0.0.1:5000/envbuild/base:bookworm-py3-abc", "NVIDIA GH200", "recent runs"):
            assert want in text, want
        # What the pane shows is what ROW_FIELDS says it shows: each shown field's value is there.
        data = json.loads(b.eval("document.getElementById('data').textContent"))
        row = next(r for r in data["rows"] if r["id"] == ARM["id"])
        shown = {"id": lambda v: [v], "combo": lambda v: [v["verl"], v["engine_version"], v["torch"], v["python"],
                                                           v["platform"]],
                 "image": lambda v: [v["pinned"]], "build": lambda v: [v["status"]],
                 "levels": lambda v: [f"{k}: {e['status']}" for k, e in v.items()], "best_level": lambda v: [v],
                 "status": lambda v: [v], "failure": lambda v: [], "versions": lambda v: [],
                 "hardware": lambda v: [", ".join(v["gpu_arch"]["supports"])], "notes": lambda v: v,
                 "base": lambda v: [v["ref"]], "history": lambda v: [h["created"] for h in v],
                 "in_place": lambda v: [],  # this row was never judged in place (tests/test_inplace.py)
                 "census": lambda v: [],  # nor by the census (tests/test_census.py)
                 "scopes": lambda v: [e["detail"].splitlines()[0] for e in v.values()]}  # tests/test_scoped_rows.py
        assert set(shown) == set(ROW_FIELDS)
        for f in ROW_FIELDS:
            for p in shown[f](row[f]):
                assert str(p) in text, (f, p)
    finally:
        b.close()
