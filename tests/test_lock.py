"""Layered locks. Offline tests use recorded data; `network` tests resolve for real with uv."""

import json
from types import SimpleNamespace

import pytest

from envbuild.index import Metadata
from envbuild.lock import Locker
from envbuild.lockmodel import era
from envbuild.lockfile import layer_text, parse_lock
from envbuild.matrix import load_matrix
from envbuild.expand import plan
from envbuild.selector import selectors_from_args
from envbuild.paths import default_matrix

UV_OUT = """\
filelock==3.17.0 \\
    --hash=sha256:aaa \\
    --hash=sha256:bbb
    # via torch
torch==2.6.0 \\
    --hash=sha256:ccc
    # via -r requirements.in
typing-extensions==4.12.2 \\
    --hash=sha256:ddd
"""


def test_parse_and_layer_text():
    full = parse_lock(UV_OUT)
    assert {k: v[0] for k, v in full.items()} == {"filelock": "3.17.0", "torch": "2.6.0",
                                                   "typing-extensions": "4.12.2"}
    text = layer_text(full, ["typing-extensions"], "# header")
    assert text.startswith("# header\n")
    assert "typing-extensions==4.12.2" in text and "--hash=sha256:ddd" in text
    assert "torch==" not in text and "filelock" not in text  # only the layer's own packages


def test_via_comments_name_who_depends_on_each_pin():
    from envbuild.lockfile import dependents_of
    text = UV_OUT + "antlr4-python3-runtime==4.9.3 \\\n    --hash=sha256:eee\n    # via\n    #   hydra-core\n    #   omegaconf\n"
    assert dependents_of(text) == {"filelock": ["torch"], "torch": ["-r requirements.in"], "typing-extensions": [],
                                   "antlr4-python3-runtime": ["hydra-core", "omegaconf"]}


def test_verl_comes_with_its_runtime_extra_where_the_release_declares_one(tmp_path):
    """verl 0.9 moved what its default trainer imports at start-up (TransferQueue, cachetools)
    into [verl-core]; without it `main_ppo` stops at `import transfer_queue` on the GPU."""
    from envbuild.index_config import TorchSource
    from envbuild.values import Combo

    rel = {"requires_python": "", "released": "2026-09-20T00:00:00Z", "requires_dist": []}
    snap = tmp_path / "meta.json"
    snap.write_text(json.dumps({"releases": {
        "verl==0.9.1": {**rel, "provides_extra": ["test", "verl-core", "vllm"]},
        "verl==0.8.0": {**rel, "provides_extra": ["test", "vllm", "sglang"]},
        "vllm==0.24.0": {**rel, "provides_extra": []}}}))
    locker = Locker(load_matrix(default_matrix()), Metadata(snapshot=snap, online=False), cache=tmp_path / "c")
    src = TorchSource("cu130", "cu130", None)
    for verl, want in [("0.9.1", "verl[verl-core]==0.9.1"), ("0.8.0", "verl==0.8.0")]:
        c = Combo(verl=verl, engine="vllm", engine_version="0.24.0", torch="2.11.0", cuda="cu130", python="3.12",
                  glibc="2.39")
        reqs, _ = locker.requirements(c, src)
        assert reqs[0] == want, reqs


def test_era_is_newest_release_plus_grace():
    assert era(["2025-04-15T00:30:02Z", "2025-06-27T00:11:49Z"], 14) == "2025-07-11"
    assert era(["2025-01-29T00:00:00Z"], 0) == "2025-01-29"


def combo(**sel):
    return plan(load_matrix(default_matrix()), selectors_from_args(SimpleNamespace(**sel)), meta=Metadata(online=False)).combos[0]


def test_non_default_variant_comes_from_the_public_pytorch_index(monkeypatch):
    from envbuild.index_config import PYTORCH_INDEX_DEFAULT, torch_source

    monkeypatch.delenv("ENVBUILD_PYTORCH_INDEX", raising=False)
    meta = Metadata(online=False)
    assert torch_source("cu124", "2.6.0", meta).url is None  # the default index's own build
    assert torch_source("cu126", "2.6.0", meta).url == "https://download.pytorch.org/whl/cu126" \
        == PYTORCH_INDEX_DEFAULT + "/cu126"
    # a matrix key names a mirror; the environment wins over it
    assert torch_source("cu126", "2.6.0", meta, "https://mirror.example/whl/").url == "https://mirror.example/whl/cu126"
    monkeypatch.setenv("ENVBUILD_PYTORCH_INDEX", "http://127.0.0.1:8/pt")
    assert torch_source("cu126", "2.6.0", meta, "https://mirror.example/whl").url == "http://127.0.0.1:8/pt/cu126"


def test_an_engines_own_index_is_searched_when_its_rows_are_locked(tmp_path, monkeypatch):
    """vocab.EngineSpec.extra_index (issue 51): uv is given the engine's index before the configured
    one (after the PyTorch index), best match across them; a row of another engine is not."""
    from envbuild import uvcompile

    uv = tmp_path / "uv"
    uv.write_text('#!/bin/sh\nprintf "%s|%s" "$UV_INDEX" "$UV_INDEX_STRATEGY" > requirements.txt\n')
    uv.chmod(0o755)
    monkeypatch.setattr(uvcompile, "uv_exe", lambda: str(uv))
    monkeypatch.setattr(uvcompile, "default_index_url", lambda: "https://index.invalid/simple")
    monkeypatch.delenv("UV_INDEX", raising=False)
    args = (["x==1"], "", "3.11", "x86_64-manylinux_2_28")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    got = uvcompile.compile_requirements(*args, None, {}, tmp_path / "a", engine_index="https://engine.invalid/simple")
    assert got == {"status": "ok", "text": "https://engine.invalid/simple|unsafe-best-match"}
    got = uvcompile.compile_requirements(*args, "https://torch.invalid/cu130", {}, tmp_path / "b",
                                         engine_index="https://engine.invalid/simple")
    assert got["text"] == "https://torch.invalid/cu130 https://engine.invalid/simple|unsafe-best-match"
    assert uvcompile.compile_requirements(*args, None, {}, tmp_path / "c")["text"] == "|"


@pytest.mark.network
def test_lock_is_era_consistent_layered_and_cached(tmp_path, isolated_cache):
    m = load_matrix(default_matrix())
    locker = Locker(m, Metadata())
    c = combo(cuda="cu124", vllm="0.8.4", verl="0.4.1")
    r = locker.lock(c, tmp_path / "locks")
    assert r.ok, r.detail
    full = parse_lock(open(r.full_lock).read())
    assert full["torch"][0] == "2.6.0" and full["vllm"][0] == "0.8.4" and full["verl"][0] == "0.4.1"
    # resolved as of vLLM 0.8.4 / verl 0.4.1's era: a transformers 4.5x, not today's 5.x
    assert full["transformers"][0].startswith("4.5"), full["transformers"]
    names = [l.name for l in r.layers]
    assert names == ["torch", "engine", "verl"]
    # the union of the layers is the full lock, and each package lands in exactly one layer
    union = {}
    for l in r.layers:
        union.update(l.packages)
    assert union == {k: v[0] for k, v in full.items()}
    assert "torch" in r.layers[0].packages and "vllm" in r.layers[1].packages and "verl" in r.layers[2].packages
    # every pin carries hashes
    assert all("--hash=sha256:" in block for _, block in full.values())
    meta = json.loads((tmp_path / "locks" / c.id / "lock.json").read_text())
    assert meta["status"] == "ok" and meta["lock_hash"] == r.lock_hash
    # a second lock of the same plan does no resolution at all
    again = Locker(m, Metadata())
    r2 = again.lock(c)
    assert again.uv_runs == 0 and r2.cached and r2.lock_hash == r.lock_hash
    # a second verl on the same torch + engine shares the torch and engine layers byte for byte
    c2 = combo(cuda="cu124", vllm="0.8.4", verl="0.5.0")
    r3 = locker.lock(c2)
    assert r3.ok, r3.detail
    assert r3.layers[0].sha256 == r.layers[0].sha256
    assert r3.layers[1].sha256 == r.layers[1].sha256
    assert r3.layers[2].sha256 != r.layers[2].sha256


@pytest.mark.network
def test_unsatisfiable_names_the_torch_pin(isolated_cache, run_cli, tmp_path):
    p = run_cli("lock", "--cuda", "cu126", "--vllm", "0.8.4", "--verl", "0.4.1", "--torch", "2.7.0",
                "--out", tmp_path, "--json", env={"ENVBUILD_CACHE": str(isolated_cache)})
    assert p.returncode == 1, p.stderr
    row = json.loads(p.stdout.splitlines()[0])
    assert row["status"] == "unsatisfiable"
    assert "torch==2.6.0" in row["detail"] and "vllm==0.8.4" in row["detail"]


@pytest.mark.network
def test_unreachable_pytorch_index_is_never_a_verdict(isolated_cache, run_cli, tmp_path):
    p = run_cli("lock", "--cuda", "cu126", "--vllm", "0.8.4", "--verl", "0.4.1", "--out", tmp_path, "--json",
                env={"ENVBUILD_CACHE": str(isolated_cache), "ENVBUILD_PYTORCH_INDEX": "http://127.0.0.1:9/whl"})
    assert p.returncode == 3, p.stdout + p.stderr
    row = json.loads(p.stdout.splitlines()[0])
    assert row["status"] == "index-unreachable" and "127.0.0.1:9" in row["detail"]
    # an infrastructure failure is not cached: the next run asks again
    assert not list((isolated_cache / "locks").glob("*.json")) or all(
        json.loads(f.read_text())["status"] in ("ok", "unsatisfiable") for f in (isolated_cache / "locks").glob("*.json"))


@pytest.mark.network
def test_an_offline_resolver_is_never_a_verdict(isolated_cache, run_cli, tmp_path):
    """uv with the network disabled answers "no solution" from what its cache lacks (issue 26,
    class 7): infrastructure (exit 3), not `unsatisfiable`, and never cached."""
    env = {"ENVBUILD_CACHE": str(isolated_cache), "UV_OFFLINE": "1", "UV_CACHE_DIR": str(tmp_path / "uvc")}
    p = run_cli("lock", "--verl", "0.4.1", "--hf", "--cuda", "cu124", "--out", tmp_path / "l", "--json", env=env)
    assert p.returncode == 3, p.stdout + p.stderr
    row = json.loads(p.stdout.splitlines()[0])
    assert row["status"] == "index-unreachable" and "offline" in row["detail"], row["detail"][:500]
    assert all(json.loads(f.read_text())["status"] != "unsatisfiable"
               for f in (isolated_cache / "locks").glob("*.json"))


@pytest.mark.network
def test_parallel_lock_keeps_plan_order_and_stays_quiet_when_piped(isolated_cache, run_cli, tmp_path):
    env = {"ENVBUILD_CACHE": str(isolated_cache)}
    sel = ["--cuda", "cu124", "--vllm", "0.8", "--verl", "0.4.1"]
    p = run_cli("lock", *sel, "-j", "2", "--out", tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    ids = [line.split(":")[0] for line in p.stdout.splitlines() if not line.startswith(" ")]
    assert ids == ["verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11", "verl0.4.1-vllm0.8.5.post1-torch2.6.0-cu124-py3.11"]
    assert "\x1b" not in p.stdout + p.stderr  # no progress display when piped
    # one era for the combination: every layer says the same date, the verl one names it
    for cid in ids:
        lock = json.loads((tmp_path / cid / "lock.json").read_text())
        assert {l["era"] for l in lock["layers"]} == {lock["era"]} == {"2025-07-11"}
        # no temp path in the full lock: its hash is the same in every run and on every machine
        assert "envbuild-lock-" not in (tmp_path / cid / "full.txt").read_text()
    # the torch layer is byte-identical across engines that share torch 2.6.0 cu124
    a, b = ((tmp_path / cid / "torch.txt").read_bytes() for cid in ids)
    assert a == b
    q = run_cli("lock", *sel, "-j", "0", "--out", tmp_path, env=env)
    assert q.returncode == 2 and "--jobs" in q.stderr


@pytest.mark.network
def test_the_lock_takes_what_installing_the_top_of_the_stack_takes(tmp_path, isolated_cache):
    """uv prefers the newest versions for the requirements it meets first. With torch first,
    verl 0.9.1's lock took fsspec 2026.9.0 (torch's, unbounded), so datasets fell back to 1.2.1
    (no fsspec cap) and tqdm to 4.49.0, which that era's transformers cannot import: a broken
    stack (found by the arm64 bench) that nobody installing verl 0.9.1 got. The top of the stack
    comes first now, as `pip install verl==0.9.1` resolves it."""
    from packaging.version import Version

    m = load_matrix(default_matrix())
    args = SimpleNamespace(verl="0.9.1", hf=True, cuda="cu130", platform="linux/amd64", python="3.11")
    (c,) = plan(m, selectors_from_args(args)).combos
    lr = Locker(m, Metadata()).lock(c, tmp_path)
    assert lr.status == "ok", lr.detail
    full = parse_lock((tmp_path / c.id / "full.txt").read_text())
    assert Version(full["datasets"][0]) >= Version("4") and Version(full["tqdm"][0]) >= Version("4.62"), \
        (full["datasets"], full["tqdm"], full["fsspec"])
