"""`envbuild lock`: hash-pinned, era-consistent locks, one per image layer.

A combination has one era: its newest pinned release (torch, engine, verl) + grace. It is
resolved once, whole, as of that era (`uv pip compile --exclude-newer`), exactly as someone
installing that stack on that day would have got it; the layers are then cut out of that one
resolution, least volatile first, and never change a pin of it:
- torch: torch and what torch pins exactly (`==`: its CUDA wheels, triton) - a function of
  (CUDA variant, torch, Python, platform) alone, so combinations that share those share the
  heavy layer byte for byte;
- engine: the engine and what it pins exactly (torchvision, xformers, ...);
- verl: verl and everything else (the packages that float with the era).
The full lock is the union of the layers.

The era is a way to reproduce a day, not a fact about compatibility: when uv's explanation says
a package was filtered by the cutoff (every release of it on the index is newer: deleted and
uploaded again, say), the cutoff is lifted for that package only, the lift is recorded
("X taken from <date>: ..."), and `unsatisfiable` is said only of what fails without it.

Packages that have no wheel for the image's platform are built from source at install time;
the lock lists them and writes build constraints (the same resolution's pins plus the common
build backends as of the era) so that their builds stay inside the lock, or refuses them
(`--no-build`, with `--allow-build NAME` exceptions).

Index URLs (which may carry credentials) reach uv through its environment, never its argv.
Results, including an `unsatisfiable` verdict, are cached by the hash of their inputs: a second
lock of the same plan does no network work.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from .errors import EnvbuildError, InfraError
from .fsutil import write_atomic, write_json_atomic
from .backtrack import STALE_YEARS, admitted_floor, stale_pins
from .lockfile import dependents_of, layer_text, parse_lock
from .lockmodel import (LayerLock, LockResult, era, exact_pins, platform_tag, sha256_of, split_layers,
                        wheel_tags)
from .outcome import LOCK_OK, LOCK_VERDICTS
from .index import Metadata, check_reachable
from .index_config import TorchSource, redact, torch_source
from .uvcompile import (FILTERED_RE, PINNED_BY_RE, YANKED_RE, compile_requirements, name_re, unreachable_hint,
                        uv_version)
from .matrix import Matrix
from .values import Combo

from .paths import cache_dir
from .scratch import scratch_dir
from .probe.vocab import ENGINE, VERL_RUNTIME_EXTRAS, dist_of, engine_index
from .probe.hardware import platform_machine

LAYERS = ("torch", "engine", "verl")
# Build backends an sdist commonly asks for; pinned as of the era in the build constraints.
BUILD_BACKENDS = ("setuptools", "wheel", "hatchling", "flit-core", "poetry-core", "setuptools-scm",
                  "packaging", "cython", "ninja", "cmake", "scikit-build-core", "pybind11")
MAX_RELAX = 12  # lifts of the cutoff for one combination; each is one more resolution
MAX_FLOOR_ROUNDS = 3  # resolutions spent on floors for stale backtracks (backtrack.py)

# --------------------------------------------------------------------------- resolving


class Locker:
    """Locks combinations; one instance shares its metadata and cache across a plan (thread-safe:
    `envbuild lock -j N` locks N combinations at once)."""

    def __init__(self, matrix: Matrix, meta: Metadata | None = None, cache: Path | None = None,
                 no_build: bool = False, allow_build: tuple[str, ...] = ()):
        self.matrix = matrix
        self.meta = meta or Metadata()
        self.cache = cache or cache_dir() / "locks"
        self.cache.mkdir(parents=True, exist_ok=True)
        self.no_build = no_build
        self.allow_build = tuple(sorted(canonicalize_name(n) for n in allow_build))
        self._uv_version: str | None = None
        self._lk = threading.Lock()
        self.uv_runs = 0  # how many resolutions actually ran (0 on a fully cached plan)
        self.unreachable: dict[str, str] = {}  # index URL -> why: asked once per run
        self._asked: dict[str, threading.Event] = {}
        self.argv: list[list[str]] = []  # every uv command line run (tests check no secret is on it)

    @property
    def uv_version(self) -> str:
        with self._lk:
            if self._uv_version is None:
                self._uv_version = uv_version()
            return self._uv_version

    def requirements(self, c: Combo, src: TorchSource) -> tuple[list[str], list[tuple[str, str]]]:
        """(requirements, releases that date the combination)."""
        # A non-default variant is pinned by its local version, so no later resolution can
        # swap in the default index's build of the same release.
        torch_req = f"torch=={c.torch}" + (f"+{c.cuda}" if src.url else "")
        reqs, dated = [torch_req], [("torch", c.torch)]
        if ENGINE[c.engine].versioned:
            extras = self.meta.engine_extras(c.engine, c.engine_version)
            reqs.append(dist_of(c.engine) + (f"[{','.join(extras)}]" if extras else "") + f"=={c.engine_version}")
            dated.append((dist_of(c.engine), c.engine_version))
        vx = self.meta.provided_extras("verl", c.verl, VERL_RUNTIME_EXTRAS)
        reqs.append("verl" + (f"[{','.join(vx)}]" if vx else "") + f"=={c.verl}")
        dated.append(("verl", c.verl))
        # The top of the stack first: uv prefers the newest versions for the dependencies of the
        # requirements it meets first. torch first made verl 0.9.1's lock take fsspec 2026.9.0 for
        # torch, then datasets 1.2.1 (the newest without an fsspec cap) and tqdm 4.49.0, which the
        # transformers of that era cannot import: a broken stack nobody installing verl got
        # (`pip install verl==0.9.1` takes datasets 5.0.1, fsspec 2026.6.0).
        return reqs[::-1], dated

    def lock(self, c: Combo, out_dir: str | os.PathLike | None = None) -> LockResult:
        try:
            src = torch_source(c.cuda, c.torch, self.meta, self.matrix.pytorch_index, platform_machine(c.platform))
        except InfraError as e:
            return LockResult(c, e.cause, e.message)
        res = LockResult(c, "ok", torch_index=redact(src.url) if src.url else "default")
        reqs, dated = self.requirements(c, src)
        try:
            when = era([self.meta.released(p, v) for p, v in dated], self.matrix.grace_days)
        except InfraError as e:
            return LockResult(c, e.cause, e.message, torch_index=res.torch_index)
        except EnvbuildError as e:  # a release that is not on the index
            return LockResult(c, "unsatisfiable", str(e), torch_index=res.torch_index)
        res.era = when
        key = sha256_of(json.dumps({"reqs": reqs, "era": when, "python": c.python, "platform": platform_tag(c.glibc, c.platform),
                               "torch_index": res.torch_index, "uv": self.uv_version, "v": 4,
                               "no_build": self.no_build, "allow_build": self.allow_build,
                               **({"engine_index": engine_index(c.engine)} if engine_index(c.engine) else {})}))
        d, cached = self._cached(key, lambda: self._gate(src) or self._resolve(reqs, when, c, src))
        if d["status"] == "index-unreachable" and not d["text"].startswith(("the PyTorch index", "the package index")):
            d = {**d, "text": unreachable_hint(d["text"], src)}
        res.cached = cached
        res.relaxed = d.get("relaxed", [])
        if d["status"] != "ok":
            res.status, res.detail = d["status"], d["text"]
            return res
        text = d["text"]
        res.built_from_source = d.get("built_from_source", [])
        res.build_constraints = d.get("build_constraints", "")
        full = parse_lock(text)
        try:
            torch_pins = exact_pins(self._torch_requires(src, full["torch"][0]), c.python, platform=c.platform)
            engine_pins = (exact_pins(self.meta.get(dist_of(c.engine), c.engine_version)["requires_dist"], c.python,
                                      self.meta.engine_extras(c.engine, c.engine_version), c.platform)
                           if ENGINE[c.engine].versioned else {})
        except InfraError as e:
            res.status, res.detail = e.cause, e.message
            return res
        plat = platform_tag(c.glibc, c.platform)
        headers = {
            # The torch and engine headers name only what fixes their content, so combinations share them.
            "torch": f"# envbuild torch layer: torch {full['torch'][0]} and what it pins exactly\n"
                     f"# for Python {c.python}, {plat}",
            "engine": f"# envbuild engine layer: {c.engine} {c.engine_version} and what it pins exactly\n"
                      f"# for Python {c.python}, {plat}",
            "verl": f"# envbuild verl layer for {' '.join(reqs)}: everything the layers below do not hold\n"
                    f"# resolved as of {when} (uv --exclude-newer) for Python {c.python}, {plat}",
        }
        for name, names in split_layers(full, torch_pins, dist_of(c.engine) if ENGINE[c.engine].versioned else None,
                                        engine_pins).items():
            body = layer_text(full, names, headers[name])
            res.layers.append(LayerLock(name, body, sha256_of(body), {n: full[n][0] for n in names}, when, key))
        tools, tcached = self._cached(
            sha256_of(json.dumps({"tools": self.uv_version, "python": c.python, "platform": plat})),
            lambda: self._compile([f"uv=={self.uv_version.split()[1]}"], "", c, None, {}))
        if tools["status"] != "ok":
            res.status, res.detail = tools["status"], tools["text"]
            return res
        res.tools = tools["text"]
        res.cached = res.cached and tcached
        res.full_lock = text
        res.lock_hash = sha256_of(text)
        if out_dir is not None:
            self.write(res, Path(out_dir))
        return res

    def _torch_requires(self, src: TorchSource, version: str) -> list[str]:
        """Requires-Dist of the torch wheel the resolution chose (from the PyTorch index when it
        came from there: its CUDA wheels are that variant's)."""
        meta = self.meta if src.url is None else self._pytorch_meta(src.url)
        return meta.get("torch", version)["requires_dist"]

    def _pytorch_meta(self, url: str) -> Metadata:
        with self._lk:
            cache = self.__dict__.setdefault("_pt_meta", {})
            if url not in cache:
                cache[url] = Metadata(index=url, snapshot=os.devnull)
            return cache[url]

    def write(self, res: LockResult, out_dir: Path) -> Path:
        d = out_dir / res.combo.id
        for layer in res.layers:
            p = write_atomic(d / f"{layer.name}.txt", layer.text())
            layer.path = str(p)
        if res.full_lock is not None and not os.path.exists(res.full_lock):
            res.full_lock = str(write_atomic(d / "full.txt", res.full_lock))
        if res.tools:
            write_atomic(d / "tools.txt", res.tools)
        if res.build_constraints:
            write_atomic(d / "build-constraints.txt", res.build_constraints)
        write_json_atomic(d / "lock.json", res.to_dict())
        return d

    # -- one resolution, with the era's artefacts lifted ------------------------------------

    def _cached(self, key: str, compute) -> tuple[dict, bool]:
        cpath = self.cache / f"{key}.json"
        if cpath.exists():
            try:
                return json.loads(cpath.read_text()), True
            except (OSError, ValueError):
                pass
        d = compute()
        if d["status"] in (LOCK_OK, *LOCK_VERDICTS):  # verdicts, stable under --exclude-newer: cache
            write_json_atomic(cpath, d)
        return d, False

    def _gate(self, src) -> dict | None:
        """Before a resolution that needs the network: is the variant's PyTorch index there? Asked
        once per run and index (the other combinations wait for the answer): a dead index costs one
        quick question, not uv's three retries per combination."""
        if src is None or not src.url:
            return None
        with self._lk:
            ev = self._asked.get(src.url)
            first = ev is None
            if first:
                ev = self._asked[src.url] = threading.Event()
        if first:
            try:
                check_reachable(src.url)
            except InfraError as e:
                self.unreachable[src.url] = unreachable_hint(e.message, src)
            finally:
                ev.set()
        else:
            ev.wait(60)
        why = self.unreachable.get(src.url)
        return {"status": "index-unreachable", "text": why} if why else None

    def _resolve(self, reqs: list[str], when: str, c: Combo, src: TorchSource) -> dict:
        d, pl = self._resolve_era(reqs, when, c, src)
        if d["status"] == "ok":
            d, pl = self._floor_stale(d, pl, reqs, when, c, src)
        if d["status"] != "ok":
            return d
        return self._sdists(d, pl, c)

    def _resolve_era(self, reqs: list[str], when: str, c: Combo, src: TorchSource) -> tuple[dict, dict]:
        """(requirements answer, pylock answer) as of the era, its artefacts lifted."""
        lifts: dict[str, str] = {}  # package -> its own cutoff
        taken: dict[str, str] = {}  # package -> the upload date it needed
        yanked: list[str] = []  # notes: yanked pins taken as pip takes them
        reqs = list(reqs)
        for _ in range(MAX_RELAX + 1):
            # The same resolution as pylock.toml (which names every file of every pin) runs
            # beside it: it tells which pins have no wheel, at no cost in wall time.
            with ThreadPoolExecutor(2) as pool:
                side = pool.submit(self._compile, reqs, when, c, src, dict(lifts), fmt="pylock")
                d = self._compile(reqs, when, c, src, lifts)
                pl = side.result()
            if d["status"] != "unsatisfiable":
                break
            pins = self._yanked_pins(d["text"], reqs)
            if pins:
                for req, note in pins:
                    reqs.append(req)  # stated directly: uv then takes it (hash-pinned like the rest)
                    yanked.append(note)
                continue
            new = {}
            for m in FILTERED_RE.finditer(d["text"]):
                name = canonicalize_name(m.group(1))
                date = m.group(3) or (None if name in lifts else self._first_upload_after(name, when))
                if date and date > taken.get(name, when) and date > new.get(name, ""):
                    new[name] = date  # a first lift, or a later one when the first was not enough
            if not new:
                break  # unsatisfiable without the cutoff's artefacts too (or nothing left to lift)
            for name, date in new.items():
                taken[name] = date
                lifts[name] = (dt.date.fromisoformat(date) + dt.timedelta(days=1)).isoformat()
        notes = [f"{name} taken from {date}: no earlier release on the index satisfies the requirement "
                 f"(era {when})" for name, date in sorted(taken.items())] + yanked
        d["relaxed"] = notes if d["status"] == "ok" else []
        d["era"] = when
        if d["status"] == "unsatisfiable" and notes:
            d["text"] += "\n(unsatisfiable with the cutoff lifted for " + ", ".join(sorted(lifts)) + " too)"
        return d, pl

    def _floor_stale(self, d: dict, pl: dict, reqs: list[str], when: str, c: Combo,
                     src: TorchSource) -> tuple[dict, dict]:
        """Stale backtracks (backtrack.py) get a floor and the stack is resolved again; the floored
        answer is taken only if it backtracks nothing else that far (a floor on antlr4 once took
        hydra-core back to 0.11). A floor the stack cannot meet is dropped, the old pin kept.
        Both outcomes are said in the lock's notes."""
        if pl["status"] != "ok":
            return d, pl
        before = stale_pins(pl["text"], when, self.meta)
        via, pins = dependents_of(d["text"]), parse_lock(d["text"])
        floors = {}
        for n, (v, date, _) in before.items():
            f = admitted_floor(n, via.get(n, []), pins, when, self.meta)
            if f:
                floors[n] = (v, date, f)
        kept_old: list[str] = []
        for _ in range(MAX_FLOOR_ROUNDS):
            if not floors:
                break
            d2, pl2 = self._resolve_era(reqs + [f"{n}>={f}" for n, (_, _, f) in sorted(floors.items())], when, c, src)
            if d2["status"] not in ("ok", "unsatisfiable") or pl2["status"] not in ("ok", "unsatisfiable"):
                return (d2 if d2["status"] != "ok" else pl2), pl2  # infrastructure: no answer (not cached)
            worse = sorted(set(stale_pins(pl2["text"], when, self.meta)) - set(before)) if d2["status"] == "ok" else []
            if d2["status"] == "ok" and not worse:
                new = parse_lock(d2["text"])
                d2["relaxed"] = d2.get("relaxed", []) + [
                    f"{n} {new[n][0] if n in new else '(none)'} taken, not {v} of {date}: uv had backtracked {n} "
                    f"to a release over {STALE_YEARS} years older than the era {when} (asked: {n}>={f})"
                    for n, (v, date, f) in sorted(floors.items())] + kept_old
                return d2, pl2
            why = (f"with it uv backtracks {', '.join(worse)} that far instead" if worse else
                   "no release of it from those years fits this stack")
            named = set(floors) if worse else ({n for n in floors if name_re(n).search(d2["text"])} or set(floors))
            for n in sorted(named):
                v, date, f = floors.pop(n)
                kept_old.append(f"{n} {v} of {date} kept, over {STALE_YEARS} years older than the era {when}: "
                                f"a floor ({n}>={f}) was tried, {why}")
        d["relaxed"] = d.get("relaxed", []) + kept_old
        return d, pl

    @staticmethod
    def _yanked_pins(text: str, reqs: list[str]) -> list[tuple[str, str]]:
        """(requirement, note) for each yanked release a dependency pins exactly (what
        `pip install` of the stack gets, with a warning), not yet stated directly."""
        out = []
        have = {canonicalize_name(r.split("==")[0]) for r in reqs if "==" in r}
        for m in YANKED_RE.finditer(text):
            name, version, reason = canonicalize_name(m.group(1)), m.group(2), m.group(3)
            by = re.search(PINNED_BY_RE.format(name=re.escape(m.group(1)), version=re.escape(version)), text)
            if name in have or not by:
                continue  # asked for directly already, or not an exact pin of a dependency
            have.add(name)
            who = f"{by.group(1)} {by.group(2)}" if by.group(1) else by.group(3)
            out.append((f"{name}=={version}", f"{name} {version} is yanked"
                        + (f" ({reason.strip()})" if reason else "") + f"; taken because {who} "
                        "pins it exactly, as pip install does (with a warning)"))
        return out

    def _first_upload_after(self, name: str, when: str) -> str | None:
        try:
            dates = sorted(f["upload-time"][:10] for f in self.meta.files(name)
                           if f.get("upload-time") and f["upload-time"][:10] > when)
        except InfraError:
            return None
        return dates[0] if dates else None

    def _sdists(self, d: dict, pl: dict, c: Combo) -> dict:
        """Find the pins that have no wheel for the image (from uv's pylock.toml of the same
        resolution: no request of ours); pin their builds or refuse them."""
        when = d["era"]
        tags = wheel_tags(c.python, c.glibc, c.platform)
        if pl["status"] != "ok":
            return pl
        built = []
        for pkg in tomllib.loads(pl["text"]).get("packages", []):
            wheels = [w.get("name") or w.get("url", "").rsplit("/", 1)[-1] for w in pkg.get("wheels", [])]
            if not any(parse_wheel_filename(w)[3] & tags for w in wheels if w.endswith(".whl")):
                built.append(f"{canonicalize_name(pkg['name'])}=={pkg['version']}")
        built.sort()
        d["built_from_source"] = built
        d["build_constraints"] = ""
        if not built:
            return d
        refused = [b for b in built if b.split("==")[0] not in self.allow_build]
        if self.no_build and refused:
            return {"status": "needs-build", "relaxed": d.get("relaxed", []), "text":
                    f"{', '.join(refused)} ha{'s' if len(refused) == 1 else 've'} no wheel for CPython {c.python} "
                    f"on {platform_tag(c.glibc, c.platform)}: building from source is refused (--no-build); allow a "
                    f"package with --allow-build NAME, or drop --no-build to build it with pinned build "
                    f"dependencies"}
        # Build constraints: this resolution's pins, then the common backends as of the era.
        full = parse_lock(d["text"])
        pins = {n: v for n, (v, _) in full.items()}
        backends = self._compile([b for b in BUILD_BACKENDS if b not in pins], when, c, None, {}, hashes=False)
        if backends["status"] == "ok":
            for n, (v, _) in parse_lock(backends["text"]).items():
                pins.setdefault(n, v)
        cons = "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))
        d["build_constraints"] = ("# envbuild build constraints: the builds of "
                                  + ", ".join(built) + " use these versions (uv --build-constraints)\n" + cons)
        return d

    def _compile(self, reqs: list[str], when: str, c: Combo, src: TorchSource | None, lifts: dict[str, str],
                 hashes: bool = True, fmt: str = "requirements") -> dict:
        """One `uv pip compile` (uvcompile.compile_requirements), counted and its argv kept."""
        with self._lk:
            self.uv_runs += 1

        def seen(cmd):
            with self._lk:
                self.argv.append(list(cmd))
        with scratch_dir("envbuild-lock-") as tmp:  # swept after a kill -9 (scratch.py)
            return compile_requirements(reqs, when, c.python, platform_tag(c.glibc, c.platform),
                                        src.url if src is not None else None, lifts, tmp, hashes=hashes,
                                        fmt=fmt, on_argv=seen, engine_index=engine_index(c.engine))
