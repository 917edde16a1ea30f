"""Version guards and reachability in the static contracts (issue 26, class 3): code verl keeps for
other engine releases is not drift of the installed one; a miss behind a guard envbuild cannot
evaluate is a caveat, not a failure. Synthetic modules for the rules, real verl 0.9.1 with its
pinned vLLM 0.24.0 for the case seen on the H200 node."""

import ast
import textwrap
from pathlib import Path

import pytest

from test_probe_static import _install  # real wheels, no dependencies, into a folder

from envbuild.probe.contract import _static_checks, static_report
from envbuild.probe.gates import DEAD, GATED, LIVE, NOT_A_GUARD, Guards, compare, reachability
from envbuild.probe.staticimports import ModuleIndex, check_module
from envbuild.probe.verdict import PASS, Verdict
from envbuild.probe.vocab import VERSION_GATED


def guards(src: str, **have):
    return Guards(ast.parse(textwrap.dedent(src)), lambda p: have.get(p), {"vllm", "torch", "sglang"})


def test_version_order():
    assert compare("0.24.0", "0.20.0") == 1 and compare("0.20", "0.20.0") == 0
    assert compare("2.11.0+cu130", "2.11") == 0 and compare("0.20.0rc1", "0.20.0") == -1
    assert compare("0.5.8.post1", "0.5.8") == 0 and compare("x", "1") is None


@pytest.mark.parametrize("test,want", [
    ('vllm_version >= version.parse("0.20.0")', True),
    ('version.parse(vllm.__version__) < version.parse("0.11")', False),
    ('_VLLM < version.parse("0.22.0")', False),
    ('_get() >= vs.parse("0.19.0")', True),
    ('importlib.metadata.version("vllm") == "0.24.0"', True),
    ('version.parse(torch.__version__) >= version.parse("2.7.0")', True),
    ('not (version.parse(sglang.__version__) >= version.parse("0.5.7"))', None),  # sglang: no version known
    ('is_npu and vllm_version >= version.parse("0.30")', False),
    ('is_npu and vllm_version >= version.parse("0.20")', NOT_A_GUARD),  # decided by is_npu
    ('fsdp_version(model) == 2', NOT_A_GUARD),  # not a package's version
    ('is_version_ge(pkg="vllm", minver="0.25.0")', None),  # a version test it does not evaluate
])
def test_guards_are_evaluated_against_installed_versions(test, want):
    g = guards("""
        import vllm
        _VLLM = version.parse(vllm.__version__)
        def _get():
            "doc"
            return version.parse(importlib.metadata.version("vllm"))
    """, vllm="0.24.0", torch="2.11.0+cu130")
    assert g.test(ast.parse(test, mode="eval").body) == want


def test_reachability_follows_uses_through_functions():
    uses = [("a", DEAD, None), ("b", LIVE, "a"), ("c", GATED, None), ("d", LIVE, None), ("d", DEAD, None)]
    r = reachability({"a", "b", "c", "d", "e"}, uses, lambda f: False)
    assert r == {"a": DEAD, "b": DEAD, "c": GATED, "d": LIVE, "e": LIVE}  # e: used nowhere, someone may call it
    assert reachability({"a"}, uses, lambda f: f == "a") == {"a": LIVE}  # named by another module


def _tree(tmp_path: Path, version: str) -> ModuleIndex:
    """A stand-in engine at `version` and a verl-like module that keeps code for two releases."""
    (tmp_path / "eng").mkdir(exist_ok=True)
    (tmp_path / "eng" / "__init__.py").write_text("__version__ = 'x'\n")
    (tmp_path / "eng" / "new.py").write_text("def fast():\n    pass\n")
    (tmp_path / f"eng-{version}.dist-info").mkdir(exist_ok=True)
    (tmp_path / f"eng-{version}.dist-info" / "METADATA").write_text(f"Name: eng\nVersion: {version}\n")
    (tmp_path / "user").mkdir(exist_ok=True)
    (tmp_path / "user" / "__init__.py").write_text("")
    (tmp_path / "user" / "mod.py").write_text(textwrap.dedent("""
        from packaging import version
        import importlib.metadata

        def _for_old(layer):
            from eng.old import slow          # gone from eng 2.x
            return slow(layer)

        def _for_older(layer):
            from eng.older import slower
            return slower(layer)

        def pick(eng_version):
            if eng_version >= version.parse("2.0"):
                from eng.new import fast
                return fast
            return _for_old                  # after the early return: only for eng < 2.0

        def other():
            if is_eng_version_at_least("1.5"):
                return _for_older            # a version test it cannot evaluate
            return None

        if version.parse(importlib.metadata.version("eng")) < version.parse("2.0"):
            from eng.legacy import thing     # module level, old releases only
    """))
    return ModuleIndex([str(tmp_path)], known={"eng"})


def test_code_for_other_releases_is_not_read(tmp_path):
    ix = _tree(tmp_path, "2.1")
    finds, checked = check_module(ix, "user.mod", {"eng"})
    assert checked == 2  # eng.new.fast (the branch the installed release takes) and the gated one
    assert [(f.name, f.gated) for f in finds] == [("slower", True)]
    assert {u.split(":")[0] for u in ix.unreachable} == {"user/mod.py"} and len(ix.unreachable) == 2


def test_an_old_release_reads_the_old_code(tmp_path):
    ix = _tree(tmp_path, "1.2")
    finds, _ = check_module(ix, "user.mod", {"eng"})
    got = {f.name: f.gated for f in finds}
    # eng.old / eng.legacy do not exist in the stand-in: real misses for this release now.
    assert got == {"slow": False, "thing": False, "slower": True}


def test_a_gated_miss_is_a_caveat_not_a_failure(tmp_path):
    ix = _tree(tmp_path, "2.1")
    finds, checked = check_module(ix, "user.mod", {"eng"})
    v = Verdict(level="contract", engine="vllm")
    _static_checks(v, {"targets": ["eng"], "static": {"user.mod": {
        "checked": checked, "unreachable": ix.unreachable,
        "findings": [f.__dict__ for f in finds]}}})
    assert v.status == PASS and v.checks[-1].status == PASS
    assert [c["kind"] for c in v.caveats] == [VERSION_GATED] and "eng.older" in v.caveats[0]["what"]


@pytest.mark.network
def test_verl_091_with_its_pinned_vllm(tmp_path_factory):
    """verl 0.9.1 keeps vLLM 0.18–0.19 FP8 code (`…_for_vllm14`, selected when vllm < 0.20) beside
    the 0.20+ one; with vLLM 0.24.0 the old code's imports are absent but never run. On the H200
    node it was reported as drift; now it is listed as unread, while real drift stays reported."""
    site = _install(tmp_path_factory.mktemp("verl091"), "verl==0.9.1", "vllm==0.24.0")
    rep = static_report("vllm", [str(site)])
    fp8 = rep["static"]["verl.utils.vllm.vllm_fp8_utils"]
    assert fp8["findings"] == []
    assert "verl/utils/vllm/vllm_fp8_utils.py:315" in fp8["unreachable"]
    assert fp8["checked"] >= 2  # the >= 0.20 branch's imports are read now (they were skipped as conditional)
    # verl 0.9.1's NVFP4 QAT paths import names vLLM 0.24.0 moved: reachable, so still failures.
    qat = rep["static"]["verl.utils.qat.vllm_patch"]["findings"]
    assert [(f["name"], f["gated"]) for f in qat] == [("swizzle_blockscale", False)]
    # The call-signature contract (class 5) on the same wheels: verl 0.9.1 passes shared_experts=
    # to vLLM 0.24.0's make_nvfp4_moe_kernel, which has no such parameter; nothing else in the
    # engine-facing modules is reported.
    calls = [(m, c["line"], c["problem"]) for m, r in rep["static"].items() for c in r["calls"]]
    assert calls == [("verl.utils.modelopt.vllm_modelopt_patch", 435, "no parameter 'shared_experts'")]
