"""Which engine or optional backend a verl module belongs to: by its dotted path
(verl.workers.rollout.vllm_rollout.*, *sglang*, *megatron*), by the packages it imports at module
level (read from its syntax tree), and by verl's own extras (a package verl lists only under
`extra == "sglang"` belongs to SGLang). Never by error text: a vLLM module whose import error
names something else is still vLLM's, and the combination's own engine modules are always judged.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from dataclasses import dataclass

from .classify import OPTIONAL_BACKENDS
from .staticimports import ModuleIndex, module_imports
from .vocab import ENGINE_SPECS, engine_of_module

# Path tokens of engines and optional backends (module names split at "." and "_").
ENGINE_TOKENS = {tok: e.name for e in ENGINE_SPECS for tok in e.tokens}
_ONLY_FOR = re.compile(r"(" + "|".join(sorted(ENGINE_TOKENS)) + r")_v_?(\d+(?:_\d+)*)")
BACKEND_TOKENS = {"megatron": "megatron", "mcore": "megatron", "trtllm": "tensorrt_llm", "ascend": "torch_npu",
                  "npu": "torch_npu", "mindspeed": "mindspeed"}


@dataclass
class Owner:
    engines: set[str]  # engines this module needs
    backends: set[str]  # optional backends / extras it needs (top-level module names)
    why: str  # "path" | "imports X" | "verl extra Y"
    only_for: dict[str, str] | None = None  # verl's copy for one engine release: {"vllm": "0.5.4"}
    extras: dict[str, str] | None = None  # packages of verl's optional extras it imports -> the extra


def _norm(name: str) -> str:
    return re.sub(r"[-.]+", "_", name).lower()


def verl_extras(paths: list[str] | None = None) -> dict[str, str]:
    """Top-level name of a package verl lists only under an extra -> that extra (verl's metadata
    on `paths`, or this interpreter's)."""
    if paths is None:
        try:
            reqs = md.requires("verl") or []
        except md.PackageNotFoundError:
            return {}
    else:
        dist = next((d for d in md.distributions(path=paths) if _norm(d.metadata["Name"] or "") == "verl"), None)
        reqs = (dist.requires or []) if dist else []
    base, extra = set(), {}
    for r in reqs:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", r)
        if not m:
            continue
        name = _norm(m.group(1))
        e = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", r)
        if e:
            extra.setdefault(name, e.group(1))
        else:
            base.add(name)
    return {k: v for k, v in extra.items() if k not in base}


def owner(dotted: str, index: ModuleIndex, installed, extras: dict[str, str]) -> Owner:
    """`installed(top)` says whether a top-level module can be found (without importing it)."""
    engines, backends, why, from_extras = set(), set(), [], {}
    for tok in re.split(r"[._]", dotted.lower()):
        if tok in ENGINE_TOKENS:
            engines.add(ENGINE_TOKENS[tok])
        elif tok in BACKEND_TOKENS:
            backends.add(BACKEND_TOKENS[tok])
    if engines or backends:
        why.append("module path")
    only_for = {}
    for part in dotted.split("."):  # verl/third_party/vllm/vllm_v_0_5_4: chosen at run time by version
        m = _ONLY_FOR.fullmatch(part)
        if m:
            only_for[ENGINE_TOKENS[m.group(1)]] = m.group(2).replace("_", ".")
    for ref in module_imports(index, dotted):
        if ref.function or ref.conditional:
            continue  # only what runs at import decides what the module needs
        top = ref.module.split(".")[0]
        eng = engine_of_module(top)
        if eng:
            if eng not in engines:
                engines.add(eng)
                why.append(f"imports {top} (line {ref.line})")
        elif top in OPTIONAL_BACKENDS and not installed(top):
            backends.add(top)
            why.append(f"imports {top} (line {ref.line})")
        elif _norm(top) in extras and top != "torch" and not installed(top):
            # (torch is every combination's base, whichever extra of verl happens to pin it)
            ex = extras[_norm(top)]
            if ex in ENGINE_TOKENS:
                engines.add(ENGINE_TOKENS[ex])
            else:
                from_extras[top] = ex
            why.append(f"imports {top}, which verl lists under its extra {ex!r} (line {ref.line})")
    return Owner(engines, backends, "; ".join(why), only_for or None, from_extras or None)


def applies(o: Owner, engine: str, installed, engine_version: str | None = None) -> tuple[bool, str, str]:
    """(judged?, cause, detail) for a module of owner `o` in a combination of `engine`."""
    other = sorted(o.engines - {engine})
    if other:
        return False, "other-engine", f"belongs to {', '.join(other)} ({o.why}); this combination's engine is {engine}"
    want = (o.only_for or {}).get(engine)
    if want and not (engine_version or "").split("+")[0].startswith(want):
        return False, "other-engine-release", (f"verl's copy for {engine} {want}, used only with that release; "
                                               f"installed {engine} {engine_version or 'none'}")
    missing = sorted(b for b in o.backends if not installed(b))
    if missing:
        return False, "optional-backend", f"needs {', '.join(missing)} ({o.why}): optional backend not installed"
    missing = sorted(t for t in (o.extras or {}) if not installed(t))
    if missing:
        return False, "optional-dependency", (f"needs {', '.join(missing)}, of verl's optional extra "
                                              f"{', '.join(sorted({o.extras[t] for t in missing}))} ({o.why})")
    return True, "", ""
