"""A finding's scope (probe/scope.py): the runs that reach it, read from verl's code where it can be
(the `if` around it, the model-type dispatch, the callers that pass an optional argument, what
imports a module at load time), from the feature descriptors otherwise; core when undetermined.
Also verl's rollout registry read from its code. Synthetic verl trees shaped like verl's releases."""

from __future__ import annotations

import textwrap

import pytest

from envbuild.probe import features
from envbuild.probe.contract import _static_checks
from envbuild.probe.registry import rollout_registry
from envbuild.probe.scope import Scoper
from envbuild.probe.verdict import Verdict


def _tree(root, files: dict) -> str:
    for rel, text in files.items():
        p = root / "verl" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    for d in [p for p in (root / "verl").rglob("*") if p.is_dir()] + [root / "verl"]:
        (d / "__init__.py").touch()
    return str(root / "verl")


SGLANG_041 = {
    "workers/rollout/sglang_rollout/sglang_rollout.py": '''
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput, ReleaseMemoryOccupationReqInput

        class AsyncEngine:
            async def resume_memory_occupation(self, tags=None):
                if tags is None:
                    obj = ResumeMemoryOccupationReqInput()
                else:
                    obj = ResumeMemoryOccupationReqInput(tags=tags)
                return obj

            async def release_memory_occupation(self, tags=None):
                if tags is not None:
                    return ReleaseMemoryOccupationReqInput(tags=tags)
                return ReleaseMemoryOccupationReqInput()
        ''',
    "workers/sharding_manager/fsdp_sglang.py": '''
        class M:
            def wake(self, loop):
                if self.multi_stage_wake_up:
                    loop.run_until_complete(self.inference_engine.resume_memory_occupation(tags=["weights"]))
                else:
                    loop.run_until_complete(self.inference_engine.resume_memory_occupation())
        ''',
    "workers/fsdp_workers.py": '''
        class W:
            def _build_rollout(self):
                rollout_name = self.config.rollout.name
                if rollout_name == "hf":
                    pass
                elif rollout_name == "vllm":
                    pass
                elif rollout_name in ["sglang", "sglang_async"]:
                    pass
                else:
                    raise NotImplementedError(rollout_name)
        ''',
    "models/transformers/monkey_patch.py": '''
        def apply_monkey_patch(model):
            if model.config.model_type in ("qwen3_5", "qwen3_5_moe"):
                from verl.models.transformers.qwen3_5 import forward
            elif model.config.model_type == "glm4v":
                from .glm4v import forward
            elif model.config.model_type == "qwen2":
                from .qwen2 import forward
        ''',
    "models/transformers/qwen3_5.py": "from transformers.models.qwen3_5 import X\n",
    "models/transformers/glm4v.py": "def forward():\n    from transformers import Nope\n",
    "models/transformers/qwen2.py": "from transformers import Missing\n",
    "workers/actor.py": "from verl.models.transformers.qwen2 import forward\n",
    "utils/qat/vllm_patch.py": '''
        import torch

        def patch():
            from vllm.model_executor.layers.quantization import Gone
        ''',
    "utils/vllm/vllm_quant_utils.py": "from vllm import Gone\n",
    "workers/rollout/vllm_rollout/vllm_async_server.py": '''
        from verl.utils.vllm import vllm_quant_utils

        def serve(x):
            if torch.cuda.is_available():
                from vllm import gpu_only
            if hasattr(x, "new_api"):
                x.new_api(flag=True)
            try:
                from vllm import fallback_thing
            except ImportError:
                fallback_thing = None
            plain_call(1)
            if isinstance(x, dict):
                typed_call(2)
        ''',
}


@pytest.fixture
def v041(tmp_path):
    return _tree(tmp_path, SGLANG_041)


def test_an_optional_argument_is_scoped_by_the_callers_that_pass_it(v041):
    sc = Scoper(v041, "0.4.1")
    s = sc.scope("verl.workers.rollout.sglang_rollout.sglang_rollout", 9, True)
    assert s["scope"] == "multi_stage_wake_up" and s["from"] == "code"
    assert "fsdp_sglang.py:5" in s["why"]
    # no caller in verl passes tags to release_memory_occupation: an argument guard, not core
    s = sc.scope("verl.workers.rollout.sglang_rollout.sglang_rollout", 14, True)
    assert s["scope"] == "guard:argument:tags" and "no call in verl passes it" in s["why"]


def test_model_patches_are_scoped_by_model_type_from_monkey_patch(v041):
    sc = Scoper(v041, "0.8.0")
    s = sc.scope("verl.models.transformers.qwen3_5", 1)
    assert s["scope"] == "model:qwen3_5,qwen3_5_moe" and "monkey_patch.py" in s["why"]
    assert sc.scope("verl.models.transformers.glm4v", 2, True)["scope"] == "model:glm4v"  # relative import
    # also imported at load time by a module outside the dispatch: every model loads it
    assert sc.scope("verl.models.transformers.qwen2", 1)["scope"] == features.CORE


def test_guards_around_the_line(v041):
    sc = Scoper(v041, "0.9.1")
    mod = "verl.workers.rollout.vllm_rollout.vllm_async_server"
    assert sc.scope(mod, 6, True)["scope"] == "guard:gpu-only"
    assert sc.scope(mod, 8, True)["scope"] == "guard:runtime-check"
    assert sc.scope(mod, 10, True)["scope"] == "guard:fallback"
    # a type check is no capability check: what it guards runs on every run that takes it
    assert sc.scope(mod, 15, True)["scope"] == features.CORE
    # unguarded, in the async server, which verl 0.9.1 runs by default: core
    s = sc.scope(mod, 13, True)
    assert s["scope"] == features.CORE and "on by default at verl 0.9.1" in s["why"]
    # the same module at a release where async is opt-in
    assert Scoper(v041, "0.6.0").scope(mod, 13, True)["scope"] == "async"


def test_feature_modules_from_data_unless_a_core_module_loads_them(v041):
    sc = Scoper(v041, "0.9.1")
    s = sc.scope("verl.utils.qat.vllm_patch", 5, True)
    assert s["scope"] == "quantization" and s["from"] == "data"
    # module level of a feature module that the async server imports at load time: core
    s = sc.scope("verl.utils.vllm.vllm_quant_utils", 1, False)
    assert s["scope"] == features.CORE and "vllm_async_server.py:2" in s["why"]
    # nothing known: core, and it says so
    s = sc.scope("verl.workers.somewhere", None)
    assert s == {"scope": features.CORE, "from": "undetermined", "why": "scope not determined: counts as core"}


def test_rollout_registry_from_code(tmp_path, v041):
    assert rollout_registry(v041)["names"] == ["hf", "sglang", "sglang_async", "vllm"]
    new = _tree(tmp_path / "new", {"workers/rollout/base.py": '''
        _ROLLOUT_REGISTRY = {
            ("vllm", "async"): "verl.workers.rollout.vllm_rollout.ServerAdapter",
            ("sglang", "async"): "verl.workers.rollout.sglang_rollout.ServerAdapter",
            ("trtllm", "async"): "x",
        }
        '''})
    reg = rollout_registry(new)
    assert reg["names"] == ["sglang", "trtllm", "vllm"] and reg["where"] == "verl/workers/rollout/base.py:2"
    assert reg["modes"] == ["async"]  # the rollout.mode values its (name, mode) keys accept


def _static(findings, calls=(), registry=None, engine="hf"):
    return {"static": {"verl.m": {"checked": 3, "findings": list(findings), "calls": list(calls), "unreachable": []}},
            "targets": ["torch", "transformers"], "registry": registry, "engine": engine}


def test_scoped_findings_leave_the_verdict_and_core_ones_fail_it():
    scoped = {"file": "verl/m.py", "line": 3, "module": "transformers.x", "name": "Y", "function": True,
              "where": "no Y", "gated": False, "scope": {"scope": "model:glm4v", "from": "code", "why": "glm4v only"}}
    v = Verdict(level="contract", engine="hf")
    _static_checks(v, _static([scoped], registry={"names": ["hf", "vllm"], "where": "w:1"}))
    names = {c.name: c for c in v.checks}
    assert names["static:verl.m@model:glm4v"].status == "fail" and names["static:verl.m"].status == "pass"
    assert names["registry:rollout"].status == "pass"
    assert v.status == "pass" and v.scoped() == {"model:glm4v": ["static:verl.m@model:glm4v"]}
    core = dict(scoped, scope={"scope": "core", "from": "undetermined", "why": "scope not determined: counts as core"})
    v = Verdict(level="contract", engine="hf")
    _static_checks(v, _static([core]))
    assert v.status == "fail" and "counts as core" in v.checks[-1].detail


def test_an_engine_verls_registry_cannot_select_is_broken_at_core():
    v = Verdict(level="contract", engine="hf")
    _static_checks(v, _static([], registry={"names": ["sglang", "trtllm", "vllm"], "where": "verl/workers/rollout/base.py:88"}))
    c = next(c for c in v.checks if c.name == "registry:rollout")
    assert c.status == "fail" and c.cause == "rollout-not-registered" and "base.py:88" in c.detail
    assert v.status == "fail"


def test_feature_defaults_follow_verls_releases():
    assert features.feature_default_on("async", "0.7.1") and not features.feature_default_on("async", "0.6.1")
    assert features.feature_default_on("sync", "0.6.1") and not features.feature_default_on("sync", "0.7.0")
    assert not features.feature_default_on("quantization", "0.9.1")
    assert features.parse_scope("multi-stage-wake-up") == "multi_stage_wake_up"
    assert features.parse_scope("model_type=Qwen3_5") == "model:qwen3_5" and features.parse_scope("nonsense") is None


def test_per_variant_secret_names_are_shell_identifiers():
    import re

    from envbuild.probe.hardware import env_suffix, parse_variant

    assert env_suffix("cu124") == "cu124" and env_suffix("12.4") == "cu124"  # unchanged for CUDA
    assert parse_variant("rocm6.2").env_suffix == "rocm6_2" and env_suffix("ROCm 6.2") == "rocm6_2"
    for v in ("cu130", "rocm6.2", "cpu"):
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", "ENVBUILD_TORCH_INDEX_URL_" + env_suffix(v))


def test_a_module_an_engine_claims_is_never_an_optional_backend(monkeypatch):
    from envbuild.probe import classify, vocab

    e = ModuleNotFoundError("No module named 'tensorrt_llm'")
    assert classify.classify_exception(e, "vllm").status == "not-applicable"  # an optional backend here
    spec = vocab.EngineSpec("trtllm", "TensorRT-LLM", "tensorrt-llm", frozenset({"tensorrt_llm"}),
                            frozenset({"trtllm"}), rollout=("trtllm",))
    monkeypatch.setattr(vocab, "ENGINE_SPECS", vocab.ENGINE_SPECS + (spec,))
    monkeypatch.setitem(vocab.ENGINE, "trtllm", spec)
    assert classify.classify_exception(e, "trtllm").status == "fail"  # its own engine missing: broken


TRAINER = {
    "trainer/main_ppo.py": '''
        import hydra

        def run(config):
            from verl.trainer.ppo.ray_trainer import RayPPOTrainer
            if config.actor_rollout_ref.actor.strategy == "fsdp":
                from verl.workers.fsdp_workers import ActorRolloutRefWorker
        ''',
    "trainer/ppo/ray_trainer.py": "from verl.utils.dataset import rl_dataset\n",
    "trainer/config/ppo.yaml": "reward:\n  _target_: verl.utils.reward_loader.load\n",
    "utils/reward_loader.py": "from verl.models.transformers import kimi_vl\n",
    "utils/dataset/rl_dataset.py": "import os\n",
    "workers/fsdp_workers.py": '''
        import importlib
        _ROLLOUTS = {"vllm": "verl.workers.rollout.vllm_rollout.vLLMRollout"}

        def model(name):
            return importlib.import_module(f"verl.models.{name}.modeling")

        def plugin(name):
            return importlib.import_module("verl.plugins." + name)
        ''',
    "plugins/extra.py": "import os\n",
    "models/llama/modeling.py": "from verl.models.transformers import llava_vl\n",
    "models/transformers/llava_vl.py": "from transformers import Gone\n",
    "workers/rollout/vllm_rollout.py": "from ..mm_utils import qwen_helpers\n",
    "workers/mm_utils.py": "from verl.models.transformers import qwen2_vl\n",
    "trainer/sft_trainer.py": "from verl.utils.dataset.multiturn_sft_dataset import D\n",
    "utils/dataset/multiturn_sft_dataset.py": "from verl.models.transformers.glm4v import forward\n"
                                              "from verl.models.transformers.qwen3_vl import forward\n",
    "models/transformers/monkey_patch.py": '''
        def apply_monkey_patch(model):
            if model.config.model_type == "qwen3_vl":
                from .qwen3_vl import forward
        ''',
    "models/transformers/qwen3_vl.py": "from transformers import Gone\n",
    "models/transformers/qwen2_vl.py": "from transformers import Gone\n",
    "models/transformers/kimi_vl.py": "from transformers import Gone\n",
    "models/transformers/glm4v.py": "from transformers import Gone\n",
}


def test_core_is_what_the_trainer_entry_can_reach(tmp_path):
    """Issue 47: a feature module that only a module outside the trainer's reach imports at load
    time (an SFT trainer's dataset) is the feature's, not core; reached by a lazy import, a module
    named in a string (the rollout registry) or in a config's _target_, it is core."""
    sc = Scoper(_tree(tmp_path, TRAINER), "0.7.1")
    reach = sc.reached()
    assert {"verl.trainer.main_ppo", "verl.workers.fsdp_workers", "verl.workers.rollout.vllm_rollout",
            "verl.workers.mm_utils", "verl.utils.reward_loader"} <= reach
    assert "verl.trainer.sft_trainer" not in reach and "verl.utils.dataset.multiturn_sft_dataset" not in reach
    s = sc.scope("verl.models.transformers.glm4v", 1)
    assert s["scope"] == "vlm" and "multiturn_sft_dataset.py:1 imports it at load time, but " \
        "verl.trainer.main_ppo never loads that module" in s["why"]
    s = sc.scope("verl.models.transformers.qwen2_vl", 1)  # registry string -> rollout -> relative import
    assert s["scope"] == features.CORE and "mm_utils.py:1" in s["why"]
    s = sc.scope("verl.models.transformers.llava_vl", 1)  # under a name computed from verl.models
    assert "verl.models.llama.modeling" in reach and s["scope"] == features.CORE
    # a name concatenated onto a verl package: every module under it may load
    assert "verl.plugins.extra" in reach and sc.scope("verl.plugins.extra", 1)["scope"] == features.CORE
    s = sc.scope("verl.models.transformers.kimi_vl", 1)  # a config's _target_
    assert s["scope"] == features.CORE and "reward_loader.py:1" in s["why"]
    # a model patch that the SFT dataset also imports is still that model type's
    s = sc.scope("verl.models.transformers.qwen3_vl", 1)
    assert s["scope"] == "model:qwen3_vl" and s["from"] == "code"
    # a finding in a module of no feature that the trainer never loads (the SFT trainer's own
    # import) is that other entry point's, and says so; one in a reached module stays core
    s = sc.scope("verl.trainer.sft_trainer", 1)
    assert (s["scope"], s["from"]) == ("guard:unreached", "code") and "verl.trainer.main_ppo" in s["why"]
    assert sc.scope("verl.utils.dataset.rl_dataset", 1)["scope"] == features.CORE


def test_without_the_trainer_entry_nothing_is_ruled_out(tmp_path):
    files = {k: v for k, v in TRAINER.items() if k != "trainer/main_ppo.py"}
    sc = Scoper(_tree(tmp_path, files), "0.7.1")
    assert sc.reached() == set()
    s = sc.scope("verl.models.transformers.glm4v", 1)
    assert s["scope"] == features.CORE and "multiturn_sft_dataset.py:1" in s["why"]
    assert sc.scope("verl.trainer.sft_trainer", 1)["scope"] == features.CORE


def test_a_written_verdict_never_aliases_the_verdict_it_was_written_from():
    """The probe writes its verdict at each level's end: each write's `total` is its own time, and
    writing leaves the verdict as it was (the one Verdict model, issue 51)."""
    import time

    v = Verdict(level="contract", engine="hf")
    v.metrics["n"] = 1
    first = v.to_dict("env")
    time.sleep(0.02)
    second = v.to_dict()
    assert "total" not in v.timings and second["timings"]["total"] > first["timings"]["total"]
    first["metrics"]["n"] = 2
    assert v.metrics == {"n": 1} and (first["schema"], first["level"], second["level"]) == (1, "env", "contract")
    back = Verdict.of(second)
    again = back.to_dict()
    assert again == second and again is not second and again["timings"] is not back.timings


LAZY = {
    "trainer/main_ppo.py": "from verl.workers.rollout import utils\nfrom verl.workers import registry\n",
    "workers/rollout/utils.py": '''
        import torch

        def update_weights(model, config):
            if torch.version.hip is not None:
                from verl.utils.vllm.rocm_map import restore
                restore(model)
            if is_fp8_model(config):
                from verl.utils.vllm.fp4_refit import stage
                stage(model)
            from verl.utils.vllm.always import go
            go(model)
        ''',
    "utils/vllm/rocm_map.py": "def restore(model):\n    from vllm.fused_moe import RoutedExperts\n",
    "utils/vllm/fp4_refit.py": "def stage(model):\n    from vllm.fused_moe import RoutedExperts\n",
    "utils/vllm/always.py": "def go(model):\n    from vllm.fused_moe import RoutedExperts\n",
    "utils/vllm/by_name.py": "def f():\n    from vllm.fused_moe import RoutedExperts\n",
    "workers/registry.py": 'import importlib\nimportlib.import_module("verl.utils.vllm.by_name")\n'
                           "def g():\n    from verl.utils.vllm.by_name import f\n",
}


def test_a_module_imported_only_under_a_condition_takes_that_conditions_scope(tmp_path):
    """verl 0.9.0's ROCm expert-map repair is imported only under `if torch.version.hip is not None`
    (vllm_rollout/utils.py:247): on a CUDA build of torch no run reaches it, on a ROCm build every
    run does, and where the build is unknown nothing is ruled out. A module imported where nothing
    guards it, or named in a string (importlib, a registry), stays core."""
    root = _tree(tmp_path, LAZY)
    cuda = Scoper(root, "0.9.0", "cuda")
    s = cuda.scope("verl.utils.vllm.rocm_map", 2, True)
    assert (s["scope"], s["from"]) == ("guard:accelerator:rocm", "code"), s
    assert "utils.py:6" in s["why"] and "torch.version.hip is not None" in s["why"]
    assert features.scope_label(s["scope"]).startswith("runs only on another accelerator")
    assert Scoper(root, "0.9.0", "rocm").scope("verl.utils.vllm.rocm_map", 2, True)["scope"] == features.CORE
    assert Scoper(root, "0.9.0", None).scope("verl.utils.vllm.rocm_map", 2, True)["scope"] == features.CORE
    # the caller's own guard (a feature's flag) is the module's scope, read from code
    s = cuda.scope("verl.utils.vllm.fp4_refit", 2, True)
    assert s["scope"] == "quantization" and s["from"] == "code" and "utils.py:9" in s["why"]
    s = cuda.scope("verl.utils.vllm.always", 2, True)
    assert s["scope"] == features.CORE and "utils.py:11" in s["why"]
    assert cuda.scope("verl.utils.vllm.by_name", 2, True)["scope"] == features.CORE


def test_a_torch_build_says_its_accelerator_in_its_version_file():
    from envbuild.probe.hardware import torch_build_kind

    cu = "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
    assert torch_build_kind(cu) == "cuda"
    assert torch_build_kind("cuda = None\nhip = '6.2.41133'\n") == "rocm"
    assert torch_build_kind("__version__ = '2.11.0+cpu'\ncuda = None\nhip = None\n") == "cpu"
    assert torch_build_kind("nothing here\n") is None and torch_build_kind("def (") is None
