"""The page's embedded data: read by key from old (schema 1) and new tables alike; the CUDA ->
minimum driver facts come from one table (envbuild.drivers)."""

import json
import re

from envbuild import drivers
from envbuild.probe.hardware import CUDA_KIND
from envbuild.row import Table
from envbuild.views import render_html

PUB = {"keyid": "ab" * 32, "keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": "cd" * 32}}


def _data(html: str) -> dict:
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S).group(1))


def test_old_and_new_tables_render():
    """A schema-1 table (no serial, expiry or files) and a schema-2 one render from the same typed
    rows; counts come from the rows."""
    old = {"schema": 1, "generated": "2026-11-01T00:00:00Z", "keyid": PUB["keyid"],
           "rows": [{"id": "r1", "combo": {"verl": "0.4.1", "engine": "vllm", "engine_version": "0.8.4",
                                          "torch": "2.6.0", "cuda": "cu124", "python": "3.11"},
                     "status": "verified", "best_level": "contract", "image": {"pinned": "r@sha256:" + "0" * 64}},
                    {"id": "r2", "status": "broken"}]}
    d = _data(render_html(Table.from_dict(old), PUB))
    assert [r["id"] for r in d["rows"]] == ["r1", "r2"]
    assert d["counts"]["verified"] == 1 and d["counts"]["broken"] == 1
    assert d["serial"] is None and d["rows"][1]["combo"] == {} and d["rows"][1]["history"] == []
    new = dict(old, schema=2, serial=7, expires="2026-12-01T00:00:00Z", files={"index.html": "0" * 64})
    d = _data(render_html(Table.from_dict(new), PUB))
    assert (d["serial"], d["expires"]) == (7, "2026-12-01T00:00:00Z")
    assert d["key"] == {"keyid": PUB["keyid"], "public": "cd" * 32}
    assert d["payloadType"] == "application/vnd.envbuild.compat-table+json"


def test_min_driver_table_is_nvidias():
    # NVIDIA CUDA Toolkit release notes, Linux x86_64, GA driver of each toolkit.
    for cuda, drv in {"cu124": "550.54.14", "12.6": "560.28.03", "12.8.1": "570.26", "cu130": "580.65.06"}.items():
        assert drivers.min_driver(cuda) == drv
    assert drivers.min_driver("cu999") is None and drivers.min_driver("cpu") is None
    d = _data(render_html(Table(rows=[]), PUB))
    assert d["drivers"]["min"] == CUDA_KIND.min_driver and "{floor}" in d["drivers"]["note"]
    assert d["drivers"]["label"] == "NVIDIA driver" and drivers.driver_floor("12.8") == "525.60.13"
