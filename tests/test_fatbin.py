"""GPU architecture coverage read from ELF fatbins, checked against NVIDIA's own cuobjdump on a real
CUDA library (both from NVIDIA's wheels on the package index)."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from envbuild.probe.fatbin import Coverage, parse_sm, read_coverage, scan, supported

WHEELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envbuild-tests" / "wheels"


def _wheel(name: str) -> Path:
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob(name.replace("-", "_") + "-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(WHEELS), name], check=True, timeout=900)
        found = sorted(WHEELS.glob(name.replace("-", "_") + "-*.whl"))
    return found[-1]


@pytest.fixture(scope="module")
def nvidia(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvidia")
    for name in ("nvidia-curand-cu12", "nvidia-cuda-cuobjdump"):
        with zipfile.ZipFile(_wheel(name)) as z:
            z.extractall(root)
    cuobjdump = next(root.rglob("bin/cuobjdump"))
    cuobjdump.chmod(0o755)
    return root, cuobjdump


def _cuobjdump_archs(exe: Path, lib: Path, what: str) -> set[int]:
    out = subprocess.run([str(exe), f"--list-{what}", str(lib)], capture_output=True, text=True, check=True).stdout
    return {int(m) for m in re.findall(r"\.sm_(\d+)a?\.(?:cubin|ptx)", out)}


@pytest.mark.network
def test_reader_agrees_with_cuobjdump_on_a_real_cuda_library(nvidia):
    root, exe = nvidia
    lib = next(root.rglob("libcurand.so*"))
    cov = read_coverage(lib)
    assert cov.sass == _cuobjdump_archs(exe, lib, "elf") and cov.sass
    assert cov.ptx == _cuobjdump_archs(exe, lib, "ptx")
    found = scan(root)
    assert any(k.endswith(lib.name) for k in found)  # the scanner finds it; cuobjdump itself has no kernels
    assert not any("cuobjdump" in k for k in found)


def test_compatibility_rules_and_gpu_names():
    hopper_only = Coverage(sass={90})
    assert hopper_only.runs_on(90) and not hopper_only.runs_on(100) and not hopper_only.runs_on(89)
    ampere = Coverage(sass={80})
    assert ampere.runs_on(86) and ampere.runs_on(89) and not ampere.runs_on(90)  # same major only
    ptx = Coverage(sass={80}, ptx={80})
    assert ptx.runs_on(90) and ptx.runs_on(120)  # JIT from PTX for any later GPU
    # Issue 26, class 11: an sm_100 cubin may be sm_100a (arch-specific, B200 only); B300 is sm_103.
    # Without PTX it is not counted for B300; with compute_100 PTX it is.
    blackwell = Coverage(sass={100})
    assert blackwell.runs_on(100) and not blackwell.runs_on(103)
    assert Coverage(sass={100}, ptx={100}).runs_on(103)
    # ... and once its flags say it is not arch-specific, a plain or family sm_100 cubin runs on 10.3
    assert Coverage(sass={100}, portable={100}).runs_on(103) and not Coverage(sass={100}, portable={100}).runs_on(120)
    assert parse_sm("H200") == 90 and parse_sm("GB200") == 100 and parse_sm("B300") == 103
    assert parse_sm("sm_90") == parse_sm("9.0") == parse_sm("sm_90a") == parse_sm("compute_90") == 90
    assert parse_sm("banana") is None
    # what nvidia-smi's compute_cap prints, as the host's GPU listing reads it (hardware.CUDA_KIND)
    from envbuild.probe.hardware import CUDA_KIND

    assert CUDA_KIND.arch_number("10.3") == 103 and CUDA_KIND.arch_number("9.0") == 90
    assert CUDA_KIND.arch_number("[N/A]") is None
    ok, missing = supported({"a.so": hopper_only, "b.so": ptx}, [80, 90, 100])
    assert ok == [90] and missing == {80: ["a.so"], 100: ["a.so"]}


FIXTURES = Path(__file__).parent / "fatbin"  # tests/fatbin/make.sh: one kernel, built with nvcc 13.0


def test_a_cubins_flags_say_whether_it_is_arch_specific():
    """The entry header's flags, compressed (as wheels ship) or not: plain and family cubins run on
    the later GPUs of their major (sm_100 on the B300, 10.3; sm_120 on 12.1), sm_XYa ones on their
    own GPU only."""
    plain, raw = read_coverage(FIXTURES / "plain.so"), read_coverage(FIXTURES / "plain-uncompressed.so")
    assert plain == raw and plain.sass == plain.portable == {80, 90, 100, 120} and not plain.ptx
    assert [cc for cc in (80, 86, 89, 90, 100, 103, 110, 120, 121) if plain.runs_on(cc)] == [80, 86, 89, 90, 100, 103,
                                                                                              120, 121]
    specific = read_coverage(FIXTURES / "arch-specific.so")
    assert specific.sass == {90, 100} and not specific.portable
    assert [cc for cc in (90, 100, 103) if specific.runs_on(cc)] == [90, 100]
    assert specific.to_dict()["sass"] == ["sm_90a", "sm_100a"] and plain.to_dict()["sass"][-1] == "sm_120"
    family = read_coverage(FIXTURES / "family.so")
    assert family.sass == family.portable == {100, 120} and family.runs_on(103) and family.runs_on(121)
    ok, missing = supported({"p.so": plain, "a.so": specific}, [90, 100, 103])
    assert ok == [90, 100] and missing == {103: ["a.so"]}


@pytest.mark.network
def test_arch_specific_cubins_are_the_ones_cuobjdump_names_so(nvidia):
    _, exe = nvidia
    for name in ("plain", "arch-specific", "family"):
        lib = FIXTURES / f"{name}.so"
        cov = read_coverage(lib)
        out = subprocess.run([str(exe), "--list-elf", str(lib)], capture_output=True, text=True, check=True).stdout
        assert cov.sass == {int(m) for m in re.findall(r"\.sm_(\d+)a?\.cubin", out)}, out
        assert cov.sass - cov.portable == {int(m) for m in re.findall(r"\.sm_(\d+)a\.cubin", out)}, out


def test_a_library_linked_from_elsewhere_is_read_once_and_a_soname_link_not_twice(tmp_path):
    """A venv built in place links the node's torch libraries (envbuild venv --host-packages): those
    links are the venv's kernels, and were skipped as soname aliases, so the image's kernel step
    read no architecture at all on the lent H100; a soname link to a file beside it is that file."""
    node, venv = tmp_path / "node" / "lib", tmp_path / "venv" / "lib"
    node.mkdir(parents=True)
    venv.mkdir(parents=True)
    (node / "libtorch_cuda.so").write_bytes((FIXTURES / "plain.so").read_bytes())
    (venv / "libtorch_cuda.so").symlink_to(node / "libtorch_cuda.so")
    (venv / "libkern.so.1").write_bytes((FIXTURES / "family.so").read_bytes())
    (venv / "libkern.so").symlink_to("libkern.so.1")
    got = scan(venv)
    assert sorted(got) == ["libkern.so.1", "libtorch_cuda.so"]
    assert got["libtorch_cuda.so"].sass == {80, 90, 100, 120}


def test_files_without_kernels_are_empty(tmp_path):
    (tmp_path / "x.so").write_bytes(b"\x7fELF" + b"\0" * 200)
    (tmp_path / "y.so.1").write_bytes(b"not an elf")
    assert read_coverage(tmp_path / "x.so").empty() and read_coverage(tmp_path / "y.so.1").empty()
    assert scan(tmp_path) == {}
    assert read_coverage(sys.executable).empty()


@pytest.mark.network
def test_nvidia_libraries_are_shown_but_not_judged(nvidia, tmp_path):
    from envbuild.probe.fatbin import image_coverage

    root, _ = nvidia
    site = tmp_path / "site-packages"
    lib = next(root.rglob("libcurand.so*"))
    (site / "nvidia" / "curand" / "lib").mkdir(parents=True)
    os.link(lib, site / "nvidia" / "curand" / "lib" / lib.name)  # a real CUDA library, no copy
    cov = image_coverage([str(site)])
    assert "nvidia/curand" in cov["packages"] and cov["judged"] == []  # shown, not judged
    assert "sm_90" in cov["supports"] and cov["lacking"] == {}


def _curand_site(nvidia, tmp_path) -> Path:
    root, _ = nvidia
    site = tmp_path / "site-packages"
    lib = next(root.rglob("libcurand.so*"))
    (site / "nvidia" / "curand" / "lib").mkdir(parents=True)
    os.link(lib, site / "nvidia" / "curand" / "lib" / lib.name)
    return site


class _Torch:  # what env's gpu-arch check reads of torch
    def __init__(self, cuda):
        self.version = type("version", (), {"cuda": cuda})


@pytest.mark.network
def test_env_reads_the_coverage_in_a_child_with_the_same_answer(nvidia, tmp_path, monkeypatch):
    # env_level starts the read beside torch's import; a child that breaks is read again in-process.
    import time

    from envbuild.probe import env_level
    from envbuild.probe.fatbin import image_coverage
    from envbuild.probe.verdict import Verdict

    site = _curand_site(nvidia, tmp_path)
    monkeypatch.setattr(env_level, "site_roots", lambda: [str(site)])
    want = image_coverage([str(site)])
    assert "sm_90" in want["supports"]
    monkeypatch.setattr(env_level, "dist_version", lambda name: "2.11.0+cpu")
    assert env_level._start_gpu_arch() is None  # a CPU build of torch: no child
    monkeypatch.setattr(env_level, "dist_version", lambda name: "2.11.0")
    child = env_level._start_gpu_arch()
    assert child is not None and child[0].args[-1] == str(site)
    v = Verdict(level="env", engine="hf", expect={})
    env_level._check_gpu_arch(v, _Torch("13.0"), child)
    assert v.hardware["gpu_arch"] == want and v.checks[-1].status == "pass"
    broken = subprocess.Popen([sys.executable, "-c", "print('{half'); raise SystemExit(3)"],
                              stdout=subprocess.PIPE, text=True)
    assert env_level._coverage((broken, time.perf_counter())) == want


def test_a_cpu_torch_stops_the_coverage_child():
    import time

    from envbuild.probe import env_level
    from envbuild.probe.verdict import Verdict

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    v = Verdict(level="env", engine="hf", expect={})
    t0 = time.perf_counter()
    env_level._library_checks(v, _Torch(None), env_level.torch_variant(_Torch(None)), (child, t0))
    assert child.returncode is not None and time.perf_counter() - t0 < 10
    assert (v.checks[-1].name, v.checks[-1].status) == ("gpu-arch", "not-applicable")
