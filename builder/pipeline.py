"""One combination through the pipeline: lock -> base + render -> build (BuildKit) -> push and
probe at once -> record (`envbuild build` runs it for each planned combination).

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
    outcome.record_status);
  - otherwise a failed push decides, as before the overlap: stage push, status error, its cause
    (daemon-error; internal-error for a bug in the push path), the probe's outcome in the detail;
  - otherwise the probe decides (stage probe), or, without --probe, stage build, ok.
A record claims a digest only when the push succeeded. timings keep push and probe apart and add
push_probe_wall (the pair's wall time: push + probe - push_probe_wall is what the overlap saved)
and base_wait (how long the combination waited for its base after its lock).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as WaitTimeout
from dataclasses import dataclass
from pathlib import Path

from .buildlog import StepTracker, classify, failure_detail
from .errors import EnvbuildError, InfraError
from .fsutil import write_atomic
from .image import build_labels
from .index_config import torch_index_url
from .background import Background, BaseFutures
from .outcome import LOCK_OK, OK, RECORD_ERROR, lock_record_status, push_probe_outcome
from .probe_exec import expect_of
from .probe_run import Target, VerdictCache, probe_levels
from .progress import PlainProgress
from .record import Record, write_record
from .secretfiles import secret_files
from .values import Base, image_refs
from .probe.vocab import LEVELS
from .probe.hardware import host_platform

DEFAULT_TIMEOUT = 3600  # seconds per build
# `envbuild build --probe X` -> the probe levels run, in order (auto: gpu where a GPU is, else cpu).
PROBE_CHOICES = ("none", "cpu", "gpu", "auto")
PROBE_PLAN = {"none": (), "cpu": ("env", "contract"), "gpu": LEVELS}


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
    compression: str = "auto"  # of pushed layers: envbuild.push.COMPRESSIONS


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

    def _await_base(self, combo) -> Base | None:
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
        rec = Record(combo=combo.to_dict(), stage="lock", status=RECORD_ERROR)
        logrel = f"logs/{cid}.log"
        log_path = o.results / logrel

        def finish(stage, status, cause=None, detail=""):
            if self.stop.is_set() and status != OK:
                self.progress.update(cid, "interrupted")
                return None
            if stage in ("lock", "render") and status != OK and detail:
                # The summary points every failure at logs/: one before the build has no BuildKit
                # log, so its own message is the log (a lock's is uv's whole answer).
                try:
                    write_atomic(log_path, f"{stage}: {status}: {cause}\n{detail.rstrip()}\n")
                    rec.log = logrel
                except EnvbuildError:
                    pass  # an unwritable log never hides the verdict
            rec.stage, rec.status, rec.cause, rec.detail, rec.timings = stage, status, cause, detail, timings
            write_record(o.results, rec)
            self.progress.update(cid, status if status != OK else ("reused" if (rec.image or {}).get("reused") else OK),
                                 f"{cause}" if cause else "")
            return rec

        # 1. lock
        self.progress.update(cid, "locking")
        t = time.monotonic()
        try:
            lr = self.lock_fn(combo, o.results / "locks")
        except InfraError as e:
            timings["lock"] = time.monotonic() - t
            return finish("lock", RECORD_ERROR, e.cause, str(e))
        timings["lock"] = round(time.monotonic() - t, 3)
        if lr.status != LOCK_OK:
            return finish("lock", lock_record_status(lr.status), lr.status, lr.detail)
        rec.lock_hash = lr.lock_hash
        rec.lock_notes = {k: list(getattr(lr, k, None) or []) for k in ("relaxed", "built_from_source")
                          if getattr(lr, k, None)}

        # 2. base (resolving since the run started: wait for it) + render
        t = time.monotonic()
        try:
            base = self._await_base(combo)
            timings["base_wait"] = round(time.monotonic() - t, 3)
            if base is None:
                return finish("render", RECORD_ERROR, "interrupted")
            self.progress.update(cid, "rendering")
            rec.base = base.to_dict()  # what it was built on (the combination keeps what was planned)
            rendered = self.render_fn(combo, lr, base, o.results / "contexts")
        except InfraError as e:
            return finish("render", RECORD_ERROR, e.cause, str(e))
        except EnvbuildError as e:
            return finish("render", RECORD_ERROR, "render-error", str(e))
        timings["render"] = round(time.monotonic() - t, 3)
        chash = rendered.content_hash
        # Per platform: the id (the plain tag for the default platform); the plain tag of several
        # platforms becomes their manifest list after the run (write_indexes).
        content_ref, readable_ref = image_refs(o.repo, combo.id, chash)
        rec.image = {"ref": content_ref, "tags": [content_ref, readable_ref], "content_hash": chash,
                     "id": None, "digest": None, "size": None, "reused": False}

        # 3. build, unless this content is already built (locally or in the registry)
        if self.stop.is_set():
            return finish("render", RECORD_ERROR, "interrupted")
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
                    return finish("build", RECORD_ERROR, "daemon-error", str(e))
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
                return finish("build", RECORD_ERROR, e.cause, str(e))
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
        # for each other. The record's rule is outcome.push_probe_outcome (module docstring).
        push_out = probe_out = None
        pusher = None
        wall = time.monotonic()
        if o.push:
            pusher = Background(lambda: self._push(content_ref, readable_ref, remote), f"envbuild-push-{cid}")
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
                    push_out = (OK, val)
                elif isinstance(val, InfraError):
                    push_out = (RECORD_ERROR, "daemon-error", str(val))
                elif isinstance(val, Exception):
                    push_out = (RECORD_ERROR, "internal-error", f"{type(val).__name__}: {val}")
                else:  # KeyboardInterrupt, SystemExit: not the push's outcome to record
                    raise val
                timings["push"] = round(pusher.seconds, 3)
        if push_out and push_out[0] == OK:
            rep = push_out[1]
            rec.image["digest"] = rep if isinstance(rep, str) else rep.digest
            if not isinstance(rep, str):
                rec.image["push"] = rep.to_dict()
        if push_out and probe_out:
            timings["push_probe_wall"] = round(time.monotonic() - wall, 3)
        if probe_out and probe_out[0] == "verdicts":
            rec.probe = dict(probe_out[1])  # the glibc and the rest it read stay in the verdicts
        return finish(*push_probe_outcome(push_out, probe_out))

    def _push(self, content_ref: str, readable_ref: str, remote: bool):
        """-> the pushed digest (content already in the registry: not pushed again), or the push's
        report (envbuild.push.PushReport)."""
        if remote:
            return self.engine.remote_digest(content_ref)
        rep = self.engine.push_report(content_ref, compression=self.o.compression)
        self.engine.push(readable_ref, compression=self.o.compression)  # a manifest: the blobs are there
        return rep

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
            return (RECORD_ERROR, e.cause, str(e))
        except EnvbuildError as e:
            return (RECORD_ERROR, "probe-error", str(e))

    def _secret_values(self, lr) -> dict[str, str]:
        vals = {}
        if self.o.index_url:
            vals["index-url"] = self.o.index_url
        ti = getattr(lr, "torch_index", "default")
        if ti and ti != "default" and self.o.torch_index_root:
            vals["torch-index-url"] = torch_index_url(self.o.torch_index_root, lr.combo.cuda)
        return vals


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
        rec = Record(combo=combo.to_dict(), stage="build", status=RECORD_ERROR, cause="internal-error",
                     detail=f"{type(e).__name__}: {e}")
        write_record(builder.o.results, rec)
        builder.progress.update(combo.id, RECORD_ERROR, rec.detail)
        return rec


