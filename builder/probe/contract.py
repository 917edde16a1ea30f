"""Level 2, contract (no GPU needed): verl's engine-facing modules import, the engine offers the API
the gpu level uses, and native extensions match the installed torch."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import time

from .classify import classify_exception
from .verdict import FAIL, NEEDS_GPU, NOT_APPLICABLE, PASS, Verdict

# verl folders whose modules touch the rollout engine (discovered by name, not listed by hand).
ENGINE_FACING = ("rollout", "sharding_manager")


def gpu_present() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except BaseException:
        return False


def discover_verl_modules() -> list[str] | None:
    """Every module under a verl folder named *rollout* or *sharding_manager*, found on disk
    without importing verl (its __init__ may be what is broken)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    mods = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(dirpath, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if not any(any(key in p for key in ENGINE_FACING) for p in parts):
            continue
        if "__init__.py" not in filenames:
            continue  # not a package: never imported by verl
        mods.append(".".join(["verl", *parts]))
        for f in sorted(filenames):
            if f.endswith(".py") and f != "__init__.py":
                mods.append(".".join(["verl", *parts, f[:-3]]))
    return mods


def verl_declared() -> set[str]:
    """Normalised names of what the installed verl declares it needs (no extras)."""
    import importlib.metadata as md

    out = set()
    for req in md.requires("verl") or []:
        if re.search(r"\bextra\s*==", req):
            continue
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if m:
            out.add(re.sub(r"[-.]+", "_", m.group(1)).lower())
    return out


def _undeclared_optional(e: BaseException, declared: set[str] | None) -> str | None:
    """The missing top-level module, when a verl module itself imports a package that is not
    installed at all and that verl does not declare: an optional dependency of a feature
    (verl 0.4's async chat server needs `openai`), not a broken stack. A missing submodule of an
    installed package is API drift, and an ImportError raised inside another package is that
    package's problem: both stay failures. A missing *declared* dependency fails pip check."""
    if declared is None or not isinstance(e, ModuleNotFoundError) or not e.name:
        return None
    top = e.name.split(".")[0]
    if e.name != top or importlib.util.find_spec(top) is not None or top.lower() in declared:
        return None
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    spec = importlib.util.find_spec("verl")
    roots = list(spec.submodule_search_locations or []) if spec else []
    if last and any(os.path.abspath(last).startswith(os.path.abspath(r) + os.sep) for r in roots):
        return top
    return None


def _import_check(v: Verdict, name: str, engine: str, on_gpu: bool, declared: set[str] | None = None) -> None:
    t0 = time.perf_counter()
    try:
        importlib.import_module(name)
    except BaseException as e:  # SystemExit and friends included: an import must not end the probe
        if isinstance(e, KeyboardInterrupt):
            raise
        c = classify_exception(e, engine)
        status = FAIL if (c.status == NEEDS_GPU and on_gpu) else c.status
        opt = _undeclared_optional(e, declared) if status == FAIL else None
        if opt:
            status, c.cause = NOT_APPLICABLE, "optional-dependency"
            c.detail = f"needs {opt}, which verl does not declare (an optional feature's dependency)"
        v.add(f"import:{name}", status, c.detail, c.cause, time.perf_counter() - t0)
        return
    v.add(f"import:{name}", PASS, seconds=time.perf_counter() - t0)


def run_contract(v: Verdict, expect: dict, engine: str) -> None:
    on_gpu = gpu_present()
    # verl: the package itself, then every engine-facing module.
    mods = discover_verl_modules()
    if mods is None:
        if expect.get("verl"):
            v.add("verl-modules", FAIL, "verl is not installed", "module-missing")
        else:
            v.add("verl-modules", NOT_APPLICABLE, "verl is not installed and not expected")
    else:
        with v.timed("import_verl"):
            _import_check(v, "verl", engine, on_gpu)
            if v.checks[-1].status == PASS:
                declared = verl_declared()
                for m in mods:
                    _import_check(v, m, engine, on_gpu, declared)
        n = {s: sum(1 for c in v.checks if c.name.startswith("import:verl.") and c.status == s)
             for s in (PASS, FAIL, NEEDS_GPU, NOT_APPLICABLE)}
        v.metrics["verl_modules"] = {"discovered": len(mods), **n}

    # The engine's entry points and the API features the gpu level relies on.
    from .engines import api_checks
    with v.timed("engine_api"):
        for name, status, detail, cause in api_checks(engine):
            if status == NEEDS_GPU and on_gpu:
                status = FAIL
            v.add(f"api:{name}", status, detail, cause)

    # Native extensions against the installed torch.
    from .extcheck import check_extensions
    t0 = time.perf_counter()
    try:
        rep = check_extensions()
    except BaseException as e:
        c = classify_exception(e, engine)
        v.add("native-extensions", "error", c.detail, "probe-error", time.perf_counter() - t0)
        return
    v.metrics["native_extensions"] = rep.scanned
    by_kind: dict[str, list] = {}
    for p in rep.problems:
        by_kind.setdefault(p.kind, []).append(p)
    for kind, ps in sorted(by_kind.items()):
        status = FAIL
        lines = [f"{p.dist}: {p.file}: {p.what}" for p in ps[:20]]
        if len(ps) > 20:
            lines.append(f"... and {len(ps) - 20} more")
        v.add(f"native:{kind}", status, "\n".join(lines), kind)
    if not rep.problems:
        detail = ", ".join(f"{k} ({n} .so)" for k, n in sorted(rep.scanned.items()) if n) or "no native extensions found"
        if rep.driver_libs:
            detail += f"; from the driver at run time: {', '.join(sorted(rep.driver_libs))}"
        if rep.optional_missing:
            detail += f"; optional plugins' libraries absent: {', '.join(sorted(rep.optional_missing))}"
        v.add("native-extensions", PASS, detail, seconds=time.perf_counter() - t0)
    else:
        v.timings["native_extensions"] = round(time.perf_counter() - t0, 4)
