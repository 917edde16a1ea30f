"""The static call-signature contract (issue 26, class 5): a call from verl's code into the engine
with arguments the installed definition does not take is drift, found from source without a GPU.
Synthetic engines for the rules; the real case (verl 0.9.1's NVFP4 QAT patch passing
`shared_experts=` to vLLM 0.24.0) is in tests/test_gates.py, on the real wheels."""

import textwrap
from pathlib import Path

from envbuild.probe.contract import _static_checks
from envbuild.probe.staticcalls import check_calls
from envbuild.probe.staticimports import ModuleIndex
from envbuild.probe.verdict import Verdict

ENGINE = {
    "eng/__init__.py": "from .params import SamplingParams\nfrom ._impl import *\n",
    "eng/_impl.py": "__all__ = ['start']\ndef start(model, *, tp=1, **engine_args):\n    pass\n",
    "eng/params.py": """
        from dataclasses import dataclass, field
        from typing import ClassVar

        @dataclass
        class Base:
            n: int = 1

        @dataclass
        class SamplingParams(Base):
            temperature: float = 1.0
            seed: int | None = None
            registry: ClassVar[dict] = {}
            cache: dict = field(default_factory=dict, init=False)
    """,
    "eng/req.py": """
        from pydantic import BaseModel

        class UpdateWeightsReq(BaseModel):
            names: list[str]
            flush_cache: bool = True

        class Engine:
            def __init__(self, model, dtype="auto"):
                pass

            @classmethod
            def from_args(cls, args, *, usage=None):
                pass

        def wrapped(fn):
            return fn

        @wrapped
        def rewritten(a):
            pass

        def abort(request_id, /, *, reason=None):
            pass
    """,
}
USER = """
    from eng import SamplingParams, start
    from eng.req import Engine, UpdateWeightsReq, abort, rewritten
    import eng.req as req

    def rollout(v):
        SamplingParams(n=2, temperature=0.7, top_k=5)           # 7: top_k is gone
        SamplingParams(2, 0.5, 3)                                 # 8: fine (n, temperature, seed)
        SamplingParams(2, 0.5, 3, 4)                              # 9: one positional too many
        start("m", tp=2, gpu_memory_utilization=0.5)             # 10: **engine_args takes it
        UpdateWeightsReq(names=["w"], flush=True)                # 11: flush is not a field
        UpdateWeightsReq(flush_cache=False)                      # 12: names missing
        Engine("m", dtype="bf16", quantization="fp8")           # 13: no quantization
        req.Engine.from_args(v, usage=1, tokenizer="t")          # 14: no tokenizer
        rewritten(1, 2, 3)                                        # 15: a decorator may rewrite it: unknown
        abort("r1", reason="x", cancel=True)                      # 16: no cancel
        SamplingParams(cache={})                                  # 17: init=False field
        opts = {}
        SamplingParams(**opts)                                    # 19: splat: nothing certain
"""


def _site(tmp_path: Path) -> ModuleIndex:
    for rel, text in {**ENGINE, "user/__init__.py": "", "user/mod.py": USER}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return ModuleIndex([str(tmp_path)])


def test_calls_are_read_against_the_installed_definitions(tmp_path):
    got = {(f.line, f.problem) for f in check_calls(_site(tmp_path), "user.mod", {"eng"})}
    assert got == {
        (7, "no parameter 'top_k'"),
        (9, "takes 3 positional argument(s), given 4"),
        (11, "no parameter 'flush'"),
        (12, "missing 'names'"),
        (13, "no parameter 'quantization'"),
        (14, "no parameter 'tokenizer'"),
        (16, "no parameter 'cancel'"),
        (17, "no parameter 'cache'"),
    }


def test_a_finding_names_both_sides_and_fails_the_contract(tmp_path):
    finds = [f for f in check_calls(_site(tmp_path), "user.mod", {"eng"}) if f.line == 7]
    assert finds[0].file == "user/mod.py" and finds[0].callee == "eng.SamplingParams"
    assert finds[0].where == "eng/params.py:10"
    v = Verdict(level="contract", engine="vllm")
    _static_checks(v, {"targets": ["eng"], "static": {"user.mod": {
        "checked": 1, "findings": [], "calls": [f.__dict__ for f in finds]}}})
    c = next(c for c in v.checks if c.name == "calls:user.mod")
    assert c.status == "fail" and c.cause == "call-signature-drift" and v.status == "fail"
    assert "user/mod.py:7 eng.SamplingParams(): no parameter 'top_k' (defined at eng/params.py:10)" in c.detail
