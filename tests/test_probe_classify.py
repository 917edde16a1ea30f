"""Classification of real error messages (as broken stacks print them) and verdict folding."""

import pytest

from envbuild.probe.classify import classify_exception, classify_message
from envbuild.probe.verdict import Verdict, overall_status

CASES = [
    # (message, engine, status, cause, must appear in detail)
    ("ImportError: /opt/venv/lib/python3.11/site-packages/vllm/_C.abi3.so: undefined symbol: "
     "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs", "vllm", "fail", "undefined-symbol", "_ZN3c106detail14torchCheckFail"),
    ("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory", "vllm", "fail",
     "cuda-runtime-missing", "libcudart.so.12"),
    ("OSError: libnccl.so.2: cannot open shared object file: No such file or directory", "sglang", "fail",
     "cuda-runtime-missing", "libnccl.so.2"),
    ("ImportError: libcuda.so.1: cannot open shared object file: No such file or directory", "vllm", "needs-gpu",
     "no-driver", "libcuda.so.1"),
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
     "a driver from http://www.nvidia.com/Download/index.aspx", "vllm", "needs-gpu", "needs-gpu", "driver"),
    ("RuntimeError: Device string must not be empty", "vllm", "needs-gpu", "needs-gpu", "GPU"),
    # a ROCm torch on a host without an AMD GPU (issue 51: read as broken before)
    ("RuntimeError: No HIP GPUs are available", "vllm", "needs-gpu", "needs-gpu", "ROCm"),
    ("RuntimeError: HIP error: hipErrorNoDevice", "sglang", "needs-gpu", "needs-gpu", "ROCm"),
    # sgl-kernel on a host without a GPU (issue 26, class 13): it picks common_ops by the GPU it sees
    ("ImportError: \n[sgl_kernel] CRITICAL: Could not load any common_ops library!\n\nAttempted locations:\n"
     "1. Architecture-specific pattern: /opt/venv/lib/python3.12/site-packages/sgl_kernel/sm100/common_ops.* "
     "- found files: []", "sglang", "needs-gpu", "needs-gpu", "no GPU"),
    ("ImportError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.35' not found (required by "
     "/opt/venv/lib/python3.11/site-packages/vllm/_C.abi3.so)", "vllm", "fail", "glibc-too-old", "GLIBC_2.35"),
    ("ModuleNotFoundError: No module named 'sglang'", "vllm", "not-applicable", "other-engine", "sglang"),
    ("ModuleNotFoundError: No module named 'sglang'", "sglang", "fail", "module-missing", "sglang"),
    ("ModuleNotFoundError: No module named 'vllm'", "sglang", "not-applicable", "other-engine", "vllm"),
    ("ModuleNotFoundError: No module named 'megatron'", "vllm", "not-applicable", "optional-backend", "megatron"),
    ("ModuleNotFoundError: No module named 'vllm.worker.worker_base'", "vllm", "fail", "module-missing",
     "vllm.worker.worker_base"),
    ("ImportError: cannot import name 'ParallelConfig' from 'vllm.config' (/opt/venv/lib/python3.11/site-packages/"
     "vllm/config.py)", "vllm", "fail", "import-error", "ParallelConfig"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "sglang", "fail",
     "no-kernel-image", "architecture"),
    ("ModuleNotFoundError: No module named 'pkg_resources'", "vllm", "fail", "module-missing", "pkg_resources"),
]


@pytest.mark.parametrize("msg,engine,status,cause,needle", CASES)
def test_real_messages(msg, engine, status, cause, needle):
    c = classify_message(msg, engine)
    assert (c.status, c.cause) == (status, cause), c
    assert needle in c.detail


def test_undefined_symbol_is_demangled_when_cxxfilt_exists():
    import shutil
    if not shutil.which("c++filt"):
        pytest.skip("no c++filt")
    c = classify_message("undefined symbol: _ZN3c106detail14torchCheckFailEPKcS2_jRKSs", "vllm")
    assert "c10::detail::torchCheckFail" in c.detail


def test_exception_objects():
    try:
        import json_does_not_exist  # noqa: F401
    except ImportError as e:
        c = classify_exception(e, "vllm")
    assert (c.status, c.cause) == ("fail", "module-missing") and "json_does_not_exist" in c.detail
    c = classify_exception(ValueError("boom"), "hf")
    assert c.status == "fail" and "ValueError: boom" in c.detail


def test_overall_status_order():
    assert overall_status(["pass", "not-applicable", "skipped"]) == "pass"
    assert overall_status(["pass", "needs-gpu"]) == "needs-gpu"
    assert overall_status(["needs-gpu", "fail", "pass"]) == "fail"
    assert overall_status(["fail", "error"]) == "error"


def test_verdict_dict_names_first_cause():
    v = Verdict("contract", "vllm")
    v.add("a", "pass")
    v.add("b", "needs-gpu", cause="no-driver")
    v.add("c", "fail", cause="undefined-symbol")
    d = v.to_dict()
    assert d["status"] == "fail" and d["cause"] == "undefined-symbol" and len(d["checks"]) == 3


def test_exception_detail_names_where_it_was_raised():
    from envbuild.probe.classify import classify_exception

    def load_sampler():
        import envbuild_no_such_module_flashinfer  # noqa: F401

    try:
        load_sampler()
    except ImportError as e:
        c = classify_exception(e, "vllm")
    assert "envbuild_no_such_module_flashinfer" in c.detail
    assert "load_sampler" in c.detail and "test_probe_classify.py:" in c.detail


def test_a_failure_in_standard_library_frames_names_the_package_that_broke(tmp_path, monkeypatch):
    """Issue 26, class 14: an import that fails inside dataclasses' machinery (transformers' config
    code did this) names the innermost frame outside the standard library."""
    from envbuild.probe.classify import classify_exception

    pkg = tmp_path / "site-packages" / "brokenpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass Config:\n    items: list = []\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    try:
        import brokenpkg  # noqa: F401
    except ValueError as e:
        c = classify_exception(e, "hf")
    assert "[at brokenpkg/__init__.py:3 <module>, in the standard library below it: dataclasses.py:" in c.detail, \
        c.detail


def test_an_import_in_the_branch_taken_without_a_gpu_is_not_a_verdict(tmp_path, monkeypatch):
    """Issue 26, class 1: an engine module that imports another engine's CPU kernels only when no
    GPU is visible fails on a CPU host; a GPU host never runs that branch. The probe's import
    check says needs-gpu (cpu-only-branch) there, and still fails a plain broken import."""
    import importlib
    import sys

    from envbuild.probe.classify import device_branch
    from envbuild.probe.contract import _import_check
    from envbuild.probe.verdict import Verdict

    site = tmp_path / "site"
    (site / "eng2").mkdir(parents=True)
    (site / "eng2" / "__init__.py").write_text("")
    (site / "eng2" / "layers.py").write_text(
        "def is_cuda():\n    return False\n\n"
        "if not is_cuda():\n    from envbuild_other_engine._custom_ops import scaled_fp8_quant\n")
    (site / "eng2" / "broken.py").write_text("from envbuild_other_engine._custom_ops import scaled_fp8_quant\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    try:
        import eng2.layers  # noqa: F401
    except ImportError as e:
        assert device_branch(e) == "eng2/layers.py:5 (under `if not is_cuda()`)".replace("eng2/", str(site) + "/eng2/")
    v = Verdict(level="contract", engine="sglang")
    _import_check(v, "eng2.layers", "sglang", on_gpu=False)
    _import_check(v, "eng2.broken", "sglang", on_gpu=False)
    _import_check(v, "eng2.layers", "sglang", on_gpu=True)
    got = [(c.status, c.cause) for c in v.checks]
    assert got[0] == ("needs-gpu", "cpu-only-branch") and "if not is_cuda()" in v.checks[0].detail
    assert got[1][0] == "fail" and got[2][0] == "fail"
    for m in ("eng2", "eng2.layers", "eng2.broken"):
        sys.modules.pop(m, None)


def test_engine_class_says_the_import_error_it_met(tmp_path, monkeypatch):
    import pytest

    from envbuild.probe.engines import engine_class

    (tmp_path / "envbuild_home_breaks.py").write_text("from envbuild_missing_dep_inside import x\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def Engine(*a, **kw):  # a release that exports a factory
        pass
    with pytest.raises(ImportError, match="envbuild_missing_dep_inside"):
        engine_class(Engine, "envbuild_absent_home.x:Engine", "envbuild_home_breaks:Engine")
    with pytest.raises(AttributeError, match="no engine class"):
        engine_class(Engine, "json:NoSuchName")
    assert engine_class(Engine, "json:JSONDecoder") is __import__("json").JSONDecoder


def test_every_accelerator_kinds_no_device_words_mean_needs_gpu():
    """The words come from each AcceleratorKind (probe/hardware.py): a kind added there is classified
    with no edit here. Each pattern is tried on a message made from its first alternative."""
    import re

    from envbuild.probe.hardware import ACCELERATORS
    tried = 0
    for kind in ACCELERATORS.values():
        for pat, why in kind.no_device:
            sample = re.sub(r"\\(.)", r"\1", pat.split("|")[0]).replace("(?:", "").replace(")?", "")
            c = classify_message(f"RuntimeError: {sample}")
            assert (c.status, c.detail) == ("needs-gpu", why), (kind.name, pat, c)
            tried += 1
        if kind.driver_lib:
            c = classify_message(f"OSError: {kind.driver_lib}.so.1: cannot open shared object file")
            assert c.status == "needs-gpu" and kind.driver_label in c.detail
    assert tried >= 8
