"""Kernels compiled ahead of time in images (probe/jit.py): which targets cover torch's kernels,
and the build step against a stand-in library whose JIT builder records what it was asked for.
The real FlashInfer build (nvcc, 53 s for sm_90a here) and its effect on an H100 (99.4 s -> 0.2 s)
are in bench/verl_step/sglang_h100.json."""

from __future__ import annotations

import os
import textwrap

import pytest

from envbuild.probe import jit
from envbuild.probe.vocab import JIT_KERNELS, JitKernel


def test_targets_run_wherever_torchs_kernels_run():
    cu13 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_103", "sm_120"]
    assert jit.targets(cu13, (13, 0)) == (["7.5", "8.0", "8.6", "9.0a", "10.0f", "10.3f", "12.0f"], "")
    # a plain sm_100 cubin of torch runs on 10.3 too: without family targets nothing is built
    got, why = jit.targets(["sm_80", "sm_90", "sm_100"], (12, 8))
    assert got == [] and "sm_100" in why and "12.9" in why
    assert jit.targets(["sm_80", "sm_90"], (12, 6)) == (["8.0", "9.0a"], "")
    assert jit.targets([], (13, 0)) == ([], "")
    # PTX in torch's list: torch runs on GPUs after it too, a prebuilt module would not
    got, why = jit.targets(["sm_80", "sm_90", "compute_90"], (13, 0))
    assert got == [] and "compute_90" in why


@pytest.fixture
def fake_library(tmp_path, monkeypatch):
    """A library `fakefi` (distribution fakefi-python) whose JIT builder writes a module naming the
    architectures it was given, and an nvcc that says which CUDA it is."""
    site = tmp_path / "site"
    (site / "fakefi" / "jit").mkdir(parents=True)
    (site / "fakefi" / "__init__.py").write_text("")
    (site / "fakefi" / "jit" / "__init__.py").write_text("")
    (site / "fakefi" / "jit" / "sampling.py").write_text(textwrap.dedent("""
        import os, pathlib
        class Spec:
            jit_library_path = pathlib.Path(os.environ["FAKEFI_WS"]) / "sampling.so"
            def build(self, verbose):
                if os.environ.get("FAKEFI_FAIL"):
                    raise SystemExit("nvcc fatal: unsupported gpu architecture")
                self.jit_library_path.write_text("archs=" + os.environ["FAKEFI_ARCHS"]
                                                 + " threads=" + os.environ.get("FAKEFI_THREADS", "-"))
        def gen_sampling_module():
            return Spec()
    """))
    (site / "fakefi_python-0.6.12.dist-info").mkdir()
    (site / "fakefi_python-0.6.12.dist-info" / "METADATA").write_text("Name: fakefi-python\nVersion: 0.6.12\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (bin_ / "nvcc").chmod(0o755)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    k = JitKernel("fake-sampling", "fakefi-python", "fakefi.jit.sampling", "gen_sampling_module", "data/aot",
                  "sampling", "FAKEFI_ARCHS", "FAKEFI_WS", "fakefi_jit_cache", "a test", "FAKEFI_THREADS")
    monkeypatch.setitem(jit.KERNEL, k.name, k)
    return site, bin_, k


def test_the_build_step_puts_one_module_for_all_of_torchs_architectures_where_the_library_loads_it(fake_library):
    site, _, k = fake_library
    said = jit.build([k.name], archs=["sm_80", "sm_90", "sm_100"])
    module = site / "fakefi" / "data" / "aot" / "sampling" / "sampling.so"
    assert module.read_text().startswith("archs=8.0 9.0a 10.0f threads=")
    assert said[k.name].startswith("fakefi-python 0.6.12 for 8.0 9.0a 10.0f in ")


@pytest.mark.parametrize("cpus, threads", [(2, "1"), (4, "2"), (16, "3"), (1, "1")])
def test_nvcc_compiles_several_architectures_at_once_where_cores_are_idle(fake_library, monkeypatch, cpus, threads):
    """nvcc --threads (FlashInfer's FLASHINFER_NVCC_THREADS): one nvcc per source file compiled its
    targets one by one, 411 s for six on the lent H100's 16 cores; two at once took 84.3 s against
    142.5 s, one source at a time on the two cores here (bench/jit_threads.json)."""
    site, _, k = fake_library
    monkeypatch.setattr(jit.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    jit.build([k.name], archs=["sm_80", "sm_90", "sm_100"])
    assert (site / "fakefi" / "data" / "aot" / "sampling" / "sampling.so").read_text().endswith(f"threads={threads}")
    monkeypatch.setenv("FAKEFI_THREADS", "5")  # the user's own setting wins
    jit.build([k.name], archs=["sm_80", "sm_90", "sm_100"])
    assert (site / "fakefi" / "data" / "aot" / "sampling" / "sampling.so").read_text().endswith("threads=5")


def test_all_or_nothing_a_kernel_that_cannot_cover_torch_is_not_placed(fake_library, monkeypatch, capsys):
    site, bin_, k = fake_library
    module = site / "fakefi" / "data" / "aot" / "sampling" / "sampling.so"
    # a toolkit without family targets, torch with sm_100 kernels
    (bin_ / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    assert "family targets need 12.9" in jit.build([k.name], archs=["sm_90", "sm_100"])[k.name]
    # the library's builder fails (one architecture it cannot build): nothing is placed
    (bin_ / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    monkeypatch.setenv("FAKEFI_FAIL", "1")
    assert "unsupported gpu architecture" in jit.build([k.name], archs=["sm_90"])[k.name]
    # no nvcc anywhere
    monkeypatch.delenv("FAKEFI_FAIL")
    (bin_ / "nvcc").unlink()
    monkeypatch.setattr(jit, "nvcc", lambda: None)
    assert "no nvcc" in jit.build([k.name], archs=["sm_90"])[k.name]
    assert not module.exists()
    # each outcome is one line on stdout, for the build log
    assert all(line.startswith("jit: fake-sampling: ") for line in capsys.readouterr().out.splitlines())


def test_the_librarys_own_ahead_of_time_package_wins(fake_library):
    site, _, k = fake_library
    (site / "fakefi_jit_cache").mkdir()
    (site / "fakefi_jit_cache" / "__init__.py").write_text("")
    assert "fakefi_jit_cache" in jit.build([k.name], archs=["sm_90"])[k.name]
    assert not (site / "fakefi" / "data" / "aot").exists()


def test_the_module_is_stripped_of_what_differs_from_build_to_build(tmp_path):
    """nvcc's temporary file names (tmpxft_<pid>_...) end up in static symbols; the exported ones
    stay, so the library still finds its functions."""
    import shutil
    import subprocess
    if not (shutil.which("gcc") and shutil.which("strip") and shutil.which("readelf")):
        pytest.skip("needs gcc and binutils")
    outs = []
    for pid in ("00001b4d", "00002c5e"):  # two builds: the static name differs as nvcc's does
        src = tmp_path / f"m{pid}.c"
        src.write_text(f"static int tmpxft_{pid}_init(void) {{ return 1; }}\n"
                       f"int exported(void) {{ return tmpxft_{pid}_init(); }}\n")
        so = tmp_path / f"m{pid}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(so), str(src)], check=True)
        assert "tmpxft_" in subprocess.run(["readelf", "-s", str(so)], capture_output=True, text=True).stdout
        assert jit.reproducible(so)
        syms = subprocess.run(["readelf", "--dyn-syms", "-s", str(so)], capture_output=True, text=True).stdout
        assert "tmpxft_" not in syms and "exported" in syms
        outs.append(so)
    assert outs[0].read_bytes() != b"" and jit.reproducible(tmp_path / "missing.so") is False


def test_a_step_that_breaks_never_fails_the_image(monkeypatch, capsys):
    def boom(*a, **k):
        raise OSError("torch/lib: Input/output error")
    monkeypatch.setattr(jit, "build", boom)
    assert jit.main(["build", "flashinfer-sampling"]) == 0
    assert capsys.readouterr().out.startswith("jit: not built (OSError: torch/lib: Input/output error)")


def test_the_command_line_refuses_an_unknown_kernel_and_names_the_known_ones(capsys):
    assert jit.main(["build", "nope"]) == 2
    assert "flashinfer-sampling" in capsys.readouterr().err
    assert jit.main([]) == 2
    assert {k.name for k in JIT_KERNELS} == {"flashinfer-sampling"}


@pytest.mark.network
def test_torchs_architectures_are_read_from_its_libraries_without_a_gpu(tmp_path, monkeypatch):
    """torch.cuda.get_arch_list() is [] on a machine without a GPU (an image build): the list comes
    from the fatbins of torch's libraries. A real CUDA library (NVIDIA's cuRAND wheel) stands in
    for libtorch_cuda.so."""
    import subprocess
    import sys
    import zipfile

    from envbuild.probe.fatbin import read_coverage
    from test_fatbin import WHEELS

    site = tmp_path / "site"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('torch is never imported here')\n")
    # test_fatbin's copy when it is there; else one of our own (no two workers write one file)
    wheel = next(iter(sorted(WHEELS.glob("nvidia_curand_cu12-*.whl"))), None)
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(tmp_path / "w"), "nvidia-curand-cu12"], check=True, timeout=900)
        wheel = next((tmp_path / "w").glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if "/libcurand.so" in n)
        (site / "torch" / "lib" / "libtorch_cuda.so").write_bytes(z.read(name))
    monkeypatch.syspath_prepend(str(site))
    cov = read_coverage(site / "torch" / "lib" / "libtorch_cuda.so")
    got = jit.torch_archs()
    assert got == [f"sm_{a}" for a in sorted(cov.sass)] + [f"compute_{a}" for a in sorted(cov.ptx)]
    assert got and all(a.startswith(("sm_", "compute_")) for a in got)


def test_an_in_place_venv_compiles_the_kernels_its_lock_pins_as_an_image_does(tmp_path, monkeypatch):
    """`envbuild venv` asks the same question as the render (vocab.jit_kernels_for) and runs the
    image's step with the venv's own Python: here a venv holding a stand-in flashinfer-python and no
    torch, so the step runs there, finds the library, and places nothing (torch lists no
    architecture, or no nvcc): one line per kernel, the venv still made."""
    import subprocess
    import sys

    from envbuild.materialize import _compile_kernels
    from envbuild.probe.vocab import jit_kernels_for

    assert jit_kernels_for(["Flashinfer_Python", "torch"]) == ["flashinfer-sampling"]
    assert jit_kernels_for(["torch", "vllm"]) == []
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*")) / "site-packages"
    (site / "flashinfer").mkdir()
    (site / "flashinfer" / "__init__.py").write_text("")
    di = site / "flashinfer_python-0.6.12.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.6.12\n")
    said = _compile_kernels(venv, ["flashinfer-sampling"])
    assert list(said) == ["flashinfer-sampling"]
    assert said["flashinfer-sampling"].startswith("not built: ") and "not installed" not in said["flashinfer-sampling"]
    assert not (site / "flashinfer" / "data").exists(), said
    assert _compile_kernels(venv, []) == {}
