"""envbuild build overlaps what does not depend on each other (issue #17), against fakes:
the base resolves while the lock does (once per distinct base, shared), and the push runs while
the probe does. Each overlap test has two fakes that wait for each other with a timeout, so a
sequential implementation fails here instead of hanging."""

from __future__ import annotations

import _thread
import dataclasses
import threading
import time

import pytest
from test_build_orchestration import FakeEngine, combo, fake_lock, make_builder

from envbuild import build as B


from envbuild import pipeline as PL


from envbuild.outcome import push_probe_outcome


from envbuild.background import BaseFutures

from envbuild.values import Base as BaseRef
from envbuild.errors import InfraError, InputError
from envbuild.record import iter_records
from envbuild.fold import fold_combo

WAIT = 5.0  # seconds one fake waits for the other; a sequential pipeline runs into it
BASE = BaseRef("bootstrap", "envbuild/base:bookworm-py3-abc")


def passing_probe(image, *, level, **kw):
    return {"level": level, "status": "pass", "checks": []}


# ---------------------------------------------------------------- base while locking


def test_the_base_resolves_while_the_lock_runs(tmp_path):
    lock_started, base_started = threading.Event(), threading.Event()
    saw = {}

    def lock(c, out):
        lock_started.set()
        saw["lock saw the base started"] = base_started.wait(WAIT)
        return fake_lock()(c, out)

    def base(c):
        base_started.set()
        saw["base saw the lock started"] = lock_started.wait(WAIT)
        return BASE

    b = make_builder(tmp_path, FakeEngine(), lock=lock)
    b.base_fn = BaseFutures(base, key=lambda c: "bootstrap")
    t = time.monotonic()
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert saw == {"lock saw the base started": True, "base saw the lock started": True}
    assert time.monotonic() - t < WAIT
    assert (r.stage, r.status) == ("build", "ok") and r.base == BASE.to_dict()
    assert "base_wait" in r.timings


def test_a_plain_base_function_is_resolved_in_the_background_too(tmp_path):
    lock_started, base_started = threading.Event(), threading.Event()

    def lock(c, out):
        lock_started.set()
        assert base_started.wait(WAIT), "the base was not being resolved while the lock ran"
        return fake_lock()(c, out)

    def base(c):
        base_started.set()
        return BASE

    b = make_builder(tmp_path, FakeEngine(), lock=lock)
    b = PL.Builder(b.o, b.engine, lock_fn=lock, render_fn=b.render_fn, base_fn=base, progress=b.progress)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert r.status == "ok" and lock_started.is_set()


def test_one_base_resolution_is_shared_by_every_combination_and_thread(tmp_path):
    calls = []

    def base(c):
        calls.append(c.id)
        time.sleep(0.2)  # the other threads arrive while it runs
        return BASE

    b = make_builder(tmp_path, FakeEngine(), jobs=3)
    b.base_fn = BaseFutures(base, key=lambda c: "bootstrap")
    recs, _ = PL.run_all(b, [combo(), combo("hf", ""), combo("vllm", "0.8.5.post1")], jobs=3)
    assert len(calls) == 1 and len(recs) == 3 and {r.status for r in recs} == {"ok"}


@pytest.mark.parametrize("error,cause", [
    (InfraError("debootstrap-failed", "debootstrap exited 1: E: no such suite"), "debootstrap-failed"),
    (InputError("/etc/apt/sources.list*", None, "mirror", None, "no apt mirror"), "render-error"),
])
def test_a_base_error_reaches_every_combination_that_needed_it(tmp_path, error, cause):
    calls = []

    def base(c):
        calls.append(c.id)
        raise error

    b = make_builder(tmp_path, FakeEngine(), jobs=2)
    b.base_fn = BaseFutures(base, key=lambda c: "bootstrap")
    combos = [combo(), combo("hf", ""), combo("vllm", "0.8.5.post1")]
    recs, _ = PL.run_all(b, combos, jobs=2)
    assert len(calls) == 1  # resolved once, its error shared
    assert sorted(r.combo["id"] for r in recs) == sorted(c.id for c in combos)
    for r in recs:
        assert (r.stage, r.status, r.cause) == ("render", "error", cause) and str(error) in r.detail
    assert b.engine.builds == []


def test_auto_shares_one_bootstrap_between_cuda_images_it_cannot_pull(tmp_path, monkeypatch):
    made = []

    def bootstrap(engine, suite, log, platform="linux/amd64", registry=None):
        made.append(suite)
        time.sleep(0.1)
        return BASE
    monkeypatch.setattr(B, "bootstrap", bootstrap)
    monkeypatch.setattr(B, "_try_pull", lambda engine, ref: False)
    said = []
    bases = B._base_adapter(FakeEngine(), "auto", "bookworm", said.append)
    c1 = combo()
    c2 = dataclasses.replace(c1, base_image="nvidia/cuda:12.6.3-devel-ubuntu22.04")
    f1, f2 = bases.start(c1), bases.start(c2)
    assert f1 is not f2 and f1.result(WAIT) == f2.result(WAIT) == BASE
    assert made == ["bookworm"] and len(said) == 2
    assert bases.start(c1) is f1 and bases.wait(WAIT) and bases.running() == 0


def test_ctrl_c_while_a_combination_waits_for_its_base(tmp_path):
    stop = threading.Event()

    def base(c):
        _thread.interrupt_main()  # Ctrl-C while the base is still being made
        stop.wait(WAIT)
        raise InfraError("debootstrap-failed", "killed by SIGINT")

    b = make_builder(tmp_path, FakeEngine(), stop=stop)
    b.base_fn = BaseFutures(base, key=lambda c: "bootstrap")
    t = time.monotonic()
    recs, interrupted = PL.run_all(b, [combo(), combo("hf", "")], 1)
    assert interrupted and recs == [] and list(iter_records(tmp_path / "results")) == []
    assert time.monotonic() - t < WAIT and b.base_fn.wait(WAIT)


# ---------------------------------------------------------------- push while probing


class PushingEngine(FakeEngine):
    """push waits (up to WAIT) for the probe to have started; `fail` makes it raise."""

    def __init__(self, probe_started, fail=None):
        super().__init__()
        self.probe_started, self.fail = probe_started, fail
        self.push_started = threading.Event()
        self.saw_probe = None

    def push(self, ref, compression="auto"):
        self.push_started.set()
        if self.saw_probe is None:
            self.saw_probe = self.probe_started.wait(WAIT)
        if self.fail:
            raise self.fail
        return super().push(ref, compression)


def overlapping(status="pass", fail_push=None, probe_raises=None):
    probe_started = threading.Event()
    eng = PushingEngine(probe_started, fail_push)
    saw = []

    def probe(image, *, level, **kw):
        probe_started.set()
        saw.append(eng.push_started.wait(WAIT))
        if probe_raises:
            raise probe_raises
        return {"level": level, "status": status, "cause": None if status == "pass" else "abi-mismatch",
                "checks": [] if status == "pass" else [{"name": "native-extensions", "status": status,
                                                         "detail": "undefined symbol _ZN3c10"}]}
    return eng, probe, saw


def test_push_and_probe_run_at_once(tmp_path):
    eng, probe, saw = overlapping()
    b = make_builder(tmp_path, eng, registry=True, push=True, probe="cpu", probe_fn=probe)
    t = time.monotonic()
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert eng.saw_probe is True and saw and all(saw), "push and probe did not run at the same time"
    assert time.monotonic() - t < WAIT
    assert (r.stage, r.status, r.cause) == ("probe", "ok", None)
    assert r.image["digest"].startswith("127.0.0.1:5000/envbuild/verl@sha256:") and set(eng.pushed) == set(r.image["tags"])
    assert set(r.probe) == {"env", "contract"}
    assert {"push", "probe", "push_probe_wall"} <= set(r.timings)


def test_a_failed_push_keeps_the_probe_verdict_and_claims_no_digest(tmp_path):
    eng, probe, saw = overlapping(fail_push=InfraError("daemon-error", "docker push: connection refused"))
    b = make_builder(tmp_path, eng, registry=True, push=True, probe="cpu", probe_fn=probe)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert eng.saw_probe and all(saw)
    # as before the overlap: a push error is an infrastructure error at the push stage...
    assert (r.stage, r.status, r.cause) == ("push", "error", "daemon-error")
    assert "connection refused" in r.detail and "probe: env pass, contract pass" in r.detail
    assert r.image["digest"] is None and r.image["id"]
    # ...and the verdict it ran beside is kept: the table sees a tested image it cannot pin
    assert {lv: v.status for lv, v in r.probe.items()} == {"env": "pass", "contract": "pass"}
    assert "push" in r.timings and "probe" in r.timings
    row = fold_combo([r])
    assert row.level("env").status == "pass" and row.status == "unpinned" and row.image.digest is None
    assert B.summarize([r], b.o, False, 1, out=open("/dev/null", "w")) == 3


def test_a_failing_verdict_outranks_a_failed_push(tmp_path):
    eng, probe, _ = overlapping(status="fail", fail_push=InfraError("daemon-error", "registry gone"))
    b = make_builder(tmp_path, eng, registry=True, push=True, probe="cpu", probe_fn=probe)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert (r.stage, r.status, r.cause) == ("probe", "fail", "abi-mismatch")
    assert "undefined symbol" in r.detail and "push failed as well (daemon-error): " in r.detail
    assert r.image["digest"] is None and set(r.probe) == {"env"}
    assert fold_combo([r]).status == "broken"


def test_a_probe_that_cannot_run_is_an_error_and_the_push_still_counts(tmp_path):
    eng, probe, _ = overlapping(probe_raises=InfraError("no-docker", "docker run: not found"))
    b = make_builder(tmp_path, eng, registry=True, push=True, probe="cpu", probe_fn=probe)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert (r.stage, r.status, r.cause) == ("probe", "error", "no-docker")
    assert r.image["digest"].startswith("127.0.0.1:5000/envbuild/verl@sha256:")


def test_a_bug_in_the_push_path_is_recorded_beside_the_verdict(tmp_path):
    eng, probe, _ = overlapping(fail_push=KeyError("digest"))
    b = make_builder(tmp_path, eng, registry=True, push=True, probe="cpu", probe_fn=probe)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert (r.stage, r.status, r.cause) == ("push", "error", "internal-error") and "KeyError" in r.detail
    assert r.image["digest"] is None and set(r.probe) == {"env", "contract"}


def test_a_bug_in_the_probe_path_waits_for_the_push_then_is_recorded(tmp_path):
    eng, probe, _ = overlapping(probe_raises=ZeroDivisionError("bug"))
    b = make_builder(tmp_path, eng, registry=True, push=True, probe="cpu", probe_fn=probe)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert (r.status, r.cause) == ("error", "internal-error") and "ZeroDivisionError" in r.detail
    assert len(eng.pushed) == 2  # both tags: the push was finished before the bug was raised


def test_ctrl_c_during_push_and_probe_records_no_verdict(tmp_path):
    stop = threading.Event()

    def probe(image, *, level, **kw):
        _thread.interrupt_main()
        assert stop.wait(WAIT), "the orchestration must set stop"
        return {"level": level, "status": "error", "cause": "interrupted", "checks": []}
    b = make_builder(tmp_path, FakeEngine(), registry=True, push=True, probe="cpu", probe_fn=probe, stop=stop)
    recs, interrupted = PL.run_all(b, [combo()], 1)
    assert interrupted and recs == [] and list(iter_records(tmp_path / "results")) == []


@pytest.mark.parametrize("push,probe,want", [
    (None, None, ("build", "ok", None)),
    (("ok", "r@sha256:1"), None, ("build", "ok", None)),
    (("error", "daemon-error", "refused"), None, ("push", "error", "daemon-error")),
    (None, ("verdicts", {"env": {"status": "pass"}}), ("probe", "ok", None)),
    (("ok", "r@sha256:1"), ("verdicts", {"env": {"status": "fail", "cause": "pip-check"}}), ("probe", "fail", "pip-check")),
    (("error", "daemon-error", "refused"), ("verdicts", {"env": {"status": "pass"}}), ("push", "error", "daemon-error")),
    (("error", "daemon-error", "refused"), ("verdicts", {"env": {"status": "timeout"}}), ("probe", "fail", "timeout")),
    (("error", "daemon-error", "refused"), ("verdicts", {"env": {"status": "error", "cause": "docker-error"}}),
     ("push", "error", "daemon-error")),
    (("error", "daemon-error", "refused"), ("error", "no-docker", "x"), ("push", "error", "daemon-error")),
    (("ok", "r@sha256:1"), ("error", "no-docker", "x"), ("probe", "error", "no-docker")),
])
def test_push_probe_outcome_rule(push, probe, want):
    assert push_probe_outcome(push, probe)[:3] == want
