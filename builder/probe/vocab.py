"""The shared vocabulary: one descriptor per axis value, and the words every verdict is made of.

Its home is the probe because the probe runs inside images where envbuild is not installed
(standard library only); the host side imports it from here too. Every table, flag, choice
list and check about an engine, an accelerator variant or a platform is derived from the
descriptors here and beside it: adding an engine is one EngineSpec (plus its probe adapter and
the matrix), adding an accelerator kind one AcceleratorKind (probe.hardware: accelerators, variants,
platforms), a verl feature one FeatureSpec (probe.features: where a finding is reached).
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
    system_packages  Debian packages its runtime loads at import (an MPI library): installed in the
               image right before its layers; on a node without them the env level's import says so
    extra_index  an index its wheels come from besides the configured one: searched when its rows
               are locked and when their engine layers install
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
    system_packages: tuple[str, ...] = ()
    extra_index: str | None = None


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


def engine_index(engine: str | None) -> str | None:
    """The index a combination's engine serves its wheels from besides the configured one."""
    spec = ENGINE.get(engine or "")
    return spec.extra_index if spec else None
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
    threads_env  the variable that lets its nvcc compile several architectures at once (nvcc
               --threads): one nvcc per source file, each compiling its targets one after the other,
               left 13 of a 16-core node idle (411 s for six targets on the lent H100)
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
    threads_env: str = ""

    @property
    def package(self) -> str:
        return self.module.split(".")[0]


JIT_KERNELS = (
    JitKernel("flashinfer-sampling", "flashinfer-python", "flashinfer.jit.sampling", "gen_sampling_module",
              "data/aot", "sampling", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE", "flashinfer_jit_cache",
              "FlashInfer's top-k/top-p sampler, which vLLM's sampler and SGLang's default sampling backend call "
              "(verl's rollout samples with it): 99.4 s of nvcc on a fresh H100, 0.2 s prebuilt "
              "(bench/verl_step/sglang_h100.json)", "FLASHINFER_NVCC_THREADS"),
)


def normalize_dist(name: object) -> str:
    """A distribution's name as PEP 503 compares it (`Flashinfer_Python` -> `flashinfer-python`):
    packaging's canonicalize_name, for the probe, which runs on the standard library only."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def jit_kernels_for(pinned) -> list[str]:
    """The kernels an environment compiles ahead of time: those whose library it pins (names of
    distributions, any spelling). An image's build step and an in-place venv both ask here."""
    have = {normalize_dist(n) for n in pinned}
    return [k.name for k in JIT_KERNELS if k.dist in have]


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
