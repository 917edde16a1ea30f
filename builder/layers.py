"""The layer model: the one description of an image's layers that every writer renders.

Made once per combination from its lock (envbuild.lock) and rendered by the Dockerfile
template (envbuild.render) and the bake writer (envbuild.bake); nothing reads a generated
Dockerfile back.

The lock's three layers (torch, engine, verl: each the pins that differ from the layer below)
are cut further so that pushes and pulls run layer-parallel and a torch bump reuses what did
not change:

  cuda-*      the nvidia-* wheels of the torch lock, grouped by library (no group is much over
              ~1 GB installed); the group's lock text names only its wheels, so two torch
              releases pinning the same wheels get the same RUN, the same files and so the
              same layer digest (install steps reset file times, see render.NORMALIZE)
  torch-deps  the rest of torch's dependencies (triton, sympy, ...)
  torch       torch itself
  engine      the rollout engine and its dependencies
  kernels     its compiled kernels (flash-attn, flashinfer, xformers, sgl-kernel), when present
  verl        verl and what it adds

Cutting never changes what is installed: folding the layers' pins in order gives exactly the
combination's full lock (checked here, and again inside the image by check-env.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

from packaging.utils import canonicalize_name

from .errors import EnvbuildError
from .lockmodel import LockResult
from .lockfile import parse_lock, text_of
from .values import Base, Combo
from .probe.vocab import ENGINE, ENGINE_SPECS, engine_index, jit_kernels_for

# (group, name prefixes), first match wins; the last group takes every other nvidia-* wheel.
CUDA_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cudnn", ("nvidia-cudnn-",)),
    ("cublas", ("nvidia-cublas-",)),
    ("nccl", ("nvidia-nccl-", "nvidia-nvshmem-")),
    ("cusparse", ("nvidia-cusparse-",)),
    ("cusparselt", ("nvidia-cusparselt-",)),  # new in torch 2.6: alone, so cusparse stays shared
    ("cufft", ("nvidia-cufft-", "nvidia-cusolver-", "nvidia-curand-")),
    ("runtime", ("nvidia-",)),
)
# Kernel wheels: large, native, pinned by the engine; each engine's own come from its descriptor.
KERNELS = frozenset({"flash-attn", "flash-attn-3", "xformers"}) | frozenset(k for e in ENGINE_SPECS for k in e.kernels)
# Bake stages, in order: the layers a stage ends with are shared by the combinations above it.
STAGES = ("torch", "engine", "final")
# What `python -m venv` seeds besides pip (ensurepip: setuptools up to Python 3.11). The tools step
# moves it out of the venv into an archive (SEED_STASH, in the tools layer) so that no later step
# deletes a file of a lower layer (a whiteout carries the build's time); the last step unpacks it
# back where the lock has none (ImageModel.restores_seed; dockerfiles/venv-seed.py).
SEED_EXTRAS = ("setuptools",)
SEED_STASH = "/opt/envbuild/venv-seed.tar"
# The lock layers whose steps unpack into a uv cache of their own, in the step's filesystem, and
# hardlink from it (then drop it), instead of copying out of the shared cache mount: a few large
# pinned wheels (torch, the nvidia-* libraries), so a step that runs is a new wheel and the shared
# cache would rarely be read again, while copying out of a mount (no hardlinks across mounts) cost
# as much as unpacking (torch 2.6: 4.7 s copy vs 0.2 s hardlink) and kept a second unpacked copy
# of every CUDA library in the builder's cache.
STEP_CACHE_SOURCES = frozenset({"torch"})
STEP_CACHE_DIR = "/opt/envbuild/uv-step"
SHARES = {
    "cuda": "every image whose torch lock pins these CUDA wheels, across torch releases",
    "torch": "every combination with this torch, CUDA variant and Python",
    "engine": "every combination with this torch and engine",
    "verl": "this combination",
}


@dataclass(frozen=True)
class Layer:
    name: str  # cuda-cublas | torch-deps | torch | engine | kernels | verl
    source: str  # the lock layer it is cut from: torch | engine | verl
    stage: str  # the bake stage it belongs to (STAGES)
    title: str  # one line for the Dockerfile
    shares: str  # which images share it
    text: str  # the hashed requirements it installs
    packages: dict[str, str] = field(default_factory=dict)  # name -> version

    @property
    def lock_file(self) -> str:
        """Its requirements, relative to the build context."""
        return f"locks/{self.name}.txt"

    @property
    def key(self) -> str:
        """Content key: the same pins (hashes included) give the same key, in any combination."""
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class ImageModel:
    combo: Combo
    base: Base
    tools: str  # hashed lock of the build tools (uv)
    layers: tuple[Layer, ...]
    expected: dict[str, str]  # the final environment: the full lock's name -> version
    era: str
    lock_hash: str
    torch_index: str  # "default" or the (redacted) PyTorch index URL
    # pins for building the lock's source distributions (lock.build_constraints; "" when none):
    # given to the steps that may build (engine, kernels, verl; torch's layers are all wheels)
    build_constraints: str = ""
    # the lock's source distributions (name==version, lock.built_from_source)
    built_from_source: tuple[str, ...] = ()

    def constrains_builds(self, layer: Layer) -> bool:
        return bool(self.build_constraints) and layer.source != "torch"

    def step_cache(self, layer: Layer) -> bool:
        """Whether this layer's step unpacks into a cache of its own (STEP_CACHE_SOURCES)."""
        return layer.source in STEP_CACHE_SOURCES

    def restores_seed(self, layer: Layer) -> bool:
        """Whether this layer's step puts back what the tools step took out of the venv's seed
        (SEED_EXTRAS): the last step, when the lock pins none of it (an environment is the lock
        plus the venv's seed, as `python -m venv` makes it)."""
        pinned = {canonicalize_name(n) for n in self.expected}
        return layer == self.layers[-1] and not pinned & set(SEED_EXTRAS)

    def source_builds(self, layer: Layer) -> list[str]:
        """Names this layer builds from source. Each is built again in its step rather than taken
        from uv's cache of built wheels, which may hold one built with other build tools (another
        setuptools writes other metadata): the layer's bytes then follow from its lock."""
        names = {canonicalize_name(n.split("==")[0]) for n in self.built_from_source}
        return sorted(n for n in layer.packages if canonicalize_name(n) in names)

    @property
    def system_packages(self) -> tuple[str, ...]:
        """What the engine's runtime needs from the system (vocab.EngineSpec.system_packages)."""
        spec = ENGINE.get(self.combo.engine or "")
        return spec.system_packages if spec else ()

    @property
    def engine_index(self) -> str | None:
        """The engine's own index (vocab.engine_index), for its layers' install."""
        return engine_index(self.combo.engine)

    @property
    def jit_kernels(self) -> list[str]:
        """The kernels this image compiles ahead of time (vocab.jit_kernels_for)."""
        return jit_kernels_for(self.expected)

    @property
    def needs_torch_index(self) -> bool:
        """torch for a variant that is not its release's default comes from the PyTorch index."""
        return self.torch_index != "default"

    def stage_layers(self, stage: str) -> list[Layer]:
        return [l for l in self.layers if l.stage == stage]

    def stages(self) -> list[str]:
        """The bake stages this image has (engine only with an engine)."""
        return [s for s in STAGES if s == "final" or self.stage_layers(s)]

    def to_dict(self) -> dict:
        return {"combo": self.combo.to_dict(), "base": self.base.to_dict(), "tools": self.tools,
                "layers": [asdict(l) for l in self.layers], "expected": dict(sorted(self.expected.items())),
                "era": self.era, "lock_hash": self.lock_hash, "torch_index": self.torch_index,
                "build_constraints": self.build_constraints, "built_from_source": list(self.built_from_source)}

    @classmethod
    def from_dict(cls, d: dict) -> "ImageModel":
        c = {k: v for k, v in d["combo"].items() if k not in ("id", "tag")}
        return cls(Combo(**c), Base.from_dict(d["base"]), d["tools"], tuple(Layer(**l) for l in d["layers"]),
                   dict(d["expected"]), d["era"], d["lock_hash"], d["torch_index"], d.get("build_constraints", ""),
                   tuple(d.get("built_from_source", ())))


def _cuda_group(name: str) -> str | None:
    if not name.startswith("nvidia-"):
        return None
    return next(g for g, prefixes in CUDA_GROUPS if name.startswith(prefixes))


def _cut(source: str, text: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """One lock layer -> [(layer name, {package: (version, block)})], in install order."""
    pins = parse_lock(text)
    if source == "torch":
        groups: dict[str, dict] = {f"cuda-{g}": {} for g, _ in CUDA_GROUPS}
        groups.update({"torch-deps": {}, "torch": {}})
        for name, pin in pins.items():
            g = _cuda_group(name)
            groups[f"cuda-{g}" if g else ("torch" if name == "torch" else "torch-deps")][name] = pin
        return [(n, g) for n, g in groups.items() if g]
    if source == "engine":
        eng = {n: p for n, p in pins.items() if n not in KERNELS}
        ker = {n: p for n, p in pins.items() if n in KERNELS}
        return [(n, g) for n, g in (("engine", eng), ("kernels", ker)) if g]
    return [(source, pins)] if pins else []


def _title(name: str, combo: Combo) -> str:
    if name.startswith("cuda-"):
        return f"CUDA libraries ({name[5:]}): nvidia-* wheels from the torch lock."
    return {"torch-deps": "torch's dependencies (triton, sympy, ...).",
            "torch": f"torch {combo.torch} itself.",
            "engine": f"The rollout engine ({combo.engine} {combo.engine_version}) and its dependencies.",
            "kernels": "The engine's compiled kernels.",
            "verl": "verl itself: the most volatile layer."}[name]


def _shares(name: str) -> str:
    if name.startswith("cuda-"):
        return SHARES["cuda"]
    return SHARES["torch" if name.startswith("torch") else "engine" if name in ("engine", "kernels") else "verl"]


def _stage(source: str) -> str:
    return {"torch": "torch", "engine": "engine"}.get(source, "final")


def model_for(combo: Combo, lock: LockResult, base: Base) -> ImageModel:
    """The combination's layers from its lock; raises when the cut would not install the lock."""
    if not lock.ok:
        raise EnvbuildError(f"{combo.id}: cannot render without a lock ({lock.status})")
    layers: list[Layer] = []
    for ll in lock.layers:
        for name, pins in _cut(ll.name, text_of(ll.path)):
            # The header names only the layer's own content, so equal pins give equal bytes.
            body = f"# envbuild layer {name}: {len(pins)} pin(s) from the {ll.name} lock\n" + \
                "".join(block for _, block in (pins[n] for n in sorted(pins)))
            layers.append(Layer(name, ll.name, _stage(ll.name), _title(name, combo), _shares(name), body,
                                {n: v for n, (v, _) in sorted(pins.items())}))
    full = text_of(lock.full_lock)
    expected = {n: v for n, (v, _) in parse_lock(full).items()} if full else {}
    model = ImageModel(combo, base, lock.tools, tuple(layers), expected or installed(layers), lock.era,
                       lock.lock_hash or "", lock.torch_index, getattr(lock, "build_constraints", "") or "",
                       tuple(getattr(lock, "built_from_source", ()) or ()))
    check_installs_lock(model)
    return model


def installed(layers) -> dict[str, str]:
    """What installing the layers in order leaves (a later pin replaces an earlier one)."""
    env: dict[str, str] = {}
    for l in layers:
        env.update(l.packages)
    return env


def check_installs_lock(model: ImageModel) -> None:
    got = installed(model.layers)
    if got != model.expected:
        extra = sorted(set(got.items()) - set(model.expected.items()))
        missing = sorted(set(model.expected.items()) - set(got.items()))
        raise EnvbuildError(f"{model.combo.id}: the layers would not install the lock "
                            f"(extra {extra[:5]}, missing {missing[:5]})")


def expected_text(model: ImageModel) -> str:
    """The final environment as `name==version` lines (the in-image check's input)."""
    return "".join(f"{n}=={v}\n" for n, v in sorted(model.expected.items()))
