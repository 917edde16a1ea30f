"""`envbuild build`: plan -> lock -> render -> build (BuildKit) -> push -> probe -> record.

One result record per combination (envbuild.record). Combinations build concurrently (-j N)
and independently: one failing never stops the others. Every image gets two tags: the
readable one (`verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11`) and that plus the content hash
of its rendered context; an image whose content tag already exists locally or in the
registry is not rebuilt, which is also how a rerun after Ctrl-C resumes.

What overlaps (issue #17). The base does not depend on the lock: each distinct base (one per
--base spec, per CUDA image for nvidia/auto) is resolved once, in the background from the start
of the run (a debootstrap takes minutes), shared by every combination and thread
(BaseFutures); a combination waits for it only when it renders, and a base error becomes the
render-stage error of every combination that needed it. Once the image is built, the push (an
upload of GBs) and the probe (which runs the local image) run at once. Their record:
  - the probe's verdicts are always kept (record.probe), whatever the push did;
  - a failing verdict (fail, timeout) decides: stage probe, status fail, the probe's cause; a
    push that failed as well is named in the detail (a verdict outranks infrastructure, as in
    probe_run.record_status);
  - otherwise a failed push decides, as before the overlap: stage push, status error, its cause
    (daemon-error; internal-error for a bug in the push path), the probe's outcome in the detail;
  - otherwise the probe decides (stage probe), or, without --probe, stage build, ok.
A record claims a digest only when the push succeeded. timings keep push and probe apart and add
push_probe_wall (the pair's wall time: push + probe - push_probe_wall is what the overlap saved)
and base_wait (how long the combination waited for its base after its lock).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as WaitTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .docker import pusher_for
from .errors import EnvbuildError, InfraError, InputError, exit_of_records
from .base import BaseRef, bootstrap, resolve_base
from .docker import detect, secret_files
from .image import REPOSITORY_ENV, add_repository_arg, build_labels, image_refs, registry_host, repository_from_args
from .index import Metadata, default_index_url, pytorch_index_url, pytorch_root
from .lock import Locker
from .matrix import add_selector_args, matrix_from_args, plan_from_args
from .record import Record, latest_by_combo, write_record
from .render import render_combo
from .probe_run import Target, VerdictCache, expect_of, probe_image_levels, probe_levels, record_status
from .vocab import DEFAULT_PLATFORM, PROBE_CHOICES, PROBE_PLAN, host_platform

CA_ENV = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
DEFAULT_RESULTS = "results"
DEFAULT_TIMEOUT = 3600

# Failure classes, most specific first: (cause, status, pattern over the build's last lines).
# status "fail" is a verdict on the stack; "error" is infrastructure (never a verdict).
CLASSES: list[tuple[str, str, re.Pattern]] = [
    ("daemon-error", "error", re.compile(
        r"Cannot connect to the Docker daemon|Is the docker daemon running|error during connect|"
        r"no space left on device|failed to (solve|create LLB|compute cache key|export)|"
        r"Error response from daemon|failed to read dockerfile|rpc error: code = Unavailable", re.I)),
    ("unsatisfiable", "fail", re.compile(
        r"No solution found when resolving|ResolutionImpossible|conflicting dependencies|"
        r"Because .* depends on .*we can conclude", re.I)),
    ("missing-wheel", "fail", re.compile(
        r"GLIBC_\d+\.\d+'? not found|no wheels? (with|for) a matching (platform|Python)|"
        r"is not a supported wheel on this platform|doesn't have a source distribution or wheel|"
        r"has no (usable )?wheels?|Distribution not found|No matching distribution found|"
        r"only has wheels for the following platforms?|hash mismatch.*platform", re.I)),
    ("compile-failure", "fail", re.compile(
        r"Failed to build|Building wheel for .* (did not run successfully|failed)|"
        r"error: command '.*(gcc|g\+\+|nvcc|cc|c\+\+)' failed|CMake Error|subprocess-exited-with-error|"
        r"Failed to (build|prepare) .* (wheel|metadata)|ninja: build stopped|No CUDA runtime is found|"
        r"CUDA_HOME environment variable is not set|nvcc: not found|gcc: not found", re.I)),
    ("download-failure", "error", re.compile(
        r"Failed to (download|fetch)|error sending request|Connection (reset|refused|aborted)|"
        r"Read timed out|timed out|ConnectionError|HTTP status (server|client) error|"
        r"\b(403|404|5\d\d)\b.*(Forbidden|Not Found|Server Error|Bad Gateway)|CERTIFICATE_VERIFY_FAILED|"
        r"certificate verify failed|invalid peer certificate|UnknownIssuer|Temporary failure in name resolution|"
        r"Network is unreachable|dns error|hash mismatch|THESE PACKAGES DO NOT MATCH THE HASHES|"
        r"IncompleteRead|unexpected end of file|Could not fetch URL", re.I)),
]
STEP_RE = re.compile(r"^#(\d+) \[([^\]]+)\] (.*)$")
ERR_RE = re.compile(r"^#(\d+) ERROR:? (.*)$")


# --------------------------------------------------------------------------- build output


class StepTracker:
    """Follows BuildKit's plain output: which step runs, which one failed."""

    def __init__(self, on_step: Callable[[str], None] | None = None):
        self.titles: dict[str, str] = {}
        self.current = ""
        self.failed: str | None = None
        self.on_step = on_step

    def __call__(self, line: str) -> None:
        line = line.rstrip("\n")
        m = STEP_RE.match(line)
        if m:
            n, pos, text = m.groups()
            if n not in self.titles:
                self.titles[n] = f"[{pos}] {text}"
                self.current = self.titles[n]
                if self.on_step:
                    self.on_step(self.current)
            return
        m = ERR_RE.match(line)
        if m and self.failed is None:
            self.failed = self.titles.get(m.group(1), f"step #{m.group(1)}")


def classify(tail: list[str], *, timed_out: bool = False, rc: int = 1) -> tuple[str, str]:
    """-> (cause, status) from the last lines of a failed build."""
    if timed_out:
        return "timeout", "error"
    text = "\n".join(tail)
    for cause, status, rx in CLASSES[1:]:  # the stack's own failures first...
        if rx.search(text):
            return cause, status
    if CLASSES[0][2].search(text) and not re.search(r"executor failed running|did not complete successfully", text):
        return "daemon-error", "error"  # ...then the engine's, when no RUN step failed
    if rc in (125, 126, 127) or not re.search(r"^#\d+ ", text, re.M):
        return "daemon-error", "error"  # the client never got a build going
    return "build-failure", "fail"


def failure_detail(tail: list[str], step: str | None, n: int = 25) -> str:
    # Drop BuildKit's progress noise so the last lines are the tool's own output.
    keep = [ln for ln in tail if not re.match(r"^#\d+ (sha256:|extracting|exporting|\d+\.\d+ \s*$)", ln)]
    where = f"failing step: {step}\n" if step else ""
    return where + "\n".join(keep[-n:])


# --------------------------------------------------------------------------- progress


class PlainProgress:
    """One line per state change (CI logs)."""

    def __init__(self, combos, stream=None):
        self.stream = stream or sys.stdout
        self.t0 = {c.id: None for c in combos}
        self.lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, cid: str, state: str, note: str = "") -> None:
        with self.lock:
            if self.t0.get(cid) is None and state not in ("queued",):
                self.t0[cid] = time.monotonic()
            el = time.monotonic() - self.t0[cid] if self.t0.get(cid) else 0.0
            print(f"[{time.strftime('%H:%M:%S')}] {cid}: {state} ({el:.0f}s)" + (f" {note}" if note else ""),
                  file=self.stream, flush=True)

    def step(self, cid: str, step: str) -> None:
        pass  # plain output reports states only; the step is in the log

    def message(self, text: str) -> None:
        with self.lock:
            print(text, file=self.stream, flush=True)


class RichProgress(PlainProgress):
    """A live table: per combination, state, current step and elapsed time."""

    def __init__(self, combos, stream=None):
        super().__init__(combos, stream)
        self.rows = {c.id: ["queued", "", None, None] for c in combos}  # state, note, start, end

    def __enter__(self):
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=self.stream)
        self.live = Live(self._table(), console=self.console, refresh_per_second=2, transient=False,
                         get_renderable=self._table)
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)
        return False

    def _table(self):
        from rich.table import Table

        t = Table(box=None, pad_edge=False)
        for col in ("combination", "state", "elapsed", "step"):
            t.add_column(col, no_wrap=col != "step", overflow="ellipsis")
        now = time.monotonic()
        colors = {"ok": "green", "reused": "green", "fail": "red", "error": "yellow"}
        for cid, (state, note, start, end) in self.rows.items():
            el = "" if start is None else f"{(end or now) - start:5.0f}s"
            color = colors.get(state.split()[0], "cyan")
            t.add_row(cid, f"[{color}]{state}[/]", el, note[:80])
        return t

    def update(self, cid, state, note=""):
        with self.lock:
            row = self.rows[cid]
            if row[2] is None and state != "queued":
                row[2] = time.monotonic()
            row[0], row[1] = state, note
            if state.split()[0] in ("ok", "reused", "fail", "error", "interrupted"):
                row[3] = time.monotonic()

    def step(self, cid, step):
        with self.lock:
            self.rows[cid][1] = step

    def message(self, text):
        self.console.print(text, markup=False, highlight=False)


# --------------------------------------------------------------------------- orchestration


@dataclass
class Options:
    results: Path
    repo: str  # image repository, e.g. envbuild/verl or 127.0.0.1:5000/envbuild/verl
    in_registry: bool  # repo is in a registry (checked for existing content tags, pushed to)
    push: bool = False
    base: str = "auto"
    suite: str = "bookworm"
    probe: str = "none"
    jobs: int = 1
    timeout: float = DEFAULT_TIMEOUT
    ca_bundle: str | None = None
    index_url: str | None = None
    torch_index_root: str | None = None  # the PyTorch index in force (index.pytorch_root): the build's secret
    rebuild: bool = False
    no_cache: bool = False
    compression: str = "gzip"  # of pushed layers: gzip | zstd (envbuild.docker.pusher_for)


def default_ca_bundle() -> str | None:
    for var in CA_ENV:
        p = os.environ.get(var)
        if p and os.path.isfile(p):
            return p
    return None


class BaseFutures:
    """The bases builds start FROM, each resolved once and shared (thread-safe memoised futures).

    `resolve(combo)` makes a combination's base; `key(combo)` names which base that is, so
    combinations with the same key share one resolution (its result or its error). `start`
    begins a resolution in a thread of its own (so nothing queues behind a running build) and
    returns its future; calling the object waits for it. `shared(key, thunk)` memoises any other
    resolution under a key of its own (auto's fallback to the one bootstrap base)."""

    def __init__(self, resolve: Callable[[object], BaseRef], key: Callable[[object], str] | None = None):
        self.resolve = resolve
        self.key = key or (lambda combo: combo.id)
        self._futs: dict[str, Future] = {}
        self._threads: list[threading.Thread] = []
        self._lk = threading.Lock()

    def _future(self, key: str, thunk) -> Future:
        with self._lk:
            f = self._futs.get(key)
            if f is not None:
                return f
            f = self._futs[key] = Future()
            # daemon: a run that exits early is never held by it; run() waits for it explicitly
            t = threading.Thread(target=self._run, args=(f, thunk), name=f"envbuild-base-{len(self._futs)}",
                                 daemon=True)
            self._threads.append(t)
        t.start()
        return f

    @staticmethod
    def _run(f: Future, thunk) -> None:
        if not f.set_running_or_notify_cancel():
            return
        try:
            f.set_result(thunk())
        except BaseException as e:  # noqa: BLE001 - handed to every waiter, raised there
            f.set_exception(e)

    def start(self, combo) -> Future:
        return self._future(self.key(combo), lambda: self.resolve(combo))

    def shared(self, key: str, thunk):
        return self._future(key, thunk).result()

    def __call__(self, combo) -> BaseRef:
        return self.start(combo).result()

    def running(self) -> int:
        with self._lk:
            return sum(1 for f in self._futs.values() if not f.done())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every resolution started; True when none is left running."""
        with self._lk:
            threads = list(self._threads)
        end = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in threads)


class _Background:
    """One call in a thread of its own: (True, result) or (False, the exception) on join(), and
    the seconds it took."""

    def __init__(self, fn, name: str):
        self._fn, self._out, self.seconds = fn, None, 0.0
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def _run(self):
        t = time.monotonic()
        try:
            self._out = (True, self._fn())
        except BaseException as e:  # noqa: BLE001 - re-raised or recorded by the caller
            self._out = (False, e)
        self.seconds = time.monotonic() - t

    def alive(self) -> bool:
        return self._t.is_alive()

    def join(self):
        self._t.join()
        return self._out


class Builder:
    """Runs the pipeline for one combination at a time; safe to use from several threads.
    lock_fn / render_fn / base_fn / probe_fn / engine are injectable (tests use fakes). base_fn is
    a BaseFutures (shared bases) or any callable combo -> Base, which then resolves once per
    combination, still in the background from prefetch()."""

    def __init__(self, opts: Options, engine, *, lock_fn, render_fn, base_fn, probe_fn=None,
                 progress=None, stop: threading.Event | None = None, verdict_cache: VerdictCache | None = None):
        self.o, self.engine = opts, engine
        if base_fn is not None and not isinstance(base_fn, BaseFutures):
            base_fn = BaseFutures(base_fn)
        self.lock_fn, self.render_fn, self.base_fn, self.probe_fn = lock_fn, render_fn, base_fn, probe_fn
        self.verdict_cache = verdict_cache
        self.progress = progress or PlainProgress([])
        self.stop = stop or threading.Event()

    def prefetch(self, combos) -> None:
        """Start resolving the bases of these combinations now: they do not depend on the lock."""
        if self.base_fn is None:
            return
        for c in combos:
            if self.stop.is_set():
                return
            self.base_fn.start(c)

    def _await_base(self, combo) -> BaseRef | None:
        """The combination's base (raising its resolution's error); None when stopped meanwhile."""
        f = self.base_fn.start(combo)
        if not f.done():
            self.progress.update(combo.id, "waiting for base")
        while True:
            try:
                return f.result(timeout=0.5)
            except WaitTimeout:
                if self.stop.is_set():
                    return None

    # The pipeline. Returns the record written, or None when interrupted (no verdict).
    def build_one(self, combo):

        o, cid = self.o, combo.id
        timings: dict[str, float] = {}
        rec = Record(combo=combo.to_dict(), stage="lock", status="error")
        logrel = f"logs/{cid}.log"
        log_path = o.results / logrel

        def finish(stage, status, cause=None, detail=""):
            if self.stop.is_set() and status != "ok":
                self.progress.update(cid, "interrupted")
                return None
            rec.stage, rec.status, rec.cause, rec.detail, rec.timings = stage, status, cause, detail, timings
            write_record(o.results, rec)
            self.progress.update(cid, status if status != "ok" else ("reused" if (rec.image or {}).get("reused") else "ok"),
                                 f"{cause}" if cause else "")
            return rec

        # 1. lock
        self.progress.update(cid, "locking")
        t = time.monotonic()
        try:
            lr = self.lock_fn(combo, o.results / "locks")
        except InfraError as e:
            timings["lock"] = time.monotonic() - t
            return finish("lock", "error", e.cause, str(e))
        timings["lock"] = round(time.monotonic() - t, 3)
        if lr.status != "ok":
            status = "fail" if lr.status == "unsatisfiable" else "error"
            return finish("lock", status, lr.status, lr.detail)
        rec.lock_hash = lr.lock_hash
        rec.lock_notes = {k: list(getattr(lr, k, None) or []) for k in ("relaxed", "built_from_source")
                          if getattr(lr, k, None)}

        # 2. base (resolving since the run started: wait for it) + render
        t = time.monotonic()
        try:
            base = self._await_base(combo)
            timings["base_wait"] = round(time.monotonic() - t, 3)
            if base is None:
                return finish("render", "error", "interrupted")
            self.progress.update(cid, "rendering")
            rec.base = base.to_dict()
            if base.kind != "nvidia":
                # The matrix's CUDA devel image and its glibc describe the nvidia base only: the
                # record states what was built on (the glibc is read from the image by the probe).
                rec.combo.update(base_image=base.pinned, glibc="")
            rendered = self.render_fn(combo, lr, base, o.results / "contexts")
        except InfraError as e:
            return finish("render", "error", e.cause, str(e))
        except EnvbuildError as e:
            return finish("render", "error", "render-error", str(e))
        timings["render"] = round(time.monotonic() - t, 3)
        chash = rendered.content_hash
        # Per platform: the id (the plain tag for the default platform); the plain tag of several
        # platforms becomes their manifest list after the run (write_indexes).
        content_ref, readable_ref = image_refs(o.repo, combo.id, chash)
        rec.image = {"ref": content_ref, "tags": [content_ref, readable_ref], "content_hash": chash,
                     "id": None, "digest": None, "size": None, "reused": False}

        # 3. build, unless this content is already built (locally or in the registry)
        if self.stop.is_set():
            return finish("render", "error", "interrupted")
        t = time.monotonic()
        local = not o.rebuild and self.engine.image_exists(content_ref)
        remote = not o.rebuild and not local and o.in_registry and self.engine.registry_has(content_ref)
        if local or remote:
            rec.image["reused"] = True
            if remote and (o.probe != "none"):
                self.progress.update(cid, "pulling")
                try:
                    self.engine.pull(content_ref)
                    local = True
                except InfraError as e:
                    return finish("build", "error", "daemon-error", str(e))
            if local:
                self.engine.tag(content_ref, readable_ref)
        else:
            self.progress.update(cid, "building")
            tracker = StepTracker(lambda s: self.progress.step(cid, s))
            labels = build_labels(cid, chash, lr.lock_hash, base.kind, base.ref)
            try:
                with secret_files(self._secret_values(lr)) as sfiles:
                    if o.ca_bundle:
                        sfiles = {**sfiles, "ca-bundle": o.ca_bundle}
                    res = self.engine.build(rendered.context_dir, dockerfile=rendered.dockerfile,
                                            tags=[content_ref, readable_ref], labels=labels, secrets=sfiles,
                                            platform=combo.platform if combo.platform != host_platform() else None,
                                            no_cache=o.no_cache, log_path=log_path, timeout=o.timeout, on_line=tracker, stop=self.stop)
            except InfraError as e:
                return finish("build", "error", e.cause, str(e))
            rec.log = logrel
            timings["build"] = round(res.seconds, 3)
            if res.interrupted or self.stop.is_set():
                self.progress.update(cid, "interrupted")
                return None
            if not res.ok:
                cause, status = classify(res.tail, timed_out=res.timed_out, rc=res.rc)
                step = tracker.failed or (tracker.current if res.timed_out else None)
                return finish("build", status, cause, failure_detail(res.tail, step))
            local = True
            rec.image["id"] = res.image_id
        timings.setdefault("build", round(time.monotonic() - t, 3))
        if local:
            info = self.engine.inspect(content_ref) or {}
            rec.image["id"] = info.get("Id") or rec.image["id"]
            rec.image["size"] = info.get("Size")

        # 4+5. push and probe at once: the upload and the probe of the local image do not wait
        # for each other. The record's rule is push_probe_outcome (module docstring).
        push_out = probe_out = None
        pusher = None
        wall = time.monotonic()
        if o.push:
            pusher = _Background(lambda: self._push(content_ref, readable_ref, remote), f"envbuild-push-{cid}")
        try:
            if o.probe != "none":
                self.progress.update(cid, "pushing+probing" if pusher else "probing")
                t = time.monotonic()
                probe_out = self._probe(combo, content_ref, rec)
                timings["probe"] = round(time.monotonic() - t, 3)
                if pusher and pusher.alive():
                    self.progress.update(cid, "pushing", "probed")
            elif pusher:
                self.progress.update(cid, "pushing")
        finally:  # a bug in the probe path is raised only once the push is done with
            if pusher:
                ok, val = pusher.join()
                if ok:
                    push_out = ("ok", val)
                elif isinstance(val, InfraError):
                    push_out = ("error", "daemon-error", str(val))
                elif isinstance(val, Exception):
                    push_out = ("error", "internal-error", f"{type(val).__name__}: {val}")
                else:  # KeyboardInterrupt, SystemExit: not the push's outcome to record
                    raise val
                timings["push"] = round(pusher.seconds, 3)
        if push_out and push_out[0] == "ok":
            rec.image["digest"] = push_out[1]
        if push_out and probe_out:
            timings["push_probe_wall"] = round(time.monotonic() - wall, 3)
        if probe_out and probe_out[0] == "verdicts":
            verdicts = probe_out[1]
            rec.probe = verdicts
            seen = next((gl for v in verdicts.values() for gl in [(v.get("versions") or {}).get("glibc")] if gl), "")
            if seen.startswith("glibc-"):
                rec.combo["glibc"] = seen.removeprefix("glibc-")
        return finish(*push_probe_outcome(push_out, probe_out))

    def _push(self, content_ref: str, readable_ref: str, remote: bool) -> str:
        """-> the pushed digest. Content already in the registry is not pushed again."""
        if remote:
            return self.engine.remote_digest(content_ref)
        digest = self.engine.push(content_ref, compression=self.o.compression)
        self.engine.push(readable_ref, compression=self.o.compression)
        return digest

    def _probe(self, combo, content_ref: str, rec):
        """The CPU levels, then the GPU level where asked (envbuild.probe_run: one path for every
        caller, the same outcome -> record rule, verdicts reused by content).
        -> ("verdicts", {level: verdict}) or ("error", cause, detail) when the probe could not run."""
        target = Target(content_ref, combo.engine, expect_of(combo), rec.image.get("id"))
        try:
            return ("verdicts", probe_levels(target, PROBE_PLAN[self.o.probe], probe_fn=self.probe_fn,
                                             cache=self.verdict_cache, run_id=rec.run_id,
                                             on_level=lambda lv: self.progress.step(combo.id, f"probe {lv}")))
        except InfraError as e:
            return ("error", e.cause, str(e))
        except EnvbuildError as e:
            return ("error", "probe-error", str(e))

    def _secret_values(self, lr) -> dict[str, str]:
        vals = {}
        if self.o.index_url:
            vals["index-url"] = self.o.index_url
        ti = getattr(lr, "torch_index", "default")
        if ti and ti != "default" and self.o.torch_index_root:
            vals["torch-index-url"] = pytorch_index_url(self.o.torch_index_root, lr.combo.cuda)
        return vals


def push_probe_outcome(push, probe) -> tuple[str, str, str | None, str]:
    """(stage, status, cause, detail) of a record from what the push and the probe, which ran at
    once, ended with. push: None (not asked) | ("ok", digest) | ("error", cause, detail);
    probe: None | ("verdicts", {level: verdict}) | ("error", cause, detail). The rule (module
    docstring): a failing verdict decides; else a failed push; else the probe; else build ok."""
    if probe and probe[0] == "verdicts":
        p_status, p_cause, p_detail = record_status(probe[1])
        p_said = "probe: " + ", ".join(f"{lv} {v.get('status')}" for lv, v in probe[1].items())
    elif probe:
        p_status, p_cause, p_detail = "error", probe[1], probe[2]
        p_said = f"probe: error {probe[1]}: {probe[2]}"
    else:
        p_status = p_cause = p_detail = p_said = None
    push_failed = bool(push) and push[0] == "error"
    if p_status == "fail":
        also = f"\npush failed as well ({push[1]}): {push[2]}" if push_failed else ""
        return "probe", "fail", p_cause, (p_detail + also)[:4000]
    if push_failed:
        also = f"\n{p_said} (kept in this record's probe)" if p_said else ""
        return "push", "error", push[1], (push[2] + also)[:4000]
    if p_status is not None:
        return "probe", p_status, p_cause, p_detail
    return "build", "ok", None, ""


def run_all(builder: Builder, combos, jobs: int) -> tuple[list, bool]:
    """Build every combination with up to `jobs` at once. -> (records, interrupted).
    Ctrl-C stops running builds (killing their clients) and keeps every record written so far."""
    from concurrent.futures import ThreadPoolExecutor

    records: list = []
    interrupted = False
    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="envbuild")
    futs: dict = {}
    try:  # submitting inside the try: a Ctrl-C while the first builds already run is caught too
        builder.prefetch(combos)  # the bases resolve while the locks do
        for c in combos:
            futs[pool.submit(_guarded, builder, c)] = c
        for f, c in futs.items():
            while True:
                try:
                    r = f.result(timeout=0.5)
                    break
                except WaitTimeout:
                    continue
            if r is not None:
                records.append(r)
    except KeyboardInterrupt:
        interrupted = True
        builder.stop.set()
        for f in futs:
            f.cancel()
        for f in futs:
            if not f.cancelled():
                try:
                    r = f.result()
                    if r is not None and r not in records:
                        records.append(r)
                except Exception:
                    pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return records, interrupted


def _guarded(builder: Builder, combo):
    """One combination's failure (even a bug) is recorded and never stops the others."""
    if builder.stop.is_set():
        return None
    try:
        return builder.build_one(combo)
    except Exception as e:  # noqa: BLE001 - recorded, not swallowed
        rec = Record(combo=combo.to_dict(), stage="build", status="error", cause="internal-error",
                     detail=f"{type(e).__name__}: {e}")
        write_record(builder.o.results, rec)
        builder.progress.update(combo.id, "error", rec.detail)
        return rec


# --------------------------------------------------------------------------- adapters


def _lock_adapter(matrix, meta):
    locker = Locker(matrix, meta)
    lk = threading.Lock()

    def fn(combo, out):
        with lk:  # one Locker shares metadata caches; uv itself runs outside our threads' way
            return locker.lock(combo, out)
    return fn


def _render_adapter():
    # render writes OUT/<combo id>/ (Dockerfile, locks, probe) and hashes that whole context.
    return lambda combo, lr, base, out: render_combo(combo, lr, base, out)


def _base_adapter(engine, spec: str, suite: str, say, registry: str | None = None) -> BaseFutures:
    """--base SPEC -> the run's shared bases: one resolution per spec (per CUDA devel image for
    nvidia and auto), and auto's fallback to the bootstrap base made once for all of them."""

    def key(combo) -> str:
        return (spec if spec not in ("nvidia", "auto") else f"{spec}:{combo.base_image}") + f"@{combo.platform}"

    def kw(combo) -> dict:
        # A non-host platform's bootstrap base is served from the build's registry (BuildKit
        # resolves a foreign base only from a registry).
        return {"platform": combo.platform, "registry": registry}

    def resolve(combo) -> BaseRef:
        if spec == "auto":
            # The CUDA devel image when this engine has or can pull it; else the
            # air-gapped path (bootstrap), said out loud and recorded.
            ref = combo.base_image
            if ref and (engine.image_exists(ref) or _try_pull(engine, ref)):
                return resolve_base(engine, "nvidia", combo, suite=suite, log=say, **kw(combo))
            say(f"base: {ref or 'nvidia image'} cannot be pulled here; using the bootstrap base")
            return bases.shared(f"bootstrap@{combo.platform}",
                                lambda: bootstrap(engine, suite=suite, log=say, **kw(combo)))
        return resolve_base(engine, spec, combo, suite=suite, log=say, **kw(combo))

    bases = BaseFutures(resolve, key)
    return bases


def _try_pull(engine, ref: str) -> bool:
    try:
        engine.pull(ref, timeout=1800)
        return True
    except (InfraError, Exception):  # noqa: BLE001 - any pull failure means: not available
        return False


# --------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    add_selector_args(p)
    p.add_argument("-j", "--jobs", type=int, default=1, help="combinations built at once (default 1)")
    add_repository_arg(p)
    p.add_argument("--push", action="store_true", help="push images to --repository and record their digests")
    p.add_argument("--base", default="auto",
                   help="nvidia (the matrix's CUDA devel image) | bootstrap (debootstrap base) | an image; "
                        "default auto: nvidia when it can be pulled, else bootstrap")
    p.add_argument("--suite", default="bookworm", help="distribution suite for --base bootstrap")
    p.add_argument("--probe", default="none", choices=PROBE_CHOICES, help="probe each image (default none)")
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"results folder (default ./{DEFAULT_RESULTS})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per build (default 3600)")
    p.add_argument("--ca-bundle", help="CA bundle given to builds as a secret (default: $PIP_CERT, "
                                       "$SSL_CERT_FILE or $REQUESTS_CA_BUNDLE)")
    p.add_argument("--rebuild", action="store_true", help="build even when the content tag exists")
    p.add_argument("--json", action="store_true", help="print the records as JSON (progress goes to stderr)")
    p.add_argument("--reprobe", action="store_true",
                   help="probe even when this image content was already probed by this probe version")
    p.add_argument("--no-cache", action="store_true",
                   help="ignore BuildKit's layer cache (a cold build; download caches stay)")
    p.add_argument("--compression", default="gzip", choices=("gzip", "zstd"),
                   help="layers pushed as gzip (default, every client) or zstd (OCI media types; needs skopeo)")


def options_from_args(args, default_repo: str, matrix_pytorch_index: str | None = None) -> Options:
    if args.jobs < 1:
        raise InputError("command line", None, "--jobs", args.jobs, "must be at least 1")
    if args.timeout <= 0:
        raise InputError("command line", None, "--timeout", args.timeout, "must be positive")
    repo, in_registry = repository_from_args(args, default_repo, lambda t: print(f"warning: {t}", file=sys.stderr))
    if args.push and not in_registry:
        raise InputError("command line", None, "--push", True, f"needs --repository (or ${REPOSITORY_ENV})")
    ca = args.ca_bundle
    if ca is not None and not os.path.isfile(ca):
        raise InputError("command line", None, "--ca-bundle", ca, "no such file")
    ca = os.path.abspath(ca) if ca else default_ca_bundle()
    return Options(results=Path(args.results).resolve(), repo=repo, in_registry=in_registry, push=args.push,
                   base=args.base, suite=args.suite, probe=args.probe, jobs=args.jobs, timeout=args.timeout,
                   ca_bundle=ca, index_url=default_index_url(),
                   torch_index_root=pytorch_root(matrix_pytorch_index), rebuild=args.rebuild,
                   no_cache=args.no_cache, compression=args.compression)


def _probe_level(spec: str) -> str:
    if spec != "auto":
        return spec
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        return "gpu"
    return "cpu"


def run(args) -> int:
    meta = Metadata()
    if getattr(args, "platform", None) is None:
        # Images for this machine unless another platform is named (those build under qemu, and
        # need ci/emulation.sh and a registry): plan and lock show every platform, build does not.
        args.platform = host_platform() or DEFAULT_PLATFORM
    m = matrix_from_args(args)
    pl = plan_from_args(args, meta)
    opts = options_from_args(args, m.repository, m.pytorch_index)
    opts.probe = _probe_level(opts.probe)
    engine = detect()
    if opts.push:
        pusher_for(engine, opts.compression)  # no zstd pusher here: say so before building
    opts.results.mkdir(parents=True, exist_ok=True)
    # --json: the result on stdout, progress on stderr (a live table only on a terminal)
    out = sys.stderr if args.json else sys.stdout
    prog_cls = RichProgress if out.isatty() else PlainProgress
    stop = threading.Event()
    # A kill (SIGTERM) takes the same path as Ctrl-C: running builds are stopped, records kept.
    def _term(signum, frame):
        raise KeyboardInterrupt
    old_term = signal.signal(signal.SIGTERM, _term)
    with prog_cls(pl.combos, stream=out) as prog:
        prog.message(f"envbuild build: {len(pl.combos)} combination(s), -j {opts.jobs}, {engine.describe()}")
        builder = Builder(opts, engine, lock_fn=_lock_adapter(m, meta), render_fn=_render_adapter(),
                          base_fn=_base_adapter(engine, opts.base, opts.suite, prog.message,
                                                registry_host(opts.repo)),
                          probe_fn=probe_image_levels, progress=prog, stop=stop,
                          verdict_cache=None if args.reprobe else VerdictCache())
        for c in pl.combos:
            prog.update(c.id, "queued")
        try:
            records, interrupted = run_all(builder, pl.combos, opts.jobs)
            # A base still resolving (every lock failed first, or Ctrl-C): let it finish, so no
            # debootstrap is left behind half done (its own cleanup runs); a second Ctrl-C leaves.
            if builder.base_fn.running():
                prog.message("waiting for the base resolution started at the beginning of the run")
                try:
                    builder.base_fn.wait()
                except KeyboardInterrupt:
                    interrupted = True
        finally:
            signal.signal(signal.SIGTERM, old_term)
    if opts.push and not interrupted:
        write_indexes(opts, say=lambda t: print(t, file=out))
    rc = summarize(records, opts, interrupted, len(pl.combos), out=out)
    if args.json:
        json.dump([{"id": r.combo["id"], "status": r.status, "stage": r.stage, "cause": r.cause,
                    "image": r.image, "run_id": r.run_id, "notes": r.lock_notes,
                    "levels": {lv: v.get("status") for lv, v in (r.probe or {}).items()}}
                   for r in sorted(records, key=lambda r: r.combo["id"])], sys.stdout, indent=2, sort_keys=True)
        print()
    return rc


def write_indexes(opts: Options, say=print) -> dict[str, str]:
    """One multi-platform manifest list per plain tag whose platforms were pushed (from the latest
    record of each image in the results, so an arm64 run joins an earlier amd64 one). A tag with one
    platform keeps that image's own manifest. A registry refusal is said, not fatal: every
    platform's image stays pullable by its own tag and digest, which is what the table pins."""
    from .manifest import group_for_indexes, push_index  # oras is loaded only when pushing

    out = {}
    for ref, children in group_for_indexes(latest_by_combo(opts.results).values()).items():
        if len(children) < 2:
            continue
        try:
            out[ref] = push_index(ref, children)
            say(f"manifest list {ref}: {', '.join(sorted(children))} -> {out[ref]}")
        except EnvbuildError as e:
            say(f"manifest list {ref}: not written: {e}")
    return out


def summarize(records, opts: Options, interrupted: bool, planned: int, out=None) -> int:
    out = out or sys.stdout
    print(f"\n{'combination':<50} {'status':<7} {'stage':<7} {'cause / image'}", file=out)
    for r in sorted(records, key=lambda r: r.combo["id"]):
        img = r.image or {}
        what = r.cause or (img.get("digest") or img.get("ref") or "")
        print(f"{r.combo['id']:<50} {r.status:<7} {r.stage:<7} {what}", file=out)
        if r.status != "ok" and r.detail:
            first = r.detail.strip().splitlines()
            print(f"{'':<50} {first[0][:300] if first else ''}", file=out)
    images = sorted({(r.image or {}).get("ref") for r in records if r.status == "ok" and r.image})
    print(f"\nimages: {opts.repo} ({len(images)} built or reused" +
          (", pushed" if opts.push else ", local") + ")", file=out)
    for i in images:
        print(f"  {i}", file=out)
    print(f"results: {opts.results / 'records'} (logs: {opts.results / 'logs'})", file=out)
    if interrupted:
        print(f"interrupted: {len(records)} of {planned} recorded; rerun the same command to resume", file=out)
        return 130
    return exit_of_records(r.status for r in records)
