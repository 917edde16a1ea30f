"""Rollout engines behind one small interface, and the API checks the contract level runs.

Each engine: generate(prompts, n, max_tokens, seed) -> per prompt, n samples of
(token_ids, logprobs of those tokens); push(named full tensors); close().
The vLLM and SGLang adapters follow the documented offline APIs (shared/reference/probe.md);
heavy imports stay inside functions.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Callable

from .classify import classify_exception, device_branch
from .verdict import FAIL, NEEDS_GPU, NOT_APPLICABLE, PASS


# ----------------------------------------------------------------------------- API checks
def _params(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _fields(cls) -> set[str]:
    import dataclasses
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return _params(cls)


def _need(name: str, have: set[str], want: set[str]):
    missing = sorted(want - have)
    if missing:
        return (name, FAIL, f"missing {', '.join(missing)}", "api-missing")
    return (name, PASS, ", ".join(sorted(want)), None)


# When each check applies: {distribution: PEP 440 specifier}, all must hold (a missing
# distribution never matches). Outside, the check is not-applicable: the shapes it asks for did
# not exist yet, and the stacks of that era do not use them. An engine's own range is written on
# its Adapter (ADAPTERS, below) and joins this table there.
APPLIES: dict[str, dict[str, str]] = {
    "fsdp2": {"torch": ">=2.4"},  # fully_shard appeared in torch 2.4 (torch.distributed._composable.fsdp)
    "transformers": {"transformers": ">=4.37"},  # Qwen2ForCausalLM arrived in 4.37
}


def applies_to(name: str, versions=None) -> tuple[bool, str]:
    """(applies?, why not) for the API check `name` against installed versions."""
    from .env_level import dist_version
    from .versions import satisfies
    versions = versions or dist_version
    for dist, spec in APPLIES.get(name, {}).items():
        seen = versions(dist)
        try:
            ok = satisfies(seen, spec)
        except ValueError:
            ok = True  # an unparsable version: check rather than skip
        if not ok:
            return False, f"applies to {dist}{spec}; installed {dist} {seen or 'none'}"
    if name == "fsdp2":
        uses = verl_uses("fully_shard")
        if uses is False:
            return False, "the installed verl never uses FSDP2 (no fully_shard in its sources)"
    return True, ""


def verl_uses(name: str) -> bool | None:
    """Does the installed verl's code use the identifier `name` (not a longer one that contains it:
    `fully_shard` is not `fully_sharded_data_parallel`; not in a comment or a string)? None when
    verl is not installed."""
    import importlib.util
    import io
    import re
    import tokenize
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    word = re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9_])")
    for root in spec.submodule_search_locations:
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if not f.endswith(".py"):
                    continue
                try:
                    with open(os.path.join(dirpath, f), "rb") as fh:
                        text = fh.read()
                except OSError:
                    continue
                if not word.search(text):
                    continue  # the cheap test first; tokens only where the word occurs
                try:
                    if any(t.type == tokenize.NAME and t.string == name
                           for t in tokenize.tokenize(io.BytesIO(text).readline)):
                        return True
                except (tokenize.TokenError, SyntaxError):
                    return True  # unreadable: assume it is used (check rather than skip)
    return False


def api_checks(engine: str, versions=None, on_gpu: bool = True) -> list[tuple[str, str, str, str | None]]:
    """`on_gpu`: the host has a GPU; without one, an import that fails in a branch the engine
    takes only without a GPU cannot judge the engine (classify.device_branch): needs-gpu."""
    out = []

    def guarded(name, fn):
        ok, why = applies_to(name, versions)
        if not ok:
            out.append((name, NOT_APPLICABLE, why, "version-out-of-range"))
            return
        try:
            res = fn()
            out.extend(res if isinstance(res, list) else [res])
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            c = classify_exception(e, engine)
            branch = device_branch(e) if not on_gpu and c.status in (FAIL, NOT_APPLICABLE) else None
            if branch:
                c.status, c.cause = NEEDS_GPU, "cpu-only-branch"
                c.detail = f"fails in the branch taken without a GPU, {branch}: {c.detail}"
            out.append((name, c.status, c.detail, c.cause))

    guarded("fsdp2", _check_fsdp2)
    guarded("transformers", _check_transformers)
    adapter = ADAPTERS.get(engine)
    if adapter and adapter.api_check:
        guarded(engine, adapter.api_check)
    return out


def _check_fsdp2():
    from .train import import_fully_shard
    import_fully_shard()
    from torch.distributed.tensor import DTensor  # noqa: F401  (full_tensor() for the weight push)
    return ("fsdp2", PASS, "fully_shard and DTensor.full_tensor importable", None)


def _check_transformers():
    import tokenizers  # noqa: F401
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM  # noqa: F401
    g = GenerationConfig(do_sample=True, num_return_sequences=4, output_scores=True,
                         return_dict_in_generate=True, top_k=0, top_p=1.0, temperature=1.0)
    ok = g.num_return_sequences == 4 and g.output_scores
    return ("transformers", PASS if ok else FAIL, "Qwen2ForCausalLM, GenerationConfig(output_scores, "
            "num_return_sequences), tokenizers", None if ok else "api-missing")


VLLM_ENGINE_ARGS = {"model", "dtype", "enforce_eager", "gpu_memory_utilization", "seed", "max_model_len",
                    "enable_prefix_caching", "tensor_parallel_size"}


def _check_vllm():
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    LLM = engine_class(LLM, "vllm.entrypoints.llm:LLM")
    res = [_need("vllm-engine-args", _fields(EngineArgs), VLLM_ENGINE_ARGS)]
    SamplingParams(n=4, logprobs=0, max_tokens=8, temperature=1.0, top_p=1.0, top_k=-1)
    res.append(("vllm-sampling-params", PASS, "SamplingParams(n, logprobs=0, max_tokens, temperature, top_p, top_k)", None))
    res.append(_need("vllm-generate", _params(LLM.generate), {"prompts", "sampling_params"}))
    push = "LLM.apply_model" if hasattr(LLM, "apply_model") else "llm_engine...driver_worker model_runner.model"
    res.append(("vllm-weight-push", PASS, f"load_weights via {push}", None))
    return res


SGLANG_SERVER_ARGS = {"model_path", "mem_fraction_static", "skip_tokenizer_init", "disable_cuda_graph",
                      "disable_radix_cache", "random_seed", "dtype"}


def engine_class(obj, *homes: str):
    """The class behind an entry point. Some releases export a function that builds the engine
    lazily (`def Engine(*a, **kw)`); its class then lives in one of `homes` ('module:Name'). A home
    absent from this release is skipped; when no home has the class and one that exists failed to
    import, that ImportError is what is wrong: it is raised (classified as such), not hidden
    behind an AttributeError."""
    if inspect.isclass(obj):
        return obj
    import importlib
    failed: ImportError | None = None
    for home in homes:
        mod, _, attr = home.partition(":")
        try:
            cls = getattr(importlib.import_module(mod), attr, None)
        except ImportError as e:
            absent = isinstance(e, ModuleNotFoundError) and e.name and (mod == e.name or mod.startswith(e.name + "."))
            if not absent:  # the home exists in this release and broke while importing
                failed = failed or e
            continue
        if inspect.isclass(cls):
            return cls
    if failed is not None:
        raise failed
    raise AttributeError(f"{getattr(obj, '__qualname__', obj)} is a {type(obj).__name__}, and no engine class "
                         f"was found in {', '.join(homes)}")


def _check_sglang():
    import sglang
    from sglang.srt.server_args import ServerArgs
    Engine = engine_class(sglang.Engine, "sglang.srt.entrypoints.engine:Engine", "sglang.srt.server:Engine")
    return [
        _need("sglang-server-args", _fields(ServerArgs), SGLANG_SERVER_ARGS),
        _need("sglang-generate", _params(Engine.generate), {"input_ids", "sampling_params", "return_logprob"}),
        _need("sglang-update-weights", _params(Engine.update_weights_from_tensor), {"named_tensors"}),
    ]


# ----------------------------------------------------------------------------- engines
class HFEngine:
    """transformers generate on a second model instance loaded from the saved checkpoint."""

    def __init__(self, model_dir: str, device, dtype, seed: int, rank: int = 0, world: int = 1):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(device=device, dtype=dtype).eval()
        self.device = device
        cfg = self.model.config
        self.eos = cfg.eos_token_id
        self.pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
        from transformers import GenerationConfig
        self.has_logits = hasattr(GenerationConfig(), "output_logits")

    def generate(self, prompts: list[list[int]], n: int, max_tokens: int, seed: int):
        torch = self.torch
        torch.manual_seed(seed)
        ids = torch.tensor(prompts, device=self.device)  # equal-length prompts: no padding
        # Raw logits (output_logits, transformers >= 4.38) where available: logprobs of the model, as
        # vLLM reports them. No logits processor is active (no min_new_tokens: it masks EOS at step 1).
        kw = {"output_logits": True} if self.has_logits else {"output_scores": True}
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                top_k=0, top_p=1.0, max_new_tokens=max_tokens, num_return_sequences=n,
                return_dict_in_generate=True, pad_token_id=self.pad, eos_token_id=self.eos, **kw)
        gen = out.sequences[:, ids.shape[1]:]
        scores = torch.stack(out.logits if self.has_logits else out.scores, 1).float()  # [P*n, T, V]
        lp = torch.log_softmax(scores, -1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        res = []
        for i in range(len(prompts)):
            group = []
            for j in range(n):
                k = i * n + j
                toks = gen[k].tolist()
                end = toks.index(self.eos) + 1 if self.eos in toks else len(toks)
                group.append((toks[:end], lp[k, :end].tolist()))
            res.append(group)
        return res

    def push(self, named) -> int:
        torch = self.torch
        params = dict(self.model.named_parameters())
        n = 0
        with torch.no_grad():
            for name, t in named:
                if name not in params:
                    raise KeyError(f"engine has no parameter {name}")
                params[name].copy_(t.to(params[name].dtype))
                n += 1
        return n

    def close(self):
        del self.model


class VLLMEngine:
    """vLLM offline LLM in this process (external_launcher, as verl runs it), weights pushed with
    model.load_weights. Written from the documented API; not runnable on a CPU host."""

    def __init__(self, model_dir: str, device, dtype, seed: int, rank: int = 0, world: int = 1):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process: load_weights reaches it
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model pickles from 0.11
        # external_launcher reads RANK/LOCAL_RANK from the environment (torchrun's); a plain process
        # (world size 1) has none, and vLLM 0.24 then fails with KeyError: 'RANK'.
        for k, val in (("RANK", rank), ("LOCAL_RANK", getattr(device, "index", None) or 0), ("WORLD_SIZE", world)):
            os.environ.setdefault(k, str(val))
        from vllm import LLM, SamplingParams
        from vllm.engine.arg_utils import EngineArgs
        self.SamplingParams = SamplingParams
        kw = dict(model=model_dir, dtype="bfloat16" if "bfloat16" in str(dtype) else "float32", enforce_eager=True,
                  gpu_memory_utilization=0.15, seed=seed, max_model_len=256, enable_prefix_caching=False,
                  tensor_parallel_size=world)
        if "distributed_executor_backend" in _fields(EngineArgs):
            kw["distributed_executor_backend"] = "external_launcher"  # reuse the trainer's process group
        self.llm = LLM(**kw)

    def generate(self, prompts, n, max_tokens, seed):
        # No per-request seed: with n > 1 it could give every sample of a group the same generator
        # (identical responses, no GRPO signal); the engine's seed keeps runs reproducible.
        sp = self.SamplingParams(n=n, logprobs=0, max_tokens=max_tokens, temperature=1.0, top_p=1.0, top_k=-1)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        res = []
        for o in outs:
            res.append([(list(c.token_ids), [lpd[t].logprob for t, lpd in zip(c.token_ids, c.logprobs)])
                        for c in o.outputs])
        return res

    def _model(self):
        eng = self.llm.llm_engine
        core = getattr(eng, "engine_core", None)  # V1: InprocClient -> EngineCore
        executor = core.engine_core.model_executor if core is not None and hasattr(core, "engine_core") \
            else eng.model_executor
        worker = executor.driver_worker
        worker = getattr(worker, "worker", worker)
        return worker.model_runner.model

    def push(self, named) -> int:
        weights = list(named)
        if hasattr(self.llm, "apply_model"):
            try:
                self.llm.apply_model(lambda m: m.load_weights(iter(weights)))
                return len(weights)
            except (AttributeError, NotImplementedError):
                pass
        self._model().load_weights(iter(weights))
        return len(weights)

    def close(self):
        del self.llm


class SGLangEngine:
    """sglang.Engine (scheduler in a child process), weights pushed with update_weights_from_tensor.
    Written from the documented API; not runnable on a CPU host."""

    def __init__(self, model_dir: str, device, dtype, seed: int, rank: int = 0, world: int = 1):
        import sglang
        self.eng = sglang.Engine(model_path=model_dir, dtype="bfloat16" if "bfloat16" in str(dtype) else "float32",
                                 mem_fraction_static=0.15, random_seed=seed, disable_cuda_graph=True,
                                 disable_radix_cache=True, skip_tokenizer_init=True, log_level="error",
                                 base_gpu_id=getattr(device, "index", None) or 0)

    def generate(self, prompts, n, max_tokens, seed):
        flat = [p for p in prompts for _ in range(n)]
        outs = self.eng.generate(input_ids=flat, sampling_params={"max_new_tokens": max_tokens, "temperature": 1.0,
                                                                  "top_p": 1.0, "top_k": -1},
                                 return_logprob=True)
        res = []
        for i in range(len(prompts)):
            group = []
            for o in outs[i * n:(i + 1) * n]:
                lps = o["meta_info"]["output_token_logprobs"]  # (logprob, token_id, text)
                group.append(([int(t[1]) for t in lps], [float(t[0]) for t in lps]))
            res.append(group)
        return res

    def push(self, named) -> int:
        weights = list(named)
        self.eng.update_weights_from_tensor(named_tensors=weights)  # flushes the cache by default
        return len(weights)

    def close(self):
        self.eng.shutdown()


@dataclass(frozen=True)
class Adapter:
    """What the probe runs for one engine of vocab.ENGINE_SPECS (one entry each; the conformance
    test walks them): the gpu level's engine, the contract level's API check and the versions it
    applies to ({distribution: specifier})."""

    engine: type
    api_check: Callable[[], object] | None = None
    applies: dict[str, str] = field(default_factory=dict)


ADAPTERS = {
    "hf": Adapter(HFEngine),
    # prompt_token_ids dicts, EngineArgs fields (shared/reference/probe.md)
    "vllm": Adapter(VLLMEngine, _check_vllm, {"vllm": ">=0.6.3"}),
    "sglang": Adapter(SGLangEngine, _check_sglang, {"sglang": ">=0.4.4"}),  # sglang.Engine(...) offline API
}
ENGINES = {name: a.engine for name, a in ADAPTERS.items()}
APPLIES.update({name: a.applies for name, a in ADAPTERS.items() if a.applies})
