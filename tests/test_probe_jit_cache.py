"""What an image compiles at its gpu level is kept for the next gpu probe of the same image
(probe_run.JitCache): one folder per image content, mounted where the stack's JIT caches live,
never shared between images, never mounted for the CPU levels, off with ENVBUILD_PROBE_JIT_CACHE=0."""

from __future__ import annotations

import os
import time

import pytest

from envbuild.docker import Engine
from envbuild.probe_run import JIT_ENV, JIT_KEEP_DAYS, JIT_MOUNT, JitCache, _image_cmd, _jit_mount, probe_image_levels
from test_probe_timeout import _site_image


class FakeEngine(Engine):
    def __init__(self, ids):
        super().__init__(client="docker", mode="run")
        self.ids = ids

    def image_id(self, ref):
        return self.ids.get(ref)


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVBUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVBUILD_PROBE_JIT_CACHE", raising=False)
    return tmp_path / "cache" / "probe-jit"


def _mounts(cmd):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-v"]


def test_the_cache_is_mounted_only_for_a_run_that_reaches_the_gpu_level(tmp_path, cache_home):
    eng = FakeEngine({"img:1": "sha256:" + "a" * 64})
    assert _jit_mount(eng, "img:1", ["env", "contract"]) == (None, None)
    d, info = _jit_mount(eng, "img:1", ["env", "contract", "gpu"])
    assert d == str(cache_home / ("a" * 32)) and info == {"key": "a" * 32, "files_before": 0}
    cmd = _image_cmd(eng, "n", str(tmp_path), "img:1", "gpu", "hf", {}, nproc=1, gpus=False, mount_probe=True,
                     python="/opt/venv/bin/python", pull="never", jit_dir=d)
    assert f"{d}:{JIT_MOUNT}" in _mounts(cmd)
    assert all(f"{k}={v}" in cmd for k, v in JIT_ENV.items()) and all(v.startswith(JIT_MOUNT + "/") for v in JIT_ENV.values())
    bare = _image_cmd(eng, "n", str(tmp_path), "img:1", "gpu", "hf", {}, nproc=1, gpus=False, mount_probe=True,
                      python="/opt/venv/bin/python", pull="never")
    assert not any(m.endswith(JIT_MOUNT) for m in _mounts(bare)) and not any(k in " ".join(bare) for k in JIT_ENV)


def test_the_key_is_the_content_a_digest_reference_first_and_never_a_tag(cache_home, monkeypatch):
    eng = FakeEngine({"img:1": "sha256:" + "b" * 64, "img:2": "sha256:" + "c" * 64})
    assert JitCache.key(eng, "reg/x@sha256:" + "d" * 64) == "d" * 64  # no daemon asked
    assert JitCache.key(eng, "img:1") != JitCache.key(eng, "img:2")
    assert _jit_mount(eng, "gone:1", ["gpu"]) == (None, {"off": "image not on this machine before the run"})
    monkeypatch.setenv("ENVBUILD_PROBE_JIT_CACHE", "0")
    assert _jit_mount(eng, "img:1", ["gpu"]) == (None, {"off": "ENVBUILD_PROBE_JIT_CACHE=0"})
    assert not cache_home.exists()


def test_an_unwritable_cache_costs_the_run_its_cache_not_its_verdict(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("ENVBUILD_CACHE", str(blocker / "cache"))  # mkdir fails under a file
    eng = FakeEngine({"img:1": "sha256:" + "a" * 64})
    d, info = _jit_mount(eng, "img:1", ["gpu"])
    assert d is None and info["off"].startswith("cache folder:")


def test_opening_one_image_s_folder_removes_folders_unused_for_weeks(cache_home):
    c = JitCache()
    old, recent = c.open("e" * 64)[0], c.open("f" * 64)[0]
    (old / "kernel.so").write_bytes(b"x")
    past = time.time() - (JIT_KEEP_DAYS + 1) * 86400
    os.utime(old, (past, past))
    d, info = c.open("0" * 64)
    assert not old.exists() and recent.is_dir() and d.is_dir() and info["files_before"] == 0
    (d / "k").mkdir()
    (d / "k" / "sampling.so").write_bytes(b"so")
    assert c.open("0" * 64)[1]["files_before"] == 1


# A stand-in for a JIT: the image's Python, at start, appends a line to where FlashInfer (under
# ~/.cache) and Triton (TRITON_CACHE_DIR) keep their kernels, and prints what each held before.
WRITES = (
    "import os\n"
    "for d in (os.path.expanduser('~/.cache/flashinfer'), os.environ.get('TRITON_CACHE_DIR')):\n"
    "    if not d:\n"
    "        continue\n"
    "    os.makedirs(d, exist_ok=True)\n"
    "    with open(os.path.join(d, 'kernel.txt'), 'a') as f:\n"
    "        f.write('compiled\\n')\n")


@pytest.fixture(scope="module")
def jit_images(tmp_path_factory):
    # a .pth line runs at every start (Debian's own sitecustomize.py shadows one in dist-packages)
    a = _site_image(tmp_path_factory, "probe-jit-a", {"jitwrite.py": WRITES, "jitwrite.pth": "import jitwrite\n"})
    b = _site_image(tmp_path_factory, "probe-jit-b", {"jitwrite.py": WRITES + "# another image\n",
                                                      "jitwrite.pth": "import jitwrite\n"})
    yield next(a), next(b)
    for g in (a, b):
        next(g, None)


@pytest.mark.docker
def test_a_second_gpu_probe_of_the_same_image_finds_what_the_first_compiled(jit_images, cache_home):
    a, b = jit_images

    def run(image, levels):
        out = probe_image_levels(image, levels=levels, engine="hf", expect={}, timeout=120, gpus=False, pull="never")
        return next(iter(out.values()))["runner"]

    first = run(a, ["env", "gpu"])
    assert first["jit_cache"]["files_before"] == 0, first
    folder = cache_home / first["jit_cache"]["key"]
    kernel = folder / "flashinfer" / "kernel.txt"
    # the container's root file system is read-only and /tmp a tmpfs: the folder is what survived
    assert kernel.read_text().count("compiled") >= 1 and (folder / "triton" / "kernel.txt").is_file()
    # One line per Python process the probe started that got as far as its site setup: a child the
    # probe stops early (the GPU-architecture read, when torch turns out to have no CUDA) may or may
    # not get there on a loaded machine, so the runs are compared by growth, not by equal counts.
    n = kernel.read_text().count("compiled")
    second = run(a, ["env", "gpu"])
    assert second["jit_cache"] == {"key": first["jit_cache"]["key"], "files_before": 2}
    m = kernel.read_text().count("compiled")
    assert m > n  # the second probe wrote into the same file: it found the first one's folder
    other = run(b, ["env", "gpu"])  # another image starts empty
    assert other["jit_cache"]["files_before"] == 0 and other["jit_cache"]["key"] != first["jit_cache"]["key"]
    cpu = run(a, ["env", "contract"])  # the CPU levels compile nothing and get no folder
    assert "jit_cache" not in cpu and kernel.read_text().count("compiled") == m
