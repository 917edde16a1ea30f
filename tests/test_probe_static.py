"""The static import contract and engine ownership on real wheels from the index: verl 0.4.1 with
the SGLang release its extra pins (0.4.6.post5) and with a later one (0.5.2) that moved names
verl 0.4.1 imports. Nothing of them is imported: the files' syntax trees are read."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.probe.contract import _static_checks, static_report
from envbuild.probe.ownership import applies, owner, verl_extras
from envbuild.probe.staticimports import ModuleIndex, check_module
from envbuild.probe.verdict import FAIL, NEEDS_GPU, PASS, Verdict

ROOT = Path(__file__).resolve().parent.parent


def _install(target: Path, *reqs: str) -> Path:
    """Real wheels, no dependencies, into a folder (what a site-packages holds)."""
    if not (target / ".done").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                        "--disable-pip-version-check", "--target", str(target), *reqs], check=True, timeout=600)
        (target / ".done").write_text("")
    return target


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    return _install(tmp_path_factory.mktemp("pinned"), "verl==0.4.1", "sglang==0.4.6.post5")


@pytest.fixture(scope="module")
def drifted(tmp_path_factory):
    return _install(tmp_path_factory.mktemp("drifted"), "verl==0.4.1", "sglang==0.5.2")


SGL_ROLLOUT = "verl.workers.rollout.sglang_rollout.sglang_rollout"


@pytest.mark.network
def test_pinned_pair_resolves(pinned):
    rep = static_report("sglang", [str(pinned)])
    assert SGL_ROLLOUT in rep["static"] and "verl.workers.sharding_manager.fsdp_sglang" in rep["static"]
    assert rep["static"][SGL_ROLLOUT]["checked"] >= 10  # the engine imports were really resolved
    assert {m: r["findings"] for m, r in rep["static"].items() if r["findings"]} == {}


@pytest.mark.network
def test_drifted_pair_names_both_sides(drifted):
    rep = static_report("sglang", [str(drifted)])
    finds = rep["static"][SGL_ROLLOUT]["findings"]
    got = {(f["line"], f["module"], f["name"]) for f in finds}
    # Real drift between verl 0.4.1 and SGLang 0.5.2 (openai_api moved; io_struct names no longer
    # re-exported by tokenizer_manager).
    assert (38, "sglang.srt.openai_api.protocol", "Tool") in got
    assert (33, "sglang.srt.managers.tokenizer_manager", "UpdateWeightsFromTensorReqInput") in got
    f = next(f for f in finds if f["name"] == "UpdateWeightsFromTensorReqInput")
    assert f["file"] == "verl/workers/rollout/sglang_rollout/sglang_rollout.py"
    assert f["where"].startswith("sglang/srt/managers/tokenizer_manager.py has no UpdateWeightsFromTensorReqInput")
    assert "defined in sglang/srt/managers/io_struct.py:" in f["where"]
    assert "sglang/srt has no openai_api" in next(f["where"] for f in finds if f["name"] == "Tool")
    # verl's try/except ImportError fallback (FunctionCallParser) is an alternative, not drift
    assert not any(f["name"] == "FunctionCallParser" for f in finds)


@pytest.mark.network
def test_import_wins_where_it_judged_and_static_decides_behind_a_gpu(drifted):
    rep = static_report("sglang", [str(drifted)])
    # The engine needs libcuda at import (CPU host): the import says needs-gpu, the static contract fails.
    v = Verdict(level="contract", engine="sglang")
    v.add(f"import:{SGL_ROLLOUT}", NEEDS_GPU, "libcuda.so.1 not found: needs the NVIDIA driver", "no-driver")
    _static_checks(v, rep)
    st = next(c for c in v.checks if c.name == f"static:{SGL_ROLLOUT}")
    assert st.status == FAIL and "sglang_rollout.py:38" in st.detail and v.status == "fail"
    # The import passed (say a name is made at run time): the import wins, the static note is beside it.
    v = Verdict(level="contract", engine="sglang")
    v.add(f"import:{SGL_ROLLOUT}", PASS)
    _static_checks(v, rep)
    st = next(c for c in v.checks if c.name == f"static:{SGL_ROLLOUT}")
    assert st.status == PASS and "import check judged it (pass)" in st.detail
    # The import failed: the static finding is shown in its detail.
    v = Verdict(level="contract", engine="sglang")
    v.add(f"import:{SGL_ROLLOUT}", FAIL, "ImportError: cannot import name 'Tool'", "import-error")
    _static_checks(v, rep)
    assert "static: verl/workers/rollout/sglang_rollout/sglang_rollout.py:38" in v.checks[0].detail
    assert next(c for c in v.checks if c.name == f"static:{SGL_ROLLOUT}").status == FAIL


@pytest.mark.network
def test_ownership_by_path_imports_and_extras(pinned):
    ix = ModuleIndex([str(pinned)])
    def installed(top):
        return ix.find(top) is not None
    extras = {"torch_memory_saver": "sglang", "mathruler": "geo"}
    # fsdp_vllm's import error in an hf stack says "vllm version None not supported and SGLang also
    # not Found": by error text it looked like a failure; by path it is vLLM's.
    for mod, eng in (("verl.workers.sharding_manager.fsdp_vllm", "vllm"),
                     ("verl.workers.rollout.vllm_rollout.vllm_rollout_spmd", "vllm"),
                     ("verl.third_party.sglang.parallel_state", "sglang")):
        o = owner(mod, ix, installed, extras)
        assert eng in o.engines, (mod, o)
        assert applies(o, "hf", installed)[:2] == (False, "other-engine")
        assert applies(o, eng, installed, "0.8.5" if eng == "vllm" else "0.4.6.post5")[0]
    o = owner("verl.workers.sharding_manager.megatron_vllm", ix, installed, extras)
    assert o.engines == {"vllm"} and "megatron" in o.backends
    assert applies(o, "vllm", installed)[1] == "optional-backend"
    o = owner("verl.utils.reward_score.geo3k", ix, installed, extras)  # imports mathruler: verl's extra "geo"
    assert o.extras == {"mathruler": "geo"}
    assert applies(o, "vllm", installed)[1] == "optional-dependency"
    # verl's copy of vLLM 0.5.4 internals applies only to that release
    o = owner("verl.third_party.vllm.vllm_v_0_5_4.worker", ix, installed, extras)
    assert applies(o, "vllm", installed, "0.5.4")[0]
    assert applies(o, "vllm", installed, "0.8.5")[1] == "other-engine-release"


def test_verl_extras_from_metadata(tmp_path, monkeypatch):
    di = tmp_path / "verl-0.4.1.dist-info"
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: verl\nVersion: 0.4.1\n"
                                 "Requires-Dist: tensordict<=0.6.2\nRequires-Dist: tensordict<=0.6.2; extra == \"sglang\"\n"
                                 "Requires-Dist: torch-memory-saver>=0.0.5; extra == \"sglang\"\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    importlib.invalidate_caches()
    assert verl_extras() == {"torch_memory_saver": "sglang"}  # tensordict is a base requirement too


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_resolution_rules(tmp_path):
    """Re-exports, __all__ on star imports, module __getattr__, extensions, guarded imports."""
    _write(tmp_path, "eng/__init__.py", "from .core import *\nfrom .lazy import Lazy\n")
    _write(tmp_path, "eng/core.py", "__all__ = ['Engine']\nclass Engine: pass\nclass Hidden: pass\n")
    _write(tmp_path, "eng/lazy.py", "def __getattr__(name):\n    return 1\n")
    _write(tmp_path, "eng/sub/__init__.py", "")
    (tmp_path / "eng" / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    _write(tmp_path, "user/__init__.py", "")
    _write(tmp_path, "user/mod.py", "\n".join([
        "from eng import Engine",            # 1: via star import + __all__
        "from eng import Hidden",            # 2: not in core's __all__: absent
        "from eng.lazy import Anything",     # 3: module __getattr__: present
        "from eng import sub, _C",           # 4: submodule and extension module
        "from eng._C import kernel",         # 5: names of an extension cannot be read: present
        "import eng.gone",                   # 6: no such module
        "try:",
        "    from eng import Old",           # 8: guarded by except ImportError
        "except ImportError:",
        "    Old = None",
        "def f():",
        "    from eng.core import Missing",  # 12: runs when called
        "",
    ]))
    ix = ModuleIndex([str(tmp_path)])
    finds, checked = check_module(ix, "user.mod", {"eng"})
    got = {(f.line, f.name, f.function) for f in finds}
    assert got == {(2, "Hidden", False), (6, None, False), (12, "Missing", True)}, finds
    assert checked == 8
    where = {f.line: f.where for f in finds}
    assert where[2].startswith("eng/__init__.py has no Hidden") and "eng/core.py:3" in where[2]
    assert where[6] == "no module eng.gone (eng has no gone)"


def test_probe_finds_drift_without_importing(tmp_path):
    """The whole probe (stdlib-only copy) on a folder it cannot import from (no torch here):
    the static contract still names the missing name on both sides."""
    _write(tmp_path, "site/verl/__init__.py", "import torch\n")
    _write(tmp_path, "site/verl/workers/__init__.py", "")
    _write(tmp_path, "site/verl/workers/rollout/__init__.py", "")
    _write(tmp_path, "site/verl/workers/rollout/vllm_rollout/__init__.py", "")
    _write(tmp_path, "site/verl/workers/rollout/vllm_rollout/spmd.py",
           "from vllm import LLM\nfrom vllm.worker.worker_base import WorkerWrapperBase\n")
    _write(tmp_path, "site/vllm/__init__.py", "raise ImportError('libcuda.so.1: cannot open shared object file')\n"
                                              "from vllm.entrypoints.llm import LLM\n")
    _write(tmp_path, "site/vllm/entrypoints/__init__.py", "")
    _write(tmp_path, "site/vllm/entrypoints/llm.py", "class LLM: pass\n")
    os.symlink(ROOT / "builder" / "probe", tmp_path / "envbuild_probe")
    out = tmp_path / "v.json"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{tmp_path / 'site'}"}
    subprocess.run([sys.executable, "-m", "envbuild_probe", "--level", "contract", "--engine", "vllm", "--json", str(out)],
                   env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    import json
    d = json.loads(out.read_text())
    st = {c["name"]: c for c in d["checks"]}
    c = st["static:verl.workers.rollout.vllm_rollout.spmd"]
    assert c["status"] == "fail" and c["level"] == "contract"
    assert "verl/workers/rollout/vllm_rollout/spmd.py:2 from vllm.worker.worker_base import WorkerWrapperBase" \
           in c["detail"] and "no module vllm.worker.worker_base (vllm has no worker)" in c["detail"]
    assert all(ch.get("level") in ("env", "contract") for ch in d["checks"])
