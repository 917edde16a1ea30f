"""What the static contracts read of verl, for one engine (standard library only; the contract
level runs it in a child process while it imports, the census over another environment's
folders): verl's engine-facing modules found on disk, each module's owner, and the import and
call-signature findings of those the engine's combination judges, each with its scope.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import asdict

from .features import CORE
from .hardware import torch_build_kind
from .ownership import applies, owner, verl_extras
from .registry import rollout_registry
from .scope import Scoper
from .staticcalls import Trees, check_calls
from .staticimports import ModuleIndex, check_module
from .vocab import ENGINE, ENGINE_SPECS

# verl folders whose modules touch the rollout engine (discovered by name, not listed by hand),
# and verl's patches of transformers' models (where transformers drift breaks first).
ENGINE_FACING = ("rollout", "sharding_manager")
FACING_PATHS = (("models", "transformers"),)


def discover_verl_modules(root: str | None = None) -> list[str] | None:
    """Every module under a verl folder named *rollout* or *sharding_manager*, or under
    verl/models/transformers, found on disk without importing verl (its __init__ may be what is
    broken)."""
    if root is None:
        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = list(spec.submodule_search_locations)[0]
    mods = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(dirpath, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if not any(any(key in p for key in ENGINE_FACING) for p in parts) and \
                not any(tuple(parts[:len(fp)]) == fp for fp in FACING_PATHS):
            continue
        if "__init__.py" not in filenames:
            continue  # not a package: never imported by verl
        mods.append(".".join(["verl", *parts]))
        for f in sorted(filenames):
            if f.endswith(".py") and f != "__init__.py":
                mods.append(".".join(["verl", *parts, f[:-3]]))
    return mods


def static_report(engine: str, paths: list[str] | None = None, accelerator: str | None = None) -> dict:
    """Ownership of verl's modules and the static import contract of this engine's ones
    (standard library only; run by a child process while the parent imports)."""
    t0 = time.perf_counter()
    # Version guards over any engine's, torch's or transformers' version are evaluated.
    index = ModuleIndex(paths, known={m for e in ENGINE_SPECS for m in e.modules | {e.dist}} | {"torch"})
    loc = index.find("verl")
    if loc is None or loc.kind != "package":
        return {"owners": {}, "static": {}, "targets": [], "seconds": 0.0}

    def installed(top: str) -> bool:
        return index.find(top) is not None

    extras = verl_extras(paths)
    spec = ENGINE[engine]
    # The engine's version where the files are (another environment's folders: the census).
    engine_version = (index.version(spec.dist) if paths is not None else _dist_version(spec.dist)) \
        if spec.versioned else None
    facing = set(discover_verl_modules(loc.dirs[0]) or [])
    # The engine's own modules, torch and transformers (every stack's; hf's engine) are what
    # verl's are read against.
    targets = sorted(set(spec.modules) | {"torch", "transformers"})
    owners, static, module_scopes = {}, {}, {}
    if accelerator is None:  # the torch build here says which kind it is (the census passes its row's)
        tv = index.find("torch.version")
        accelerator = torch_build_kind(_read(tv.path)) if tv and tv.path else None
    scoper = Scoper(loc.dirs[0], index.version("verl") if paths is not None else _dist_version("verl"), accelerator)
    trees = Trees()  # the engine's files, parsed once for every call into them
    needles = sorted({t.encode() for e in ENGINE_SPECS for t in e.modules | e.tokens})
    for mod in _all_modules(loc.dirs[0]):
        if mod not in facing and not _mentions(index, mod, needles):
            continue  # neither engine-facing nor touching an engine: no syntax tree needed
        o = owner(mod, index, installed, extras)
        judged, cause, detail = applies(o, engine, installed, engine_version)
        if mod in facing or o.engines or o.backends or o.extras:
            owners[mod] = {"engines": sorted(o.engines), "backends": sorted(o.backends), "why": o.why,
                           "judged": judged, "cause": cause, "detail": detail}
        if judged and (mod in facing or engine in o.engines):
            before = len(index.unreachable)
            r = check_module(index, mod, set(targets))
            if r is not None:
                finds = [dict(asdict(f), scope=scoper.scope(mod, f.line, f.function)) for f in r[0]]
                calls = [dict(asdict(c), scope=scoper.scope(mod, c.line, True))
                         for c in check_calls(index, mod, set(targets), trees)]
                static[mod] = {"checked": r[1], "findings": finds, "unreachable": index.unreachable[before:],
                               "calls": calls}
        if mod in facing and judged:
            sc = scoper.scope(mod)  # what a failing import of the module would be scoped to
            if sc["scope"] != CORE or sc["from"] != "undetermined":
                module_scopes[mod] = sc
    return {"owners": owners, "static": static, "targets": targets, "module_scopes": module_scopes,
            "registry": rollout_registry(loc.dirs[0]), "engine": engine,
            "seconds": round(time.perf_counter() - t0, 4)}


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return ""


def _mentions(index: ModuleIndex, mod: str, needles: list[bytes]) -> bool:
    loc = index.find(mod)
    try:
        with open(loc.path, "rb") as f:
            text = f.read()
    except (OSError, AttributeError):
        return False
    return any(n in text for n in needles)


def _dist_version(name: str) -> str | None:
    import importlib.metadata as md
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _all_modules(root: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        if "__init__.py" not in filenames:
            dirnames[:] = []
            continue
        rel = os.path.relpath(dirpath, root)
        parts = ["verl"] + ([] if rel == "." else rel.split(os.sep))
        out.append(".".join(parts))
        out += [".".join(parts + [f[:-3]]) for f in sorted(filenames) if f.endswith(".py") and f != "__init__.py"]
    return out
