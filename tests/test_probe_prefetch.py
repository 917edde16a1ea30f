"""The probe's read-ahead (probe/prefetch.py): it asks for torch's libraries, the CUDA libraries they
link and no others, then the bytecode; the files its process asked for are in the page cache
afterwards; it is on by default on GPU nodes only. Libraries are real ELF files built here with gcc,
linked to each other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envbuild.probe import prefetch

if not shutil.which("gcc"):
    pytest.skip("needs gcc to build linked shared libraries", allow_module_level=True)


def _so(path: Path, *links: Path, size: int = 0) -> Path:
    """A real shared library that links `links` (DT_NEEDED by their file names)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    # A large constant makes the file big enough to tell its pages apart from a header's.
    src.write_text(f"const char pad[{max(size, 1)}] = {{1}};\nint f(void) {{ return pad[0]; }}\n")
    args = ["gcc", "-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(path), str(src)]
    for lib in links:
        args += [f"-L{lib.parent}", f"-l:{lib.name}"]
    subprocess.run(args, check=True, capture_output=True)
    src.unlink()
    return path


def _pyc(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * 64)
    return path


def _site(root: Path) -> tuple[Path, dict]:
    site = root / "site-packages"
    nv = site / "nvidia" / "cu13" / "lib"
    f = {}
    f["lt"] = _so(nv / "libcublasLt.so.13")
    f["blas"] = _so(nv / "libcublas.so.13", f["lt"])  # linked through another library only
    f["engine"] = _so(nv / "libcudnn_engines_precompiled.so.9", size=1 << 20)  # loaded on demand
    f["c10"] = _so(site / "torch" / "lib" / "libc10.so")
    f["cuda"] = _so(site / "torch" / "lib" / "libtorch_cuda.so", f["c10"], f["blas"], size=1 << 20)
    f["torch_pyc"] = _pyc(site / "torch" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc")
    f["other_pyc"] = _pyc(site / "torch" / "__pycache__" / "__init__.cpython-10.pyc")  # another Python's
    f["tf_pyc"] = _pyc(site / "transformers" / "__pycache__" / f"x.{sys.implementation.cache_tag}.pyc")
    f["tf_so"] = _so(site / "transformers" / "_ext.cpython-3.so")
    return site, f


def test_the_plan_is_torch_then_what_it_links_then_bytecode(tmp_path):
    site, f = _site(tmp_path)
    shadow = tmp_path / "shadow" / "site-packages"  # later on sys.path: never read
    _so(shadow / "torch" / "lib" / "libtorch_cpu.so")
    got = prefetch.plan([str(site), str(shadow)], ("transformers",))
    assert got[:2] == [str(f["cuda"]), str(f["c10"])]  # the larger first
    assert set(got[2:4]) == {str(f["blas"]), str(f["lt"])}
    assert got[4:] == [str(f["torch_pyc"]), str(f["tf_so"]), str(f["tf_pyc"])]
    assert str(f["engine"]) not in got and str(f["other_pyc"]) not in got


def test_a_library_that_is_not_elf_is_left_to_the_loader(tmp_path):
    site, f = _site(tmp_path)
    f["c10"].write_bytes(b"not an ELF file")
    got = prefetch.plan([str(site)], ())
    assert str(f["c10"]) in got and str(f["blas"]) in got
    assert prefetch.plan([str(tmp_path / "nothing")], ("transformers",)) == []


def _resident(path: Path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


@pytest.mark.skipif(not shutil.which("fincore"), reason="needs util-linux's fincore")
def test_its_process_reads_the_plan_ahead(tmp_path):
    site, f = _site(tmp_path)
    big = f["cuda"]
    for p in site.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.fsync(fd)  # written pages can't be dropped while dirty
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    if _resident(big) > big.stat().st_size // 2:
        pytest.skip("this filesystem keeps every page in memory (tmpfs)")
    done = prefetch.Prefetch(("transformers",), site=[str(site)], workers=3).result(wait=60)
    assert done is not None and done["files"] == 7 and done["seconds"] > 0
    deadline = time.monotonic() + 30
    while _resident(big) < big.stat().st_size and time.monotonic() < deadline:
        time.sleep(0.05)  # the reads it asked for may still be in flight
    assert _resident(big) >= big.stat().st_size  # whole pages
    assert _resident(f["engine"]) < f["engine"].stat().st_size  # not linked: not asked for


def test_a_read_ahead_still_running_when_the_probe_ends_is_stopped(tmp_path):
    lib = tmp_path / "site-packages" / "torch" / "lib"
    lib.mkdir(parents=True)
    os.mkfifo(lib / "libtorch_cpu.so")  # opening it blocks: a read-ahead that never ends
    ahead = prefetch.Prefetch((), site=[str(lib.parent.parent)])
    time.sleep(0.5)
    t0 = time.monotonic()
    assert ahead.result() is None
    assert time.monotonic() - t0 < 5 and ahead.proc.returncode is not None


def test_auto_is_on_a_gpu_node_and_one_process_per_node(monkeypatch):
    from envbuild.probe import sidebyside
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("ENVBUILD_PROBE_PREFETCH", raising=False)
    monkeypatch.setattr(sidebyside, "accelerator_node", lambda: False)
    assert not prefetch.wanted()
    assert prefetch.wanted("yes") and not prefetch.wanted("no")
    monkeypatch.setattr(sidebyside, "accelerator_node", lambda: True)
    assert prefetch.wanted()
    monkeypatch.setenv("ENVBUILD_PROBE_PREFETCH", "no")
    assert not prefetch.wanted()
    monkeypatch.setenv("ENVBUILD_PROBE_PREFETCH", "auto")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not prefetch.wanted()
