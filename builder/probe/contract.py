"""Level 2, contract (no GPU needed): verl's engine-facing modules import, the engine offers the API
the gpu level uses, and native extensions match the installed torch."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

from .classify import classify_exception, device_branch
from .envguard import guard
from .staticreport import discover_verl_modules, static_report
from .verdict import ERROR, FAIL, NEEDS_GPU, NEEDS_HOME, NEEDS_NETWORK, NOT_APPLICABLE, PASS, Verdict
from .vocab import ENGINE, VERSION_GATED
from .features import CORE

def gpu_present() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except BaseException:
        return False


def verl_declared() -> set[str]:
    """Normalised names of what the installed verl declares it needs (no extras)."""
    import importlib.metadata as md

    out = set()
    try:
        reqs = md.requires("verl") or []
    except md.PackageNotFoundError:  # verl on the path without package metadata (a source checkout)
        return out
    for req in reqs:
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


def _import_check(v: Verdict, name: str, engine: str, on_gpu: bool, declared: set[str] | None = None,
                  own: bool = False, scope: dict | None = None) -> None:
    """Import one module under the environment guard. `own`: the module belongs to this
    combination's engine, so an error naming another engine is a failure, not not-applicable."""
    t0 = time.perf_counter()
    with guard() as needs:
        try:
            importlib.import_module(name)
            err = None
        except BaseException as e:  # SystemExit and friends included: an import must not end the probe
            if isinstance(e, KeyboardInterrupt):
                raise
            err = e
    check = f"import:{name}"
    if err is None:
        c = v.add(check, PASS, seconds=time.perf_counter() - t0)
        _caveats(v, c, name, needs)
        return
    c = classify_exception(err, engine)
    status = FAIL if (c.status == NEEDS_GPU and on_gpu) else c.status
    branch = device_branch(err) if not on_gpu and status in (FAIL, NOT_APPLICABLE) else None
    if branch:
        # The module took the branch for a host without a GPU (another engine's CPU kernels, say):
        # a GPU host never runs it, so this host cannot judge the module.
        status, c.cause = NEEDS_GPU, "cpu-only-branch"
        c.detail = f"fails in the branch taken without a GPU, {branch}: {c.detail}"
    if own and status == NOT_APPLICABLE and c.cause == "other-engine":
        status, c.cause = FAIL, "engine-module-broken"
        c.detail = f"a module of this combination's engine ({engine}) fails: {c.detail}"
    opt = _undeclared_optional(err, declared) if status == FAIL else None
    if opt:
        status, c.cause = NOT_APPLICABLE, "optional-dependency"
        c.detail = f"needs {opt}, which verl does not declare (an optional feature's dependency)"
    if status == NEEDS_NETWORK and needs.network:
        c.detail = f"fetches {', '.join(needs.network[:3])} at import; fails offline"
    sc = scope if status == FAIL and scope else {"scope": CORE, "from": None}
    detail = c.detail if sc["scope"] == CORE and not sc.get("why") else f"{c.detail}\nscope: {sc['why']}"
    chk = v.add(check, status, detail, c.cause, time.perf_counter() - t0, sc["scope"], sc.get("from"))
    _caveats(v, chk, name, needs)


def _caveats(v: Verdict, c, module: str, needs) -> None:
    """Environment needs seen while importing: caveats on the verdict, named on the check."""
    notes = []
    if needs.network or c.status == NEEDS_NETWORK:
        what = ", ".join(needs.network[:3]) or c.detail
        v.caveat(NEEDS_NETWORK, c.name, module, what)
        notes.append(f"fetches {what} at import" + (" (works offline)" if c.status == PASS else ""))
    if needs.home or c.status == NEEDS_HOME:
        what = ", ".join(needs.home[:3]) or c.detail
        v.caveat(NEEDS_HOME, c.name, module, what)
        notes.append(f"writes {what} at import")
    if notes and c.status == PASS:
        c.detail = "; ".join(notes)


def run_contract(v: Verdict, expect: dict, engine: str, background: "Background | None" = None) -> None:
    on_gpu = gpu_present()
    bg = background or Background.start(engine)
    # verl: the package itself, then every engine-facing module; another engine's or a missing
    # backend's modules (by path and imports, ownership.py) are not applicable and not imported.
    mods = discover_verl_modules()
    static = None
    if mods is None:
        if expect.get("verl"):
            v.add("verl-modules", FAIL, "verl is not installed", "module-missing")
        else:
            v.add("verl-modules", NOT_APPLICABLE, "verl is not installed and not expected")
    else:
        with v.timed("import_verl"):
            _import_check(v, "verl", engine, on_gpu)  # the child reads syntax trees meanwhile
            verl_ok = v.checks[-1].status in (PASS, NEEDS_NETWORK, NEEDS_HOME)
            static = bg.static()
            owners = static.get("owners", {})
            if verl_ok:
                declared = verl_declared()
                for m in mods:
                    o = owners.get(m)
                    if o and not o["judged"]:
                        v.add(f"import:{m}", NOT_APPLICABLE, o["detail"], o["cause"])
                        continue
                    _import_check(v, m, engine, on_gpu, declared, own=bool(o and engine in o["engines"]),
                                  scope=static.get("module_scopes", {}).get(m))
        n = {s: sum(1 for c in v.checks if c.name.startswith("import:verl.") and c.status == s)
             for s in (PASS, FAIL, NEEDS_GPU, NOT_APPLICABLE, NEEDS_NETWORK, NEEDS_HOME)}
        v.metrics["verl_modules"] = {"discovered": len(mods), **n}
        if static is not None:
            with v.timed("static_imports"):
                _static_checks(v, static)

    # The engine's entry points and the API features the gpu level relies on, where they apply.
    from .engines import api_checks
    with v.timed("engine_api"):
        for name, status, detail, cause in api_checks(engine, on_gpu=on_gpu):
            if status == NEEDS_GPU and on_gpu:
                status = FAIL
            v.add(f"api:{name}", status, detail, cause)

    # Native extensions against the installed torch (scanned by a child process meanwhile).
    t0 = time.perf_counter()
    try:
        rep = bg.extensions()
    except BaseException as e:
        c = classify_exception(e, engine)
        v.add("native-extensions", ERROR, c.detail, "probe-error", time.perf_counter() - t0)
        return
    v.timings["native_extensions_wait"] = round(time.perf_counter() - t0, 4)
    v.timings["native_extensions"] = bg.ext_seconds
    v.metrics["native_extensions"] = rep.scanned
    by_kind: dict[str, list] = {}
    for p in rep.problems:
        by_kind.setdefault(p.kind, []).append(p)
    for kind, ps in sorted(by_kind.items()):
        lines = [f"{p.dist}: {p.file}: {p.what}" for p in ps[:20]]
        if len(ps) > 20:
            lines.append(f"... and {len(ps) - 20} more")
        v.add(f"native:{kind}", FAIL, "\n".join(lines), kind)
    if not rep.problems:
        detail = ", ".join(f"{k} ({n} .so)" for k, n in sorted(rep.scanned.items()) if n) or "no native extensions found"
        if rep.driver_libs:
            detail += f"; from the driver at run time: {', '.join(sorted(rep.driver_libs))}"
        if rep.optional_missing:
            detail += f"; optional plugins' libraries absent: {', '.join(sorted(rep.optional_missing))}"
        for dist, files in sorted(rep.other_torch.items()):
            detail += f"; {dist}: {len(files)} libraries built for other torch releases, never loaded, not read"
        v.add("native-extensions", PASS, detail, seconds=bg.ext_seconds)


def _line(f: dict) -> str:
    return (f"{f['file']}:{f['line']} {'(in a function) ' if f['function'] else ''}"
            f"from {f['module']} import {f['name']}: {f['where']}" if f["name"] else
            f"{f['file']}:{f['line']} import {f['module']}: {f['where']}")


def _scoped_name(base: str, scope: str) -> str:
    return base if scope == CORE else f"{base}@{scope}"


def _scope_note(findings: list[dict]) -> str:
    whys = list(dict.fromkeys((f.get("scope") or {}).get("why") for f in findings if (f.get("scope") or {}).get("why")))
    return ("\nscope: " + "\nscope: ".join(whys[:3])) if whys else ""


def _static_checks(v: Verdict, static: dict) -> None:
    """One `static:<module>` check per verl module of this engine, and one per scope its findings
    are reached under (`static:<module>@<scope>`: a failure only the runs that opt into the scope
    meet). Where the import check judged the module (pass or fail), the import wins for what runs
    at import; the static finding is shown beside it (a passing import overrules a static miss at
    module level; a failing one agrees with it). Imports inside functions are only ever judged here."""
    imports = {c.name[len("import:"):]: c for c in v.checks if c.name.startswith("import:")}
    _registry_check(v, static)
    for mod, res in sorted(static.get("static", {}).items()):
        finds = res["findings"]
        imp = imports.get(mod)
        decided = imp is not None and imp.status in (PASS, FAIL)
        lines, failing = [], {}
        for f in finds:
            line = _line(f)
            if f.get("gated"):
                v.caveat(VERSION_GATED, f"static:{mod}", mod, f"{line} (only runs behind a version guard "
                         "envbuild could not evaluate)")
                continue
            lines.append(line)
            if f["function"] or not decided or imp.status == FAIL:
                failing.setdefault((f.get("scope") or {}).get("scope") or CORE, []).append(f)
        if imp is not None and imp.status == FAIL and lines:
            imp.detail = f"{imp.detail}\nstatic: " + "\nstatic: ".join(lines[:5])
        _call_checks(v, mod, res.get("calls") or [])
        for scope, fs in sorted(failing.items(), key=lambda kv: kv[0] != CORE):
            v.add(_scoped_name(f"static:{mod}", scope), FAIL, "\n".join(_line(f) for f in fs[:20]) + _scope_note(fs),
                  "static-import-missing", scope=scope, scope_from=(fs[0].get("scope") or {}).get("from"))
        if CORE in failing:
            continue
        if lines and not failing:
            v.add(f"static:{mod}", PASS, f"import check judged it ({imp.status}); static: " + "; ".join(lines[:5]))
        else:
            skipped = res.get("unreachable") or []
            v.add(f"static:{mod}", PASS, f"{res['checked']} imports of {', '.join(static['targets'])} resolve"
                  + (f" on verl's core path; broken only under {', '.join(s for s in sorted(failing))}"
                     if failing else "")
                  + (f"; {len(skipped)} in code the installed versions never run not read "
                     f"({', '.join(skipped[:3])})" if skipped else ""))


def _registry_check(v: Verdict, static: dict) -> None:
    """verl's trainer selects the rollout by name from its registry: an engine it has no entry for
    cannot run through verl at this release, whatever its modules import (core)."""
    reg, engine = static.get("registry"), static.get("engine")
    if not reg or not engine:
        return
    names = ENGINE[engine].rollout
    ok = any(n.startswith(p) for n in reg["names"] for p in names)
    have = ", ".join(reg["names"])
    if ok:
        v.add("registry:rollout", PASS, f"verl's rollout registry ({reg['where']}) has {have}")
    else:
        v.add("registry:rollout", FAIL, f"verl's rollout registry ({reg['where']}) has {have}: no "
              f"{'/'.join(names)}, so actor_rollout_ref.rollout.name={names[0]} cannot run at this release",
              "rollout-not-registered", scope_from="code")


def _call_checks(v: Verdict, mod: str, calls: list[dict]) -> None:
    """The static call-signature contract of one module: a call into the engine with arguments
    the installed definition does not take fails when it runs (often inside an abort or wake-up
    path that swallows the TypeError: the feature silently does nothing). One check per scope."""
    by_scope: dict[str, list[dict]] = {}
    for c in calls:
        line = f"{c['file']}:{c['line']} {c['callee']}(): {c['problem']} (defined at {c['where']})"
        if c.get("gated"):
            v.caveat(VERSION_GATED, f"calls:{mod}", mod, f"{line} (only runs behind a version guard "
                     "envbuild could not evaluate)")
        else:
            by_scope.setdefault((c.get("scope") or {}).get("scope") or CORE, []).append({**c, "text": line})
    for scope, cs in sorted(by_scope.items(), key=lambda kv: kv[0] != CORE):
        v.add(_scoped_name(f"calls:{mod}", scope), FAIL, "\n".join(c["text"] for c in cs[:20]) + _scope_note(cs),
              "call-signature-drift", scope=scope, scope_from=(cs[0].get("scope") or {}).get("from"))


class Background:
    """The contract level's CPU-bound reading (syntax trees, ELF files) in child processes, so it
    runs on another core while this process imports torch and verl. Falls back to running here
    when a child cannot start or says nothing usable."""

    def __init__(self, engine: str):
        self.engine = engine
        self.procs: dict[str, tuple] = {}
        self.ext_seconds = 0.0
        self.from_child: set[str] = set()  # jobs whose answer came from a child process

    @classmethod
    def start(cls, engine: str, parallel: bool = True) -> "Background":
        b = cls(engine)
        if parallel:
            for job in ("static", "ext"):
                b._spawn(job)
        return b

    def _spawn(self, job: str) -> None:
        from .spawn import child_env, package
        try:
            proc = subprocess.Popen([sys.executable, "-m", f"{package()}.worker", job, self.engine,
                                     os.pathsep.join(sys.path)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd="/")
        except OSError:
            return
        self.procs[job] = (proc, time.perf_counter())

    def _result(self, job: str, timeout: float = 300):
        if job not in self.procs:
            return None
        proc, _t0 = self.procs.pop(job)
        try:
            out, _err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
        try:
            got = json.loads(out) if proc.returncode == 0 else None
        except ValueError:
            return None
        self.from_child.add(job)
        return got

    def static(self) -> dict:
        got = self._result("static")
        return got if isinstance(got, dict) and "owners" in got else static_report(self.engine)

    def extensions(self):
        from .extcheck import ExtProblem, ExtReport, check_extensions
        t0 = time.perf_counter()
        got = self._result("ext")
        if isinstance(got, dict) and "scanned" in got:
            self.ext_seconds = got.get("seconds", 0.0)
            return ExtReport(got["scanned"], [ExtProblem(**p) for p in got["problems"]],
                             set(got["driver_libs"]), set(got["optional_missing"]), got.get("other_torch") or {})
        rep = check_extensions()
        self.ext_seconds = round(time.perf_counter() - t0, 4)
        return rep
