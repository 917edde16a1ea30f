"""`envbuild venv SELECTORS --wheelhouse DIR --out VENV`: a row's environment, exactly, on a node
without Docker or an index (envbuild.wheelhouse fetched its files): a venv of the node's Python
with every pin of the row's lock installed offline with --require-hashes, then checked to be the
lock and nothing else (the image's own check, dockerfiles/check-env.py).

--host-packages reuses a distribution the node already has (a cluster's torch module, the lent
H200's torch and nvidia-* libraries) only when it is the lock's pin: the same release, and a local
label only if it names the row's own accelerator variant (torch 2.11.0+cu130 for a cu130 row's
torch==2.11.0). Its files are linked into the venv one by one (never the node's whole
site-packages: nothing the lock does not name is visible), and every reuse is listed in
VENV/envbuild-row.json, which `envbuild probe --here --python-exe VENV/bin/python --results DIR`
turns into an in-place record of the row. A pin that is neither in the wheelhouse nor on the node
at that version stops it: that row cannot be judged on this node (said in a record with --results).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from packaging.utils import canonicalize_name

from .errors import INFRA, EnvbuildError, InfraError, InputError, TrustError
from .outcome import RECORD_ERROR
from .progress import Progress
from .fsutil import write_json_atomic
from .lockfile import parse_lock, pins_of
from .paths import templates_dir
from .probe.hardware import DEFAULT_PLATFORM, platform_machine
from .probe.vocab import jit_kernels_for
from .probe_exec import probe_importable

ROW_FILE = "envbuild-row.json"  # in the venv: which row it is, and what it took from the node
SCHEMA = 1  # of a wheelhouse's manifest (envbuild.wheelhouse writes it)
MANIFEST = "manifest.json"

_LIST_DISTS = r"""
import json, importlib.metadata as m
out = {}
for d in m.distributions():
    name = d.metadata["Name"]
    if not name or name in out:
        continue
    try:
        files = [str(f) for f in (d.files or [])]
    except Exception:
        files = []
    out[name] = {"version": d.version, "base": str(d.locate_file("")), "files": files}
print(json.dumps(out))
"""


class Refused(EnvbuildError):
    """The row cannot be judged on this node (a pin neither carried nor here at its version)."""

    exit_code = INFRA


def read_manifest(folder: str | os.PathLike) -> dict:
    path = Path(folder) / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(str(path), None, "wheelhouse", str(folder), "no manifest: not a wheelhouse "
                         "(make one with `envbuild wheelhouse SELECTORS --out DIR`)") from None
    except (OSError, ValueError) as e:
        raise InputError(str(path), None, "manifest", None, f"unreadable ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("rows"), dict):
        raise InputError(str(path), None, "schema", doc.get("schema") if isinstance(doc, dict) else None,
                         f"not a wheelhouse manifest of schema {SCHEMA}")
    return doc


def host_matches(pin: str, have: str | None, variant: str) -> bool:
    """The node's distribution stands for the pin: the same release, and a local label, if any, that
    names the row's own accelerator variant (torch 2.11.0+cu130 for a cu130 row's torch==2.11.0)."""
    if have is None:
        return False
    public, _, local = have.partition("+")
    pin_public, _, pin_local = pin.partition("+")
    return public == pin_public and (local == pin_local or (not pin_local and local == variant))


def node_dists(python: str) -> dict[str, dict]:
    """{canonical name: {version, base, files}} of the distributions `python` sees."""
    p = subprocess.run([python, "-c", _LIST_DISTS], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise InfraError("python-error", f"{python}: cannot list its distributions: {p.stderr.strip()[-300:]}")
    return {canonicalize_name(k): v for k, v in json.loads(p.stdout).items()}


def _inside(wheelhouse: Path, rel: object, field: str) -> None:
    """A path the manifest names must lie inside the wheelhouse (a manifest is input, not trusted)."""
    root = wheelhouse.resolve()
    ok = isinstance(rel, str) and rel and not os.path.isabs(rel)
    if ok:
        target = (root / rel).resolve()
        ok = target == root or root in target.parents
    if not ok:
        raise InputError(str(wheelhouse / MANIFEST), None, field, rel, "a path outside the wheelhouse")


def check_paths(wheelhouse: Path, row: dict) -> None:
    for i, rel in enumerate(row.get("locks") or []):
        _inside(wheelhouse, rel, f"locks[{i}]")
    for i, f in enumerate(row.get("files") or []):
        _inside(wheelhouse, f.get("file") if isinstance(f, dict) else f, f"files[{i}].file")


def check_lock(wheelhouse: Path, row: dict, signed_hash: str | None = None) -> str:
    """The row's layer files are the lock its `lock_hash` names: the wheelhouse's copy of the full
    lock has that sha256, and every pin of every layer is that lock's, byte for byte (hashes
    included: pip then installs only those files). With `signed_hash` (the row's lock hash in a
    verified table), the lock is that one too: a wheel tampered together with the wheelhouse's
    lock copy and manifest is refused instead of being recorded under the row's real lock hash.
    -> what was checked, in words."""
    where = str(wheelhouse / MANIFEST)
    rel = row.get("full_lock")
    if rel is None:
        if signed_hash is not None:
            raise InputError(where, None, "full_lock", None, "this wheelhouse keeps no copy of the row's full lock to "
                             "check against the signed table: make it again with this envbuild")
        return "lock not checked (the wheelhouse keeps no full lock: an older envbuild made it)"
    _inside(wheelhouse, rel, "full_lock")
    text = (wheelhouse / rel).read_text()
    got = hashlib.sha256(text.encode()).hexdigest()
    if got != row.get("lock_hash"):
        raise TrustError(f"{wheelhouse / rel}: sha256 {got[:16]}… is not the row's lock_hash "
                         f"{str(row.get('lock_hash'))[:16]}… (the wheelhouse was changed?)")
    if signed_hash is not None and signed_hash != got:
        raise TrustError(f"{where}: {row['combo'].get('id')}'s lock here is {got[:16]}…, the signed table's is "
                         f"{str(signed_hash)[:16]}…: not the row's lock")
    full = parse_lock(text)
    for lr in row.get("locks") or []:
        for name, (version, block) in parse_lock((wheelhouse / lr).read_text()).items():
            if full.get(name, (None, None))[1] != block:
                raise TrustError(f"{wheelhouse / lr}: {name}=={version} is not pinned as the row's full lock pins it")
    return "lock checked against the signed table" if signed_hash else "lock checked against its lock_hash"


def select_row(manifest: dict, sel) -> tuple[str, dict]:
    rows = [(rid, r) for rid, r in manifest["rows"].items() if sel.matches(
        **{k: r["combo"].get(k) for k in ("cuda", "python", "torch", "engine", "engine_version", "verl", "platform")})]
    if len(rows) != 1:
        have = ", ".join(sorted(manifest["rows"])) or "none"
        why = "no row" if not rows else f"{len(rows)} rows ({', '.join(r for r, _ in rows)})"
        raise InputError("command line", None, "selectors", sel.describe(),
                         f"{why} of the wheelhouse match; name one (the wheelhouse holds: {have})")
    return rows[0]


def plan_install(row: dict, wheelhouse: Path, dists: dict[str, dict] | None, variant: str) -> dict:
    """What to install from the wheelhouse and what to take from the node; Refused when a pin has
    neither."""
    reuse, install, missing = [], [], []
    for f in row["files"]:
        name, version = f["name"], f["version"]
        have = (dists or {}).get(name)
        if dists is not None and host_matches(version, have and have["version"], variant):
            reuse.append({"name": name, "version": have["version"], "pin": version})
        elif (wheelhouse / f["file"]).is_file():
            install.append(f)
        else:
            where = f"the node has {have['version']}" if have else "the node has none"
            missing.append(f"{name}=={version} ({where}; not in the wheelhouse)")
    if missing:
        raise Refused(f"{row['combo']['id']} cannot be judged on this node: " + "; ".join(missing[:8])
                      + (f"; … {len(missing) - 8} more" if len(missing) > 8 else ""))
    return {"reuse": reuse, "install": install}


def link_dist(dist: dict, site: Path) -> int:
    """Link one node distribution's files into the venv's site-packages, file by file."""
    base = Path(dist["base"])
    n = 0
    for rel in dist["files"]:
        src = (base / rel).resolve() if not os.path.isabs(rel) else Path(rel)
        try:
            inside = src.relative_to(base.resolve())
        except ValueError:
            continue  # a script in bin/, a data file outside site-packages: not importable, not needed
        if not src.exists():
            continue
        dst = site / inside
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            os.symlink(src, dst)
            n += 1
    return n


def _site_packages(venv: Path, python_version: str) -> Path:
    return venv / "lib" / f"python{python_version}" / "site-packages"


def _pip(venv: Path, args: list[str], timeout: float = 3600) -> None:
    p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                        "--no-input", *args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise InfraError("install-error", "pip install: " + (p.stderr or p.stdout).strip()[-1500:])


def materialize(row_id: str, row: dict, wheelhouse: Path, venv: Path, python: str, use_host: bool,
                compile_bytecode: bool = True, compile_kernels: bool = True) -> dict:
    with Progress(f"venv {row_id}: checking the node") as beat:
        return _materialize(row_id, row, wheelhouse, venv, python, use_host, compile_bytecode, compile_kernels, beat)


def _materialize(row_id: str, row: dict, wheelhouse: Path, venv: Path, python: str, use_host: bool,
                 compile_bytecode: bool, compile_kernels: bool, beat) -> dict:
    c = row["combo"]
    t0 = time.monotonic()
    ver = subprocess.run([python, "-c", "import sys, platform; print('%d.%d' % sys.version_info[:2]);"
                          "print(platform.machine()); print('-'.join(platform.libc_ver()))"],
                         capture_output=True, text=True, timeout=60).stdout.split()
    if len(ver) < 2:
        raise InfraError("python-error", f"{python}: does not answer")
    if ver[0] != c["python"]:
        raise Refused(f"{row_id} is a Python {c['python']} row; {python} is Python {ver[0]}")
    if ver[1] != platform_machine(c.get("platform") or DEFAULT_PLATFORM):
        raise Refused(f"{row_id} is a {c.get('platform')} row; this node is {ver[1]}")
    glibc = ver[2] if len(ver) > 2 else ""
    if row.get("glibc") and glibc.startswith("glibc-") and \
            tuple(map(int, glibc[6:].split("."))) < tuple(map(int, row["glibc"].split("."))):
        raise Refused(f"{row_id}'s wheels need glibc >= {row['glibc']}; this node has {glibc}")
    dists = node_dists(python) if use_host else None
    plan = plan_install(row, wheelhouse, dists, c["cuda"])
    if venv.exists() and any(venv.iterdir()):
        raise InputError("command line", None, "--out", str(venv), "exists and is not empty: name a new folder")
    beat.stage_to(f"venv {row_id}: linking {len(plan['reuse'])} node distributions", len(plan["reuse"]))
    subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=600)
    site = _site_packages(venv, ver[0])
    linked = sum(link_dist(dists[r["name"]], site) for r in plan["reuse"])
    t_link = time.monotonic()
    blocks = {}
    for rel in row["locks"]:
        for name, (_, block) in parse_lock((wheelhouse / rel).read_text()).items():
            blocks[canonicalize_name(name)] = block
    files = wheelhouse / "files"
    beat.stage_to(f"venv {row_id}: installing {len(plan['install'])} files (pip, offline, hash-checked)")
    wheels = [f for f in plan["install"] if f["kind"] == "wheel"]
    sdists = [f for f in plan["install"] if f["kind"] == "sdist"]
    for part, extra in ((wheels, []), (sdists, ["--no-build-isolation"])):
        if part:
            req = venv / f".envbuild-{'sdists' if extra else 'wheels'}.txt"
            req.write_text("".join(blocks[f["name"]] for f in part))
            _pip(venv, ["--no-index", "--find-links", str(files), "--require-hashes", "--no-deps", "--no-compile",
                        *extra, "-r", str(req)])
    t_install = time.monotonic()
    uncompiled: list[str] = []
    if compile_bytecode:
        beat.stage_to(f"venv {row_id}: compiling bytecode")
        # As the image's bytecode step does: the probe's first import would otherwise compile
        # every module it touches, one at a time (pip's own compile is serial: --no-compile above).
        p = subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", str(site)],
                           capture_output=True, text=True, timeout=3600)
        # A file that does not compile is left to the probe's import to judge; it is listed.
        uncompiled = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("***")][:5]
    t_bytecode = time.monotonic()
    # The lock, with the node's own versions where it was reused: nothing else may be there.
    expected = {n: v for n, (v, _) in ((n, x) for rel in row["locks"]
                                          for n, x in pins_of((wheelhouse / rel).read_text()).items())}
    expected.update({r["name"]: r["version"] for r in plan["reuse"]})
    kernels = jit_kernels_for(expected) if compile_kernels else []
    if kernels:
        beat.stage_to(f"venv {row_id}: compiling {', '.join(kernels)} ahead of time")
    jit = _compile_kernels(venv, kernels)
    t_kernels = time.monotonic()
    exp = venv / ".envbuild-expected.txt"
    exp.write_text("".join(f"{n}=={v}\n" for n, v in sorted(expected.items())))
    check = subprocess.run([str(venv / "bin" / "python"), str(templates_dir() / "check-env.py"), str(exp)],
                           capture_output=True, text=True, timeout=300)
    if check.returncode != 0:
        raise InfraError("install-error", f"{venv}: the environment is not the lock:\n{check.stderr.strip()[-2000:]}")
    info = {"row": row_id, "combo": c, "lock_hash": row.get("lock_hash"), "era": row.get("era"),
            "wheelhouse": str(wheelhouse.resolve()), "python": python, "glibc": glibc,
            "reused": sorted(plan["reuse"], key=lambda r: r["name"]), "installed": len(plan["install"]),
            "linked_files": linked, "check": check.stdout.strip(),
            "seconds": {"link": round(t_link - t0, 2), "install": round(t_install - t_link, 2),
                        "bytecode": round(t_bytecode - t_install, 2), "kernels": round(t_kernels - t_bytecode, 2),
                        "total": round(time.monotonic() - t0, 2)}}
    if uncompiled:
        info["uncompiled"] = uncompiled
    if jit:
        info["kernels"] = jit
    write_json_atomic(venv / ROW_FILE, info)
    return info


def _compile_kernels(venv: Path, kernels: list[str]) -> dict:
    """The image's kernel step (envbuild_probe.jit), run by the venv's Python: what the engine's
    library would compile with nvcc on the first probe is compiled now, for every architecture
    torch has kernels for, or not at all (it says why). Never fails the venv."""
    if not kernels:
        return {}
    with probe_importable() as (tmp, env):
        p = subprocess.run([str(venv / "bin" / "python"), "-m", "envbuild_probe.jit", "build", *kernels],
                           capture_output=True, text=True, env=env, cwd=tmp, timeout=3600)
    for line in reversed(p.stdout.strip().splitlines()):
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict):
            return {str(k): str(v) for k, v in said.items()}
    tail = ((p.stdout + p.stderr).strip().splitlines() or [f"exit {p.returncode}"])[-1]
    return {k: f"not built ({tail[:300]})" for k in kernels}


def read_row(python_exe: str) -> dict | None:
    """The row a venv materializes, from the interpreter's folder (VENV/bin/python -> VENV)."""
    p = Path(python_exe).absolute().parent.parent / ROW_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- CLI


def record_in_place(results: str, row: dict, level: str, verdict: dict, python_exe: str):
    """The record of a probe of a materialized row on this node: the row (its planned combination and
    lock hash), no image, and where it ran (record.place: host, GPU, driver, glibc, CUDA runtime, the
    node's distributions it reused)."""
    from . import host
    from .outcome import Verdict, record_status
    from .record import IN_PLACE, Record, machine_info, write_record

    gpus = host.gpus()
    v = Verdict.of(verdict, level)
    place = {"kind": IN_PLACE, "host": platform.node(), "python": python_exe, "glibc": row.get("glibc"),
             "gpu": [g["name"] for g in gpus], "driver": gpus[0]["driver"] if gpus else None,
             "sm": gpus[0]["sm"] if gpus else None, "cuda_runtime": v.versions.get("torch_cuda"),
             "reused": row.get("reused", []), "wheelhouse_lock_hash": row.get("lock_hash"),
             "materialize_seconds": row.get("seconds", {})}
    status, cause, detail = record_status({level: v})
    rec = Record(combo=row["combo"], stage="probe", status=status, cause=cause, detail=detail,
                 lock_hash=row.get("lock_hash"), probe={level: v},
                 machine={**machine_info(), "gpu": gpus[0]["name"] if gpus else None}, place=place)
    rec.timings = {"probe": v.wall_seconds, "materialize": (row.get("seconds") or {}).get("total")}
    write_record(results, rec)
    return rec


def record_refusal(results: str, row: dict, why: str) -> None:
    from .record import Record, machine_info, write_record

    write_record(results, Record(combo=row["combo"], stage="probe", status=RECORD_ERROR, cause="host-mismatch",
                                 detail=why, lock_hash=row.get("lock_hash"), machine=machine_info(),
                                 place={"kind": "in-place", "host": platform.node(), "refused": why}))
