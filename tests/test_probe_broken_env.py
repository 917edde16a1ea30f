"""A deliberately broken environment is reported as such, with the cause named.

The fake environment is a folder put on PYTHONPATH: a verl-shaped package whose engine-facing
modules raise a real ImportError / need a GPU / need another engine, a native extension compiled
here with gcc whose undefined torch symbol the installed torch lacks (and one that needs a CUDA
runtime library that is nowhere), and a distribution with a requirement that is not installed.
"""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
if not shutil.which("g++"):
    pytest.skip("needs g++ to build the fake native extensions", allow_module_level=True)

from envbuild.probe.elfsyms import is_torch_symbol, read_elf  # noqa: E402
from envbuild.probe.extcheck import check_extensions  # noqa: E402

BAD_CPP = "namespace c10 { void envbuild_probe_missing(int); }\nextern \"C\" void f() { c10::envbuild_probe_missing(1); }\n"
GOOD_CPP = "namespace at { int get_num_threads(); }\nextern \"C\" int g() { return at::get_num_threads(); }\n"
CUDA_CPP = "extern \"C\" int cudaRuntimeGetVersion(int*);\nextern \"C\" int h() { int v; return cudaRuntimeGetVersion(&v); }\n"


def _gxx(out: Path, src: str, *extra: str) -> None:
    cpp = out.with_suffix(".cpp")
    cpp.write_text(src)
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(out), str(cpp), *extra], check=True, capture_output=True)
    cpp.unlink()


def _dist(site: Path, name: str, files: list[str], requires: list[str]) -> Path:
    di = site / f"{name}-0.1.dist-info"
    di.mkdir()
    meta = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 0.1", *[f"Requires-Dist: {r}" for r in requires]]
    (di / "METADATA").write_text("\n".join(meta) + "\n")
    (di / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    return di


def make_broken_site(root: Path) -> Path:
    site = root / "site"
    pkgs = {
        "verl/__init__.py": "",
        "verl/workers/__init__.py": "",
        "verl/workers/rollout/__init__.py": "",
        # API drift: a name the module needs is gone (a real ImportError)
        "verl/workers/rollout/broken_rollout.py": "from json import envbuild_gone_api\n",
        # verl 0.3's vllm_rollout did this at import: needs a GPU, not broken
        "verl/workers/rollout/gpu_rollout.py": "import torch\ntorch.cuda.get_device_name()\n",
        # another engine's module
        "verl/workers/rollout/sglang_rollout.py": "import sglang\n",
        # verl 0.4's async chat server imports `openai`, which verl does not declare: optional
        "verl/workers/rollout/chat_server.py": "import envbuild_undeclared_optional\n",
        # a dependency verl declares but that is missing: broken
        "verl/workers/rollout/declared_user.py": "import envbuild_declared_dep\n",
        # an installed package whose own import is broken: broken, even though verl doesn't declare it
        "verl/workers/rollout/inner_user.py": "import envbuild_inner_broken\n",
        "envbuild_inner_broken/__init__.py": "import envbuild_missing_inside_a_package\n",
        # verl.third_party.vllm asks for vLLM's metadata: with the hf engine, another engine's module
        "verl/workers/rollout/vllm_version.py": "from importlib.metadata import version\nversion('vllm')\n",
        # a vocabulary fetched at import by a client below Python (the audit hook never sees it)
        "verl/workers/rollout/native_vocab.py": (
            "import subprocess\n"
            "import os\n"
            "url = os.environ.get('ENVBUILD_TEST_VOCAB_URL', 'https://vocab.envbuild-probe.invalid/bpe.json')\n"
            "r = subprocess.run(['curl', '-sSf', '--max-time', '20', '-o', '/dev/null', url],\n"
            "                   capture_output=True, text=True)\n"
            "if r.returncode:\n"
            "    raise RuntimeError('could not download the vocabulary: ' + r.stderr.strip())\n"),
        "verl/workers/sharding_manager/__init__.py": "",
        "verl/workers/sharding_manager/fsdp_fake.py": "X = 1\n",
        "verl/utils/__init__.py": "",  # not engine-facing: never imported
        "verl/utils/never.py": "raise RuntimeError('must not be imported')\n",
        "fakeext/__init__.py": "",
    }
    for rel, text in pkgs.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    _gxx(site / "fakeext" / "_bad.so", BAD_CPP)
    _gxx(site / "fakeext" / "_good.so", GOOD_CPP)
    stub = root / "stub"  # a CUDA runtime of a major that exists nowhere once the stub is gone
    stub.mkdir()
    _gxx(stub / "libcudart.so.99", "extern \"C\" int cudaRuntimeGetVersion(int* v) { *v = 99; return 0; }\n",
         "-Wl,-soname,libcudart.so.99")
    _gxx(site / "fakeext" / "_cuda.so", CUDA_CPP, f"-L{stub}", "-l:libcudart.so.99")
    shutil.rmtree(stub)
    _dist(site, "fakeext", ["fakeext/__init__.py", "fakeext/_bad.so", "fakeext/_good.so", "fakeext/_cuda.so"],
          ["torch"])
    _dist(site, "fakereq", [], ["envbuild-nonexistent-dependency>=1"])
    _dist(site, "verl", ["verl/__init__.py"], ["envbuild-declared-dep>=1", "envbuild-undeclared-optional; extra == 'chat'"])
    return site


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory):
    return make_broken_site(tmp_path_factory.mktemp("broken"))


def test_elf_reader_sees_what_nm_sees(broken_site):
    bad = read_elf(str(broken_site / "fakeext" / "_bad.so"))
    torch_syms = {s for s in bad.undefined if is_torch_symbol(s)}
    assert torch_syms == {"_ZN3c1022envbuild_probe_missingEi"}
    if shutil.which("nm"):
        nm = subprocess.run(["nm", "-D", "--undefined-only", str(broken_site / "fakeext" / "_bad.so")],
                            capture_output=True, text=True, check=True).stdout
        assert "_ZN3c1022envbuild_probe_missingEi" in nm
    cuda = read_elf(str(broken_site / "fakeext" / "_cuda.so"))
    assert "libcudart.so.99" in cuda.needed
    assert any(v.startswith("GLIBC_") for vs in cuda.verneed.values() for v in vs) or cuda.verneed == {}


def test_extension_check_names_symbol_and_library(broken_site):
    dist = md.PathDistribution(broken_site / "fakeext-0.1.dist-info")
    rep = check_extensions([dist], installed=[dist])
    assert rep.scanned == {"fakeext": 3}
    kinds = {(p.kind, p.file) for p in rep.problems}
    assert kinds == {("undefined-symbol", "fakeext/_bad.so"), ("cuda-runtime-missing", "fakeext/_cuda.so")}
    sym = next(p for p in rep.problems if p.kind == "undefined-symbol")
    assert "envbuild_probe_missing" in sym.what
    assert next(p for p in rep.problems if p.kind == "cuda-runtime-missing").what == "libcudart.so.99"
    # the good extension's at::get_num_threads() is exported by the installed torch: no finding for it


def test_library_shipped_by_another_installed_package_is_not_missing(tmp_path):
    """A package that loads its own library at import (tvm_ffi, the nvidia-* wheels) makes it
    resolvable for extensions of other packages; a library nobody ships is still missing."""
    site = tmp_path / "site"
    (site / "shipper" / "lib").mkdir(parents=True)
    (site / "user").mkdir()
    _gxx(site / "shipper" / "lib" / "libshipped.so.1", 'extern "C" int shipped() { return 1; }\n',
         "-Wl,-soname,libshipped.so.1")
    _gxx(site / "user" / "_ext.so", 'extern "C" int shipped();\nextern "C" int u() { return shipped(); }\n',
         f"-L{site / 'shipper' / 'lib'}", "-l:libshipped.so.1")
    shipper = md.PathDistribution(_dist(site, "shipper", ["shipper/lib/libshipped.so.1"], []))
    user = md.PathDistribution(_dist(site, "user", ["user/_ext.so"], ["torch"]))
    assert check_extensions([user], installed=[user, shipper]).problems == []
    rep = check_extensions([user], installed=[user])
    assert [(p.kind, p.what) for p in rep.problems] == [("library-missing", "libshipped.so.1")]


def test_probe_reports_broken_environment(broken_site):
    from envbuild.probe_exec import probe_here
    v = probe_here(level="contract", engine="hf", expect={}, timeout=600,
                   extra_env={"PYTHONPATH": str(broken_site), "CUDA_VISIBLE_DEVICES": ""})
    checks = {c["name"]: c for c in v["checks"]}
    assert v["status"] == "fail", v
    c = checks["import:verl.workers.rollout.broken_rollout"]
    assert (c["status"], c["cause"]) == ("fail", "import-error") and "envbuild_gone_api" in c["detail"]
    c = checks["import:verl.workers.rollout.gpu_rollout"]
    assert c["status"] == "needs-gpu", c
    c = checks["import:verl.workers.rollout.sglang_rollout"]
    assert (c["status"], c["cause"]) == ("not-applicable", "other-engine")
    assert checks["import:verl.workers.sharding_manager.fsdp_fake"]["status"] == "pass"
    c = checks["import:verl.workers.rollout.chat_server"]
    assert (c["status"], c["cause"]) == ("not-applicable", "optional-dependency"), c
    c = checks["import:verl.workers.rollout.declared_user"]
    assert (c["status"], c["cause"]) == ("fail", "module-missing"), c
    c = checks["import:verl.workers.rollout.inner_user"]
    assert c["status"] == "fail" and "envbuild_missing_inside_a_package" in c["detail"], c
    c = checks["import:verl.workers.rollout.vllm_version"]
    assert (c["status"], c["cause"]) == ("not-applicable", "other-engine"), c
    assert not any("verl.utils" in n for n in checks)  # only engine-facing folders are imported
    c = checks["native:undefined-symbol"]
    assert c["status"] == "fail" and "fakeext/_bad.so" in c["detail"] and "envbuild_probe_missing" in c["detail"]
    assert "_good.so" not in c["detail"]
    c = checks["native:cuda-runtime-missing"]
    assert c["status"] == "fail" and "libcudart.so.99" in c["detail"]
    c = checks["pip-check"]
    assert c["status"] == "fail" and "envbuild-nonexistent-dependency" in c["detail"]
    assert v["runner"]["mode"] == "here" and v["runner"]["exit_code"] == 1
    # Issue 26, class 2: where the host allows a network namespace, the probe runs in one, so a
    # native client fails fast and the import is "works, needs network", naming what it reached.
    if v["runner"]["network"].startswith("none") and shutil.which("curl"):
        c = checks["import:verl.workers.rollout.native_vocab"]
        assert (c["status"], c["cause"]) == ("needs-network", "needs-network"), c
        assert any(cv["module"] == "verl.workers.rollout.native_vocab" for cv in v["caveats"])


def test_only_the_installed_torchs_library_variant_is_read(tmp_path):
    """A package that ships one library per torch release loads the installed torch's only
    (issue 26, class 13): the others are never loaded and not checked; the loaded one is."""
    tv = md.version("torch")
    mine = "torch{}{}".format(*tv.split(".")[:2])
    site = tmp_path / "site"
    (site / "perminor").mkdir(parents=True)
    files = []
    for tag in (mine, "torch24", "torch25"):
        _gxx(site / "perminor" / f"libaddon_{tag}-cpu.so", BAD_CPP)
        files.append(f"perminor/libaddon_{tag}-cpu.so")
    dist = md.PathDistribution(_dist(site, "perminor", files, ["torch"]))
    rep = check_extensions([dist], installed=[dist])
    assert rep.scanned == {"perminor": 1}
    assert [(p.kind, p.file) for p in rep.problems] == [("undefined-symbol", f"perminor/libaddon_{mine}-cpu.so")]
    assert rep.other_torch == {"perminor": ["perminor/libaddon_torch24-cpu.so", "perminor/libaddon_torch25-cpu.so"]}


def test_torch_variant_names():
    from envbuild.probe.extcheck import torch_variants
    paths = ["/s/p/libx_torch27-cuda.so", "/s/p/libx_torch28-cuda.so", "/s/p/libx_torch2.11-cuda.so",
             "/s/p/_C.so", "/s/q/libtorch_cuda.so", "/s/r/only_torch26.so"]
    kept, skipped = torch_variants(paths, "2.11.0+cu130")
    assert kept == ["/s/p/_C.so", "/s/q/libtorch_cuda.so", "/s/p/libx_torch2.11-cuda.so", "/s/r/only_torch26.so"]
    assert skipped == ["/s/p/libx_torch27-cuda.so", "/s/p/libx_torch28-cuda.so"]
    assert torch_variants(paths, None) == (paths, [])


@pytest.mark.network
def test_real_per_torch_release_package(tmp_path):
    """torch_c_dlpack_ext 0.1.5 ships libtorch_c_dlpack_addon_torch24…29-{cpu,cuda}.so. On the H200
    node (torch 2.11) its torch24 libraries were reported as undefined c10 symbols."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    "--target", str(tmp_path), "torch_c_dlpack_ext==0.1.5"], check=True, timeout=600)
    dist = next(md.distributions(path=[str(tmp_path)]))
    rep = check_extensions([dist], installed=[dist])
    tv = "torch{}{}".format(*md.version("torch").split(".")[:2])
    loaded = [f for f in (dist.files or ()) if tv in f.name and f.name.endswith(".so")]
    name = dist.metadata["Name"]
    assert len(rep.other_torch[name]) == 12 - len(loaded) and rep.scanned[name] == len(loaded)
    assert [p for p in rep.problems if p.kind == "undefined-symbol"] == []


@pytest.mark.network
def test_a_native_client_reaches_the_index_unless_the_probe_is_isolated(broken_site, monkeypatch):
    """The same import, fetching from a host this machine reaches (the configured package index):
    on the host's network it passes and nobody learns it needs the network; in the probe's network
    namespace it is needs-network. Only the namespace makes the caveat independent of the host."""
    from envbuild.index_config import default_index_url
    from envbuild.probe_exec import _netns_works, probe_here
    if not (_netns_works() and shutil.which("curl")):
        pytest.skip("no unprivileged network namespace or no curl here")
    env = {"PYTHONPATH": str(broken_site), "CUDA_VISIBLE_DEVICES": "", "ENVBUILD_TEST_VOCAB_URL": default_index_url() + "/"}
    got = {}
    for mode in ("host", "isolated"):
        monkeypatch.setenv("ENVBUILD_PROBE_NETWORK", mode)
        v = probe_here(level="contract", engine="hf", expect={}, timeout=600, extra_env=env)
        got[mode] = next(c for c in v["checks"] if c["name"] == "import:verl.workers.rollout.native_vocab")["status"]
    assert got == {"host": "pass", "isolated": "needs-network"}


def test_abi_flavour_and_torch_release_are_told_apart():
    """Issue 26, class 6: which side is wrong, from the symbols alone."""
    from envbuild.probe.extcheck import abi_diagnosis
    new = "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
    old = "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs"
    assert "pre-C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=0), torch with the C++11 one" in abi_diagnosis(old, {new}, None)
    assert "C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=1), torch without it" in abi_diagnosis(new, {old}, None)
    assert "built for another torch release" in abi_diagnosis("_ZN3c105Error4whatEv", {new}, None)
    assert abi_diagnosis("_ZN3c104Type3getEi", set(), "c10::Type::get(long)").startswith(
        "torch exports it as c10::Type::get(long): built for another torch release")


@pytest.mark.network
def test_a_real_extension_of_the_other_abi_flavour(tmp_path):
    """torchaudio 2.6.0 was built against torch 2.6 (the pre-C++11 ABI); the installed torch
    (2.7 and later on PyPI) has the C++11 ABI: each missing c10 symbol is demangled and says so."""
    import importlib.metadata as md
    if int(md.version("torch").split(".")[1]) < 7:
        pytest.skip("needs a torch with the C++11 ABI")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                    "--disable-pip-version-check", "--target", str(tmp_path), "--python-version", "3.11",
                    "torchaudio==2.6.0"], check=True, timeout=600)
    dist = next(md.distributions(path=[str(tmp_path)]))
    rep = check_extensions([dist], installed=[dist])
    sym = [p for p in rep.problems if p.kind == "undefined-symbol" and "torchCheckFail" in p.what]
    assert sym and "c10::detail::torchCheckFail(char const*" in sym[0].what
    assert "pre-C++11 string ABI (_GLIBCXX_USE_CXX11_ABI=0), torch with the C++11 one (=1)" in sym[0].what
