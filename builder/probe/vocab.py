"""The shared vocabulary: one descriptor per axis value, and the words every verdict is made of.

Its home is the probe because the probe runs inside images where envbuild is not installed
(standard library only); the host side imports it from here too. Every table, flag, choice
list and check about an engine, an accelerator variant or a platform is derived from the
descriptors here: adding an engine is one EngineSpec (plus its probe adapter and the matrix),
adding an accelerator kind one AcceleratorKind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ---------------------------------------------------------------- levels and statuses

LEVELS = ("env", "contract", "gpu")  # each level includes the levels before it

# What the caller expects of the environment: --expect-<key> on the probe's command line, one key
# per axis the probe can check (the host's launchers and the probe's own children spell it so).
EXPECT_KEYS = ("cuda", "torch", "engine_version", "verl", "platform")


def expect_argv(expect: dict) -> list[str]:
    return [a for k in EXPECT_KEYS if expect.get(k) for a in (f"--expect-{k.replace('_', '-')}", str(expect[k]))]

# A check's status. needs-gpu / not-applicable / skipped are not failures: a CPU host cannot run
# the first, the second belongs to an engine or backend the combination does not include.
PASS, FAIL, NEEDS_GPU, NOT_APPLICABLE, SKIPPED, ERROR = (
    "pass", "fail", "needs-gpu", "not-applicable", "skipped", "error")
# Environment needs: caveats, not verdicts. The stack works where the need is met (a host that can
# reach the network, a writable home); the verdict's status ignores them and `caveats` lists them.
NEEDS_NETWORK, NEEDS_HOME = "needs-network", "needs-writable-home"
# Not an environment need but the same kind of word: a name missing in code that runs only for
# versions a guard envbuild could not evaluate selects; the stack works unless that code runs.
VERSION_GATED = "version-gated"
CAVEATS = (NEEDS_NETWORK, NEEDS_HOME, VERSION_GATED)
TIMEOUT = "timeout"  # a probe killed at its deadline (written by the launcher, not the probe)
NOT_RUN = "not-run"  # a level nobody ran (a table entry, never a probe's answer)

CHECK_STATUSES = (PASS, FAIL, NEEDS_GPU, NOT_APPLICABLE, SKIPPED, ERROR, *CAVEATS)
# What a summary of checks leaves out (nothing to say), and what does not explain a verdict that did
# not pass (the caveats go on the row instead): one pair of sets for the probe, the host and doctor.
QUIET = (PASS, NOT_APPLICABLE, SKIPPED)
NOT_A_PROBLEM = (*QUIET, *CAVEATS)
VERDICT_STATUSES = (PASS, FAIL, NEEDS_GPU, ERROR, TIMEOUT)
# The one rule about what a status says of the stack. A probe that times out is a failure of the
# stack: a stack that hangs is not usable, and calling it infrastructure would let an earlier
# "works" stand. error (the probe or the machine broke) and needs-gpu decide nothing.
FAILING = (FAIL, TIMEOUT)
DECISIVE = (PASS, *FAILING)
UNDECIDED = (ERROR, NEEDS_GPU, NOT_RUN)

# Exit codes, one table for the host and the in-image probe (README, "Exit codes").
EXIT_OK, EXIT_VERDICT, EXIT_BAD_INPUT, EXIT_INFRA = 0, 1, 2, 3
EXIT_OF_STATUS = {PASS: EXIT_OK, FAIL: EXIT_VERDICT, TIMEOUT: EXIT_VERDICT, NEEDS_GPU: EXIT_INFRA, ERROR: EXIT_INFRA}


# The one status precedence: what a set of check (or level) statuses folds to. error (the probe
# broke: nothing was shown) > fail > timeout > needs-gpu > pass; caveats, not-applicable and
# skipped leave it at pass.
PRECEDENCE = (ERROR, FAIL, TIMEOUT, NEEDS_GPU)


def worst_status(statuses) -> str:
    have = set(statuses)
    return next((s for s in PRECEDENCE if s in have), PASS)


def is_failing(status: object) -> bool:
    return status in FAILING


def is_decisive(status: object) -> bool:
    return status in DECISIVE


def level_index(level: str) -> int:
    return LEVELS.index(level)


def levels_upto(level: str) -> tuple[str, ...]:
    return LEVELS[: LEVELS.index(level) + 1]


def level_rank(level: object) -> int:
    """0 for no level, 1 for env, 2 for contract, 3 for gpu."""
    return LEVELS.index(level) + 1 if level in LEVELS else 0


# ---------------------------------------------------------------- engines


@dataclass(frozen=True)
class EngineSpec:
    """One rollout engine, everything envbuild needs to know about it in one place.

    name       the axis value and the selector flag (`--vllm V`; `--hf` for an unversioned one)
    dist       the distribution whose version is the engine's version (hf: transformers)
    modules    top-level import names of the engine and its kernels (a module of another
               engine is "not applicable" in this combination)
    tokens     words in a verl module path that mark it as this engine's (verl/workers/rollout/vllm_rollout)
    versioned  whether a combination names a release of it (hf: transformers comes with verl)
    kernels    its kernel distributions: installed in the image's kernels layer
    runtime_extras  extras that carry its runtime (and torch pin) where a release provides them
    rollout    prefixes of verl's `actor_rollout_ref.rollout.name` that select it
    ports_from the first of the fixed ports its rollout binds per node (one per rank), None: free ports
    runs_on_cpu  its rollout also runs without a GPU (the probe's gpu level then runs on the CPU)
    side_by_side  the probe's default for --side-by-side: "auto" where judging the contract level
               beside the gpu level was measured faster on a GPU node (the gpu level does not
               wait on verl's import), "no" where it was never measured (SGLang)
    """

    name: str
    label: str
    dist: str
    modules: frozenset[str]
    tokens: frozenset[str]
    versioned: bool = True
    kernels: frozenset[str] = frozenset()
    runtime_extras: tuple[str, ...] = ()
    rollout: tuple[str, ...] = ()
    ports_from: int | None = None
    runs_on_cpu: bool = False
    side_by_side: str = "no"


ENGINE_SPECS = (
    EngineSpec("vllm", "vLLM", "vllm", frozenset({"vllm", "vllm_flash_attn"}), frozenset({"vllm"}),
               kernels=frozenset({"vllm-flash-attn", "flashinfer-python", "flashinfer", "flashinfer-cubin"}),
               rollout=("vllm",), side_by_side="auto"),  # 17.2-18.2 s against 20.8-20.9 s on the H200
    EngineSpec("sglang", "SGLang", "sglang", frozenset({"sglang", "sgl_kernel", "sglang_kernel"}),
               frozenset({"sglang"}), kernels=frozenset({"sgl-kernel", "sglang-kernel"}),
               runtime_extras=("srt",), rollout=("sglang",), ports_from=30000),
    # hf: transformers generate, no inference engine; transformers comes with verl.
    EngineSpec("hf", "transformers (hf)", "transformers", frozenset(), frozenset(), versioned=False,
               rollout=("hf",), runs_on_cpu=True,
               side_by_side="auto"),  # a row's venv, cold: 11.9 s against 15.7 s (H100), 13.5 against 14.8 (H200)
)
DEFAULT_ENGINE = "vllm"  # verl's default rollout (actor_rollout_ref.rollout.name)
ENGINE = {e.name: e for e in ENGINE_SPECS}
ENGINES = tuple(ENGINE)
VERSIONED_ENGINES = tuple(e.name for e in ENGINE_SPECS if e.versioned)
# verl's own runtime extras, taken where a release provides them: from 0.9 the trainer's runtime
# (TransferQueue, which the default `trainer.use_v1` imports at start-up, cachetools, msgspec, ...)
# is in [verl-core], which each of verl's engine extras includes; plain `verl` lacks it and
# `main_ppo` stops at `import transfer_queue`.
VERL_RUNTIME_EXTRAS = ("verl-core",)


@dataclass(frozen=True)
class JitKernel:
    """A kernel an engine's library compiles with nvcc on its first use, which an image compiles
    ahead of time (probe/jit.py): one home for what the render and the build step need to know.

    name       what the Dockerfile's step and its log call it
    dist       the distribution that compiles it: a lock that pins it gets the build step
    module, spec  the library's own builder: `module.spec()` returns its JIT spec (`.build()`,
               `.jit_library_path`)
    aot        where the library loads a module compiled ahead of time, under its package
               (`<package>/<aot>/<aot name>/<aot name>.so`), without compiling or checking the GPU
    arch_env   the variable that tells the library which GPU architecture to compile for
    workspace_env  the variable that moves its JIT folder (a scratch folder at build time)
    aot_package  a package whose presence replaces `aot` (the library's own ahead-of-time wheel)
    why        what it costs without it
    """

    name: str
    dist: str
    module: str
    spec: str
    aot: str
    aot_name: str
    arch_env: str
    workspace_env: str
    aot_package: str
    why: str

    @property
    def package(self) -> str:
        return self.module.split(".")[0]


JIT_KERNELS = (
    JitKernel("flashinfer-sampling", "flashinfer-python", "flashinfer.jit.sampling", "gen_sampling_module",
              "data/aot", "sampling", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE", "flashinfer_jit_cache",
              "FlashInfer's top-k/top-p sampler, which vLLM's sampler and SGLang's default sampling backend call "
              "(verl's rollout samples with it): 99.4 s of nvcc on a fresh H100, 0.2 s prebuilt "
              "(bench/verl_step/sglang_h100.json)"),
)


def dist_of(name: str) -> str:
    """The distribution a versioned engine's releases are published as (`vllm` -> `vllm`); any
    other package name is itself. Index lookups, requirements and metadata keys go through it."""
    spec = ENGINE.get(name)
    return spec.dist if spec is not None and spec.versioned else name


def engine_of_module(top: str) -> str | None:
    """The engine a top-level module belongs to (`sgl_kernel` -> sglang), None for any other."""
    return next((e.name for e in ENGINE_SPECS if top in e.modules), None)


def engine_of_rollout(name: object) -> str | None:
    """verl's rollout.name (`vllm`, `sglang_async`, `hf`) -> the engine, None if none knows it."""
    s = str(name or "")
    return next((e.name for e in ENGINE_SPECS for p in e.rollout if s.startswith(p)), None)


# ---------------------------------------------------------------- scopes (where a finding is reached)

# A failing check's scope: the runs that reach the code it found broken. `core` is what every run of
# this engine through verl's trainer with verl's default config reaches; any other scope is opt-in
# (a feature, a model type, a run-time guard), so a row broken only there is not broken: its status
# stands and the scope is listed beside it. A finding whose scope cannot be determined is core.
CORE = "core"
MODEL_SCOPE = "model:"  # + verl's model_type: verl's model patches are selected by it (derived from code)
GUARD_SCOPE = "guard:"  # + what the code tests at run time before it reaches the finding
GUARDS = {
    "gpu-only": "runs only where torch.cuda.is_available() (judged by the gpu level)",
    "runtime-check": "runs only after a run-time check (hasattr, inspect.signature) that this install fails",
    "fallback": "inside try/except: the code takes its fallback when this fails",
    "argument": "runs only when a caller passes an optional argument",
}
# Where a scope came from: read from verl's code, or from a feature descriptor (data).
SCOPE_FROM_CODE, SCOPE_FROM_DATA, SCOPE_UNDETERMINED = "code", "data", "undetermined"


@dataclass(frozen=True)
class FeatureSpec:
    """One opt-in path of verl's trainer: what switches it on and which of verl's code only it reaches.

    name       the scope's name (`pick --feature NAME`, `doctor`, the page)
    modules    verl modules (fnmatch patterns) that only this feature loads; a finding at module
               level of one counts for the feature only if no module outside it imports it at
               module level (else it is loaded on every run: core)
    config     (key, value) pairs of verl's trainer config that switch it on; value True for a flag,
               a string for an enum value, ">0"/">1" for a size
    guards     attribute or variable names whose test (`if self.multi_stage_wake_up:`) guards code
               reached only with the feature on
    default_from  the first verl release in which it is on by default (there it is core)
    default_until the first verl release in which it is no longer the default (before it: core)
    """

    name: str
    label: str
    modules: tuple[str, ...] = ()
    config: tuple[tuple[str, object], ...] = ()
    guards: tuple[str, ...] = ()
    default_from: str | None = None
    default_until: str | None = None


# From verl's sources at its release tags (shared/reference/verl-run.md, section 3).
FEATURE_SPECS = (
    FeatureSpec("async", "async rollout (rollout.mode=async)",
                ("verl.workers.rollout.async_server", "verl.workers.rollout.*.*async*", "verl.experimental.agent_loop*",
                 "verl.workers.rollout.chat_scheduler*"),
                (("actor_rollout_ref.rollout.mode", "async"),), default_from="0.7.0"),
    FeatureSpec("sync", "in-process rollout (rollout.mode=sync)",
                ("verl.workers.rollout.*.*_rollout_spmd", "verl.workers.sharding_manager.fsdp_vllm",
                 "verl.workers.sharding_manager.fsdp_sglang"),
                (("actor_rollout_ref.rollout.mode", "sync"),), default_until="0.7.0"),
    FeatureSpec("multi_stage_wake_up", "rollout.multi_stage_wake_up=true",
                config=(("actor_rollout_ref.rollout.multi_stage_wake_up", True),), guards=("multi_stage_wake_up",)),
    FeatureSpec("quantization", "QAT / ModelOpt / FP8 quantisation",
                ("verl.utils.qat*", "verl.utils.modelopt*", "verl.utils.vllm.vllm_fp8_utils", "verl.utils.vllm.vllm_quant_utils"),
                (("actor_rollout_ref.actor.fsdp_config.qat.enable", True), ("actor_rollout_ref.actor.qat.enable", True),
                 ("actor_rollout_ref.rollout.quantization", "fp8")),
                ("qat", "enable_qat", "quantization", "quant_method", "modelopt", "fp8")),
    FeatureSpec("lora", "LoRA (model.lora_rank>0)", ("verl.utils.*lora*",),
                (("actor_rollout_ref.model.lora_rank", ">0"), ("actor_rollout_ref.model.lora.rank", ">0")),
                ("lora_rank", "is_lora", "lora_adapter_path", "enable_lora", "peft_config")),
    FeatureSpec("megatron", "Megatron strategy (actor.strategy=megatron)",
                ("verl.workers.megatron_workers", "verl.workers.engine.megatron*", "verl.*megatron*", "verl.*mcore*"),
                (("actor_rollout_ref.actor.strategy", "megatron"),), ("megatron",)),
    FeatureSpec("sequence_parallel", "Ulysses sequence parallel (ulysses_sequence_parallel_size>1)",
                ("verl.utils.ulysses",),
                (("actor_rollout_ref.actor.ulysses_sequence_parallel_size", ">1"),),
                ("ulysses_sequence_parallel_size", "ulysses_sp_size", "use_ulysses_sp")),
    FeatureSpec("vlm", "vision-language models (a processor, images)",
                ("verl.utils.dataset.vision_utils*", "verl.models.transformers.*_vl", "verl.models.transformers.glm4v"),
                guards=("image_data", "multi_modal_data", "multi_modal_inputs", "processor")),
    FeatureSpec("multi_turn", "multi-turn / tools / agents (rollout.multi_turn.enable)",
                ("verl.tools*", "verl.interactions*", "verl.experimental.agent_loop.tool_agent_loop*"),
                (("actor_rollout_ref.rollout.multi_turn.enable", True),), ("multi_turn", "tool_schemas", "interaction")),
    FeatureSpec("fused_kernels", "model.use_fused_kernels=true",
                ("verl.utils.kernel*", "verl.models.transformers.dense_common"),
                (("actor_rollout_ref.model.use_fused_kernels", True),), ("use_fused_kernels",)),
    FeatureSpec("disaggregation", "prefill/decode disaggregation",
                ("verl.workers.rollout.*_pd_replica",),
                (("actor_rollout_ref.rollout.disaggregation.enabled", True),), ("disaggregation",)),
)
FEATURE = {f.name: f for f in FEATURE_SPECS}
FEATURES = tuple(FEATURE)


def is_core(scope: object) -> bool:
    return scope in (None, "", CORE)


def model_types(scope: object) -> tuple[str, ...]:
    """`model:qwen3_5,qwen3_5_moe` -> ("qwen3_5", "qwen3_5_moe"); () for any other scope."""
    s = str(scope or "")
    return tuple(s[len(MODEL_SCOPE):].split(",")) if s.startswith(MODEL_SCOPE) else ()


def scope_flag(scope: str) -> str:
    """How `envbuild pick` spells a run's scope: `--model-type T` or `--feature F`."""
    types = model_types(scope)
    return f"--model-type {types[0]}" if types else f"--feature {scope}"


def scope_label(scope: object) -> str:
    """`quantization` -> its label; `model:qwen3_5` -> `model_type qwen3_5`; `guard:…` -> the guard."""
    s = str(scope or CORE)
    if s in FEATURE:
        return FEATURE[s].label
    if s.startswith(MODEL_SCOPE):
        return f"model_type {s[len(MODEL_SCOPE):]}"
    if s.startswith(GUARD_SCOPE):
        g = s[len(GUARD_SCOPE):].split(":")[0]
        return GUARDS.get(g, s)
    return s


def _release(text: object) -> tuple:
    nums = re.findall(r"\d+", str(text or "").split("+")[0])[:3]
    return tuple(int(n) for n in nums) + (0,) * (3 - len(nums))


def feature_default_on(name: str, verl: object) -> bool:
    """Whether verl's default config at release `verl` turns the feature on (then it is core)."""
    f = FEATURE.get(name)
    if f is None or not verl:
        return False
    v = _release(verl)
    if f.default_from and v >= _release(f.default_from):
        return True
    return bool(f.default_until and v < _release(f.default_until))


def parse_scope(value: object) -> str | None:
    """A user's spelling of a scope: a feature name (`async`, `multi-stage-wake-up`), `model:T` or
    `model_type=T`; None if unknown."""
    s = str(value or "").strip().lower()
    if s.startswith(("model:", "model_type=", "model_type:", "model-type=")):
        t = re.split(r"[:=]", s, 1)[1].strip()
        return MODEL_SCOPE + t if re.fullmatch(r"[a-z0-9_.\-]+", t) else None
    s = s.replace("-", "_")
    return s if s in FEATURE or s == CORE else None


# ---------------------------------------------------------------- accelerator variants


@dataclass(frozen=True)
class AcceleratorKind:
    """One kind of accelerator a torch build targets.

    prefix          the variant tag's prefix (`cu` + 124, `rocm` + 6.2); the tag is also the PyTorch
                    index's folder for the variant (download.pytorch.org/whl/<tag>)
    torch_attr      what torch reports it under (torch.version.cuda / torch.version.hip)
    container_args  how a container gets the devices (`docker run` arguments)
    device_nodes    device files whose presence means this host has one
    smi             the command that lists the devices ([] when none)
    no_device       (pattern, why): what its stack prints on a host without its devices or driver;
                    the probe classifies those as needs-gpu (not judged here), never as broken
    driver_lib      the driver's user-space library: "<it>: cannot open shared object file" means
                    this host has no driver
    driver_label    what a reader calls that driver
    """

    name: str
    label: str
    prefix: str
    torch_attr: str | None
    container_args: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = ()
    smi: tuple[str, ...] = ()
    no_device: tuple[tuple[str, str], ...] = ()
    driver_lib: str | None = None
    driver_label: str = ""


CUDA_KIND = AcceleratorKind("cuda", "CUDA", "cu", "cuda", ("--gpus", "all"), ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"),
                            ("nvidia-smi", "-L"),
                            no_device=((r"Found no NVIDIA driver", "no NVIDIA driver"),
                                       (r"No CUDA GPUs are available", "no CUDA GPU available"),
                                       (r"CUDA driver initialization failed", "CUDA driver initialization failed"),
                                       (r"Torch not compiled with CUDA enabled", "torch has no CUDA (CPU build)"),
                                       (r"NVML Shared Library Not Found|libnvidia-ml\.so(?:\.1)?: cannot open",
                                        "NVML (driver) not found"),
                                       (r"cudaGetDeviceCount|CUDA_ERROR_NO_DEVICE|no CUDA-capable device is detected",
                                        "no CUDA device")),
                            driver_lib="libcuda", driver_label="NVIDIA driver")
ROCM_KIND = AcceleratorKind("rocm", "ROCm", "rocm", "hip",
                            ("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"),
                            ("/dev/kfd",), ("rocm-smi", "--showproductname"),
                            no_device=((r"No HIP GPUs are available", "no ROCm GPU available"),
                                       (r"hipErrorNoDevice|no ROCm-capable device is detected", "no ROCm device"),
                                       (r"HIP driver initialization failed|hipErrorNoBinaryForGpu.*no GPU",
                                        "HIP driver initialization failed")),
                            driver_label="AMD GPU driver (amdgpu)")  # user space comes in the torch wheel
CPU_KIND = AcceleratorKind("cpu", "CPU", "cpu", None)
ACCELERATORS = {k.name: k for k in (CUDA_KIND, ROCM_KIND, CPU_KIND)}
CPU = "cpu"  # the variant tag of a CPU-only torch build


@dataclass(frozen=True)
class Variant:
    """An accelerator variant: a kind and its version (`cu124` = CUDA 12.4, `rocm6.2`, `cpu`)."""

    kind: str
    version: str = ""  # "12.4"; "" for cpu

    @property
    def accelerator(self) -> AcceleratorKind:
        return ACCELERATORS[self.kind]

    @property
    def tag(self) -> str:
        """`cu124`, `rocm6.2`, `cpu`: the axis value, the image tag's part, the PyTorch index folder."""
        if self.kind == "cuda":
            major, minor = self.version.split(".")[:2]
            return f"cu{major}{minor}"
        return f"{self.accelerator.prefix}{self.version}"

    @property
    def index_path(self) -> str:
        return self.tag

    @property
    def env_suffix(self) -> str:
        """The tag as a shell identifier's tail (per-variant secrets: `rocm6.2` -> `rocm6_2`)."""
        return re.sub(r"[^A-Za-z0-9_]", "_", self.tag)

    @property
    def label(self) -> str:
        return f"{self.accelerator.label} {self.version}".strip()

    def __str__(self) -> str:
        return self.tag


_VARIANT_RES = (
    ("cuda", re.compile(r"(?:cuda\s*)?cu(\d{1,2})(\d)", re.I)),
    ("cuda", re.compile(r"(?:cuda\s*)?(\d{1,2})\.(\d)(?:\.\d+)*", re.I)),
    ("rocm", re.compile(r"rocm\s*(\d{1,2})\.(\d{1,2})(?:\.\d+)*", re.I)),
)


def parse_variant(value: object) -> Variant | None:
    """Any spelling -> the variant: `cu126`, `12.6`, `12.6.3`, `CUDA 12.6` -> cu126; `rocm6.2`,
    `ROCm 6.2.4` -> rocm6.2; `cpu` -> cpu; None for anything else."""
    s = str(value if value is not None else "").strip()
    if s.lower() in (CPU, "none"):
        return Variant("cpu")
    for kind, rx in _VARIANT_RES:
        m = rx.fullmatch(s)
        if m:
            return Variant(kind, f"{int(m.group(1))}.{int(m.group(2))}")
    return None


def env_suffix(value: object) -> str:
    """Any spelling of a variant -> its shell-identifier tail (Variant.env_suffix); the value itself,
    made safe the same way, when it is no variant."""
    v = parse_variant(value)
    return v.env_suffix if v else re.sub(r"[^A-Za-z0-9_]", "_", str(value))


def variant_tag(value: object) -> str | None:
    """Any spelling -> the tag (`12.4` -> `cu124`), None if not a variant."""
    v = parse_variant(value)
    return v.tag if v else None


def variant_of(kind: str, version: object) -> Variant:
    """The variant torch reports: kind `cuda` with torch.version.cuda `12.4`, `rocm` with
    torch.version.hip `6.2.41133`; kind cpu (or no version) -> cpu."""
    parts = re.findall(r"\d+", str(version or ""))
    if kind == "cpu" or len(parts) < 2:
        return Variant("cpu")
    return Variant(kind, f"{int(parts[0])}.{int(parts[1])}")


# ---------------------------------------------------------------- platforms


@dataclass(frozen=True)
class PlatformSpec:
    """A platform: Docker's name, the machine Python and wheel tags say, Debian's architecture."""

    name: str
    machine: str
    arch: str


PLATFORM_SPECS = (PlatformSpec("linux/amd64", "x86_64", "amd64"), PlatformSpec("linux/arm64", "aarch64", "arm64"))
PLATFORMS = {p.name: p for p in PLATFORM_SPECS}
DEFAULT_PLATFORM = "linux/amd64"  # its combinations' ids and tags carry no platform (as before the axis)


def parse_platform(value: object) -> str | None:
    """Any spelling (`linux/arm64`, `linux/arm64/v8`, `arm64`, `aarch64`) -> `linux/arm64`; None if unknown."""
    s = str(value if value is not None else "").strip().lower()
    if s.endswith("/v8"):
        s = s[:-3]
    s = s.removeprefix("linux/")
    for p in PLATFORM_SPECS:
        if s in (p.machine, p.arch):
            return p.name
    return None


def platform_spec(platform: str) -> PlatformSpec:
    return PLATFORMS[parse_platform(platform) or platform]


def platform_machine(platform: str) -> str:
    """`linux/arm64` -> `aarch64` (platform.machine() inside the image; the wheel tag's arch)."""
    return platform_spec(platform).machine


def platform_arch(platform: str) -> str:
    """`linux/arm64` -> `arm64` (Debian's and Docker's architecture name)."""
    return platform_spec(platform).arch


def host_platform() -> str | None:
    """This machine's platform, None for one envbuild has no images for."""
    import platform as _platform

    return parse_platform(_platform.machine())
