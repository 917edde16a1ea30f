"""envbuild build's orchestration against a fake engine (no daemon, no index)."""

from __future__ import annotations

import _thread
import hashlib
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from envbuild import build as B

from envbuild import buildlog as BL

from envbuild import pipeline as PL

from envbuild import progress as PR
from envbuild.values import Base as BaseRef
from envbuild.runlog import BuildResult
from envbuild.errors import InfraError, InputError
from envbuild.fold import fold_combo
from envbuild.values import Combo
from envbuild.record import iter_records, latest_by_combo

BUILDKIT_FAIL_COMPILE = """#5 [2/4] RUN --mount=type=secret,id=ca-bundle uv pip install -r /locks/torch.txt
#5 DONE 40.1s
#6 [3/4] RUN --mount=type=secret,id=ca-bundle uv pip install -r /locks/engine.txt
#6 3.2 Building flash-attn==2.7.4
#6 30.1   error: command '/usr/bin/gcc' failed with exit code 1
#6 30.2 Failed to build `flash-attn==2.7.4`
#6 ERROR: executor failed running [/bin/sh -c uv pip install -r /locks/engine.txt]: exit code: 1
------
 > [3/4] RUN --mount=type=secret,id=ca-bundle uv pip install -r /locks/engine.txt:
------
failed to solve: rpc error: code = Unknown desc = executor failed running [/bin/sh -c ...]: exit code: 1""".splitlines()


def combo(engine="vllm", ev="0.8.4", verl="0.4.1"):
    return Combo(verl=verl, engine=engine, engine_version=ev, torch="2.6.0", cuda="cu124", python="3.11",
                 cuda_toolkit="12.4", base_image="nvidia/cuda:12.4.1-devel-ubuntu22.04", glibc="2.35")


class FakeEngine:
    """Records what the orchestration asks of an engine; behaviour scripted per combination."""

    def __init__(self, script=None):
        self.script = script or {}  # combo tag -> callable(kw) -> BuildResult
        self.local: set[str] = set()
        self.remote: dict[str, str] = {}
        self.builds: list[dict] = []
        self.pushed: list[str] = []
        self.tags: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def image_exists(self, ref):
        return ref in self.local

    def registry_has(self, ref):
        return ref in self.remote

    def remote_digest(self, ref):
        return ref.rsplit(":", 1)[0] + "@" + self.remote[ref]

    def inspect(self, ref):
        return {"Id": "sha256:" + "1" * 64, "Size": 123} if ref in self.local else None

    def tag(self, src, dst):
        self.tags.append((src, dst))
        self.local.add(dst)

    def pull(self, ref, timeout=0):
        self.local.add(ref)

    def push(self, ref, compression="auto"):
        self.pushed.append(ref)
        dig = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
        self.remote[ref] = dig
        return ref.rsplit(":", 1)[0] + "@" + dig

    def push_report(self, ref, compression="auto"):
        from envbuild.push import PushReport
        return PushReport(self.push(ref, compression), "none", "envbuild", sent_bytes=1)

    def build(self, context, *, log_path, timeout=None, on_line=None, stop=None, tags=(), secrets=None, **kw):
        call = {"context": str(context), "tags": list(tags), "secrets": dict(secrets or {}),
                "secret_contents": {k: Path(v).read_text() for k, v in (secrets or {}).items()},
                "log_path": str(log_path), **kw}
        with self.lock:
            self.builds.append(call)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        key = next((k for k in self.script if k in tags[0]), None)
        res = self.script[key](call, on_line, stop) if key else BuildResult(True, 0, 0.01, image_id="sha256:x")
        Path(log_path).write_text("\n".join(res.tail) + "\n")
        if res.ok:
            with self.lock:
                self.local.update(tags)
        return res


def fake_lock(status="ok"):
    def fn(c, out):
        return SimpleNamespace(combo=c, status=status if callable(status) is False else status(c),
                               detail="" if status == "ok" else f"{status}: because", lock_hash="ab" * 32,
                               torch_index="default")
    return fn


def fake_render(c, lr, base, out_dir):
    out_dir = Path(out_dir) / c.id
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "Dockerfile").write_text(f"FROM {base.ref}\n")
    h = hashlib.sha256(f"{c.id} {base.ref}".encode()).hexdigest()
    return SimpleNamespace(context_dir=out_dir, dockerfile=out_dir / "Dockerfile", content_hash=h, secrets=[])


def per_level(one):
    """A fake of probe_image_levels from a fake of one level: `one(image, level=...)` per level,
    in order, stopping after a level that fails, errs or times out (as the one-container run does)."""
    def run(image, *, levels, engine, expect, timeout=None, on_level=None):
        out = {}
        for lv in levels:
            if on_level:
                on_level(lv)
            out[lv] = one(image, level=lv, engine=engine, expect=expect, timeout=timeout)
            if out[lv].get("status") in ("fail", "timeout", "error"):
                break
        return out
    return run


def make_builder(tmp_path, engine, *, lock=None, push=False, registry=False, probe="none", probe_fn=None,
                 ca=None, stop=None, jobs=1):
    opts = PL.Options(results=tmp_path / "results", repo="127.0.0.1:5000/envbuild/verl" if registry else "envbuild/verl",
                     in_registry=registry, push=push, probe=probe, jobs=jobs, timeout=60, ca_bundle=ca,
                     index_url="https://user:s3cret@index.example/simple")
    return PL.Builder(opts, engine, lock_fn=lock or fake_lock(), render_fn=fake_render,
                     base_fn=lambda c: BaseRef("bootstrap", "envbuild/base:bookworm-py3-abc"),
                     probe_fn=per_level(probe_fn) if probe_fn else None,
                     progress=PR.PlainProgress([], stream=open(os.devnull, "w")), stop=stop)


def test_builds_record_tags_secrets_and_base(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIfake\n-----END CERTIFICATE-----\n")
    eng = FakeEngine()
    b = make_builder(tmp_path, eng, ca=str(ca))
    recs, interrupted = PL.run_all(b, [combo(), combo("hf", "")], jobs=2)
    assert not interrupted and len(recs) == 2
    assert {r.status for r in recs} == {"ok"}
    call = next(c for c in eng.builds if "vllm0.8.4" in c["tags"][0])
    content, readable = call["tags"]
    assert readable == "envbuild/verl:verl0.4.1-vllm0.8.4-torch2.6.0-cu124-py3.11"
    assert content.startswith(readable + "-") and len(content) == len(readable) + 13
    # the CA bundle is passed by path; index credentials through a private file that is gone afterwards
    assert call["secrets"]["ca-bundle"] == str(ca)
    assert call["secret_contents"]["index-url"] == "https://user:s3cret@index.example/simple"
    assert not os.path.exists(call["secrets"]["index-url"])
    assert call["labels"]["org.envbuild.base"] == "bootstrap:envbuild/base:bookworm-py3-abc"
    on_disk = latest_by_combo(tmp_path / "results")
    r = on_disk[combo().id]
    assert r.base == {"kind": "bootstrap", "ref": "envbuild/base:bookworm-py3-abc"}
    assert r.image["ref"] == content and r.image["size"] == 123 and r.stage == "build"
    assert r.log == f"logs/{combo().id}.log" and (tmp_path / "results" / r.log).exists()
    # no secret value ever lands in a record
    for p in (tmp_path / "results" / "records").rglob("*.json"):
        assert "s3cret" not in p.read_text()


def test_one_failure_never_stops_the_others_and_is_classified(tmp_path):
    eng = FakeEngine({"vllm0.8.4": lambda call, on_line, stop: _replay(BUILDKIT_FAIL_COMPILE, on_line, ok=False)})
    b = make_builder(tmp_path, eng)
    combos = [combo(), combo("hf", ""), combo("vllm", "0.8.5.post1")]
    recs, _ = PL.run_all(b, combos, jobs=2)
    by = {r.combo["id"]: r for r in recs}
    assert len(by) == 3
    bad = by[combo().id]
    assert (bad.status, bad.stage, bad.cause) == ("fail", "build", "compile-failure")
    assert "failing step: [3/4] RUN --mount=type=secret,id=ca-bundle uv pip install -r /locks/engine.txt" in bad.detail
    assert "Failed to build `flash-attn==2.7.4`" in bad.detail
    assert by[combo("hf", "").id].status == "ok" and by[combo("vllm", "0.8.5.post1").id].status == "ok"
    assert B.summarize(recs, b.o, False, 3, out=open(os.devnull, "w")) == 1


def _replay(lines, on_line, ok, timed_out=False):
    for ln in lines:
        on_line(ln + "\n")
    return BuildResult(ok, 0 if ok else 1, 1.0, timed_out=timed_out, tail=list(lines))


def test_timeout_is_an_error_naming_the_running_step(tmp_path):
    lines = ["#4 [2/3] RUN uv pip install -r torch.txt", "#4 12.0 Downloading torch (766.0MiB)"]
    eng = FakeEngine({"vllm": lambda call, on_line, stop: _replay(lines, on_line, ok=False, timed_out=True)})
    b = make_builder(tmp_path, eng)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert (r.status, r.cause) == ("error", "timeout")
    assert "failing step: [2/3] RUN uv pip install -r torch.txt" in r.detail


@pytest.mark.parametrize("tail,cause,status", [
    (["#7 12.3   × No solution found when resolving dependencies:"], "unsatisfiable", "fail"),
    (["#7 9.0 ImportError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found"], "missing-wheel", "fail"),
    (["#7 2.0 error: Distribution `vllm==0.20.1` can't be installed because it doesn't have a source "
      "distribution or wheel for the current platform"], "missing-wheel", "fail"),
    (["#7 2.0 ERROR: torch-2.6.0-cp311-cp311-manylinux_2_28_x86_64.whl is not a supported wheel on this platform."],
     "missing-wheel", "fail"),
    (["#7 80.0 error: Failed to download `torch==2.6.0`", "#7 80.0   Caused by: error sending request"],
     "download-failure", "error"),
    (["#7 80.0 ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE."], "download-failure", "error"),
    (["#7 50.0 subprocess-exited-with-error", "#7 50.0 × Building wheel for flash-attn (setup.py) did not run successfully."],
     "compile-failure", "fail"),
    (["Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"],
     "daemon-error", "error"),
    (["#1 [internal] load build definition from Dockerfile", "failed to solve: failed to read dockerfile: open x: no such file"],
     "daemon-error", "error"),
    (["#9 [4/4] RUN python -c 'import verl'", "#9 1.0 ModuleNotFoundError: No module named 'verl'",
      "#9 ERROR: executor failed running [/bin/sh -c python -c 'import verl']: exit code: 1"], "build-failure", "fail"),
    # Docker 20.10 after a build-cache prune (this stop's CI): the engine lost a layer while exporting
    (["#22 [stage-0 18/18] RUN cp -R /opt/envbuild/in/locks /opt/envbuild/", "#22 DONE 1.4s", "",
      "#23 exporting to image", "#23 sha256:e8c613e07b0b7ff33893b694f7759a10d42e180f2b4dc349fb57dc6b71dcab00",
      "#23 exporting layers 0.0s done",
      "#23 ERROR: stat /var/lib/docker/overlay2/qdbxw8j7xuz7cm6wf122gsf1h: no such file or directory",
      "------", " > exporting to image:", "------",
      "stat /var/lib/docker/overlay2/qdbxw8j7xuz7cm6wf122gsf1h: no such file or directory"], "daemon-error", "error"),
    # ... but a Dockerfile step whose header the tail cut off stays the stack's
    (["#9 311.0 ImportError: cannot import name 'x' from 'vllm'",
      "#9 ERROR: process \"/bin/sh -c python -c 'import vllm'\" did not complete successfully: exit code: 1"],
     "build-failure", "fail"),
])
def test_classify(tail, cause, status):
    assert BL.classify(tail) == (cause, status)


def test_classify_timeout_wins():
    assert BL.classify(["#4 [2/3] RUN x"], timed_out=True) == ("timeout", "error")


def test_existing_content_tag_is_not_rebuilt_locally_or_in_registry(tmp_path):
    eng = FakeEngine()
    b = make_builder(tmp_path, eng)
    PL.run_all(b, [combo()], 1)
    assert len(eng.builds) == 1
    (r,), _ = PL.run_all(b, [combo()], 1)  # rerun: present locally
    assert len(eng.builds) == 1 and r.status == "ok" and r.image["reused"] is True

    eng2 = FakeEngine()  # a fresh machine whose registry already has it
    b2 = make_builder(tmp_path / "two", eng2, registry=True, push=True)
    content = f"{b2.o.repo}:{combo().tag}-{fake_render(combo(), None, BaseRef('bootstrap', 'envbuild/base:bookworm-py3-abc'), tmp_path / 'x').content_hash[:12]}"
    eng2.remote[content] = "sha256:" + "d" * 64
    (r2,), _ = PL.run_all(b2, [combo()], 1)
    assert eng2.builds == [] and eng2.pushed == []
    assert r2.image["digest"] == f"{b2.o.repo}@sha256:" + "d" * 64


def test_push_records_digest(tmp_path):
    eng = FakeEngine()
    b = make_builder(tmp_path, eng, registry=True, push=True)
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert r.status == "ok" and r.image["digest"].startswith("127.0.0.1:5000/envbuild/verl@sha256:")
    assert set(eng.pushed) == set(r.image["tags"])
    assert "push" in r.timings


@pytest.mark.parametrize("status,rec_status", [("unsatisfiable", "fail"), ("index-unreachable", "error")])
def test_lock_verdicts_stop_at_the_lock_stage(tmp_path, status, rec_status):
    eng = FakeEngine()
    b = make_builder(tmp_path, eng, lock=fake_lock(status))
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert (r.stage, r.status, r.cause) == ("lock", rec_status, status)
    assert eng.builds == []
    # the summary's "logs:" holds this failure too: the lock's own answer, named by the record
    assert r.log == f"logs/{r.combo['id']}.log"
    text = (tmp_path / "results" / r.log).read_text()
    assert text.startswith(f"lock: {rec_status}: {status}\n") and r.detail.strip() in text


def test_lock_exception_and_internal_bug_are_recorded_not_fatal(tmp_path):
    def lock(c, out):
        if c.engine == "hf":
            raise RuntimeError("boom")
        raise InfraError("index-unreachable", "no answer")
    b = make_builder(tmp_path, FakeEngine(), lock=lock)
    recs, _ = PL.run_all(b, [combo(), combo("hf", "")], 2)
    by = {r.combo["id"]: r for r in recs}
    assert by[combo().id].cause == "index-unreachable"
    assert (by[combo("hf", "").id].status, by[combo("hf", "").id].cause) == ("error", "internal-error")


def test_probe_levels_run_in_order_and_stop_at_a_failure(tmp_path):
    seen = []

    def probe(image, *, level, engine, expect, timeout):
        seen.append((image, level, engine, expect))
        if level == "contract" and engine == "vllm":
            return {"level": level, "status": "fail", "cause": "abi-mismatch",
                    "checks": [{"name": "imports", "status": "pass"},
                               {"name": "native-extensions", "status": "fail", "detail": "undefined symbol _ZN3c10"}]}
        return {"level": level, "status": "needs-gpu" if level == "contract" else "pass", "checks": []}
    b = make_builder(tmp_path, FakeEngine(), probe="cpu", probe_fn=probe)
    recs, _ = PL.run_all(b, [combo(), combo("hf", "")], 1)
    by = {r.combo["id"]: r for r in recs}
    bad, good = by[combo().id], by[combo("hf", "").id]
    assert [s[1] for s in seen if s[2] == "vllm"] == ["env", "contract"]
    from envbuild.probe_exec import EXPECT_KEYS

    assert set(seen[0][3]) == set(EXPECT_KEYS) and seen[0][3]["engine_version"] == "0.8.4"
    assert all(s[0] == bad.image["ref"] for s in seen if s[2] == "vllm")
    assert (bad.stage, bad.status, bad.cause) == ("probe", "fail", "abi-mismatch")
    assert "native-extensions: undefined symbol _ZN3c10" in bad.detail and "imports" not in bad.detail
    assert set(bad.probe) == {"env", "contract"}
    # needs-gpu on a CPU host is not a failure
    assert (good.stage, good.status) == ("probe", "ok") and set(good.probe) == {"env", "contract"}


def test_probe_timeout_is_a_failure_of_the_stack_in_build_as_in_every_probe_path(tmp_path):
    # One rule (vocab.VERDICT_TO_RECORD, README): a hang is a verdict, so an earlier "works" cannot stand.
    b = make_builder(tmp_path, FakeEngine(), probe="gpu",
                     probe_fn=lambda image, **kw: {"status": "timeout" if kw["level"] == "gpu" else "pass"})
    (r,), _ = PL.run_all(b, [combo()], 1)
    assert (r.stage, r.status, r.cause) == ("probe", "fail", "timeout") and set(r.probe) == {"env", "contract", "gpu"}


def test_ctrl_c_keeps_earlier_records_and_rerun_resumes(tmp_path):
    def hang(call, on_line, stop):
        _thread.interrupt_main()  # what Ctrl-C does to the main thread
        assert stop.wait(120), "the orchestration must stop running builds"
        return BuildResult(False, -2, 1.0, interrupted=True, tail=["#5 [2/3] RUN uv pip install"])
    eng = FakeEngine({"hf": hang})
    b = make_builder(tmp_path, eng)
    combos = [combo(), combo("hf", ""), combo("vllm", "0.8.5.post1")]
    recs, interrupted = PL.run_all(b, combos, 1)
    assert interrupted
    assert [r.combo["id"] for r in recs] == [combo().id]
    on_disk = [r.combo["id"] for r in iter_records(tmp_path / "results")]
    assert on_disk == [combo().id]  # no verdict for the interrupted one, none for the unstarted one
    assert B.summarize(recs, b.o, True, 3, out=open(os.devnull, "w")) == 130

    eng.script.clear()
    b2 = make_builder(tmp_path, eng)  # rerun: first is reused, the others build
    recs2, interrupted2 = PL.run_all(b2, combos, 1)
    assert not interrupted2 and all(r.status == "ok" for r in recs2)
    assert [r.image["reused"] for r in sorted(recs2, key=lambda r: combos.index(
        next(c for c in combos if c.id == r.combo["id"])))] == [True, False, False]


def test_a_verdict_is_reused_by_image_content_and_a_changed_probe_probes_again(tmp_path, monkeypatch):
    from envbuild import probe_run

    calls = []

    def probe(image, **kw):
        calls.append(kw["level"])
        return {"status": "pass", "checks": [], "level": kw["level"]}

    def builder():
        b = make_builder(tmp_path, eng, probe="cpu", probe_fn=probe)
        b.verdict_cache = probe_run.VerdictCache(tmp_path / "verdicts")
        return b

    eng = FakeEngine()
    (r1,), _ = PL.run_all(builder(), [combo()], 1)
    assert calls == ["env", "contract"] and r1.status == "ok"
    (r2,), _ = PL.run_all(builder(), [combo()], 1)  # same image content, same probe: nothing runs
    assert calls == ["env", "contract"]
    assert r2.status == "ok" and {v.reused_from for v in r2.probe.values()} == {r1.run_id}
    monkeypatch.setattr(probe_run, "probe_code_hash", lambda: "a changed probe")
    (r3,), _ = PL.run_all(builder(), [combo()], 1)
    assert calls == ["env", "contract"] * 2 and r3.probe["env"].reused_from is None


def test_a_record_states_the_base_it_was_built_on_and_the_glibc_the_probe_read(tmp_path):
    """What the build observed stays in its own fields (base, the probe's versions); the combination
    is what was planned, never rewritten with observations."""
    probe = lambda image, **kw: {"status": "pass", "checks": [], "versions": {"glibc": "glibc-2.36"}}  # noqa: E731
    (r,), _ = PL.run_all(make_builder(tmp_path, FakeEngine(), probe="cpu", probe_fn=probe), [combo()], 1)
    assert r.base == {"kind": "bootstrap", "ref": "envbuild/base:bookworm-py3-abc"}
    assert r.probe["env"].versions["glibc"] == "glibc-2.36"
    assert r.combo == combo().to_dict()  # the plan, as planned
    row = fold_combo([r])
    assert row.base["ref"] == "envbuild/base:bookworm-py3-abc" and row.versions["glibc"] == "glibc-2.36"


def test_concurrency_runs_builds_at_once(tmp_path):
    live, peak = [0], [0]
    lk = threading.Lock()

    def slow(call, on_line, stop):
        with lk:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.3)
        with lk:
            live[0] -= 1
        return BuildResult(True, 0, 0.3, tail=[])
    eng = FakeEngine({"verl": slow})
    b = make_builder(tmp_path, eng)
    recs, _ = PL.run_all(b, [combo(), combo("hf", ""), combo("vllm", "0.8.5.post1")], jobs=3)
    assert len(recs) == 3 and peak[0] == 3


def test_options_validation(tmp_path, monkeypatch, capsys):
    import argparse

    p = argparse.ArgumentParser()
    B.add_arguments(p)
    with pytest.raises(InputError, match="--push"):
        B.options_from_args(p.parse_args(["--push"]), "envbuild/verl")
    with pytest.raises(InputError, match="--ca-bundle"):
        B.options_from_args(p.parse_args(["--ca-bundle", str(tmp_path / "nope")]), "envbuild/verl")
    with pytest.raises(InputError, match="--jobs"):
        B.options_from_args(p.parse_args(["-j", "0"]), "envbuild/verl")
    monkeypatch.delenv("ENVBUILD_REPOSITORY", raising=False)
    monkeypatch.delenv("ENVBUILD_REPO", raising=False)
    monkeypatch.delenv("ENVBUILD_REGISTRY", raising=False)
    o = B.options_from_args(p.parse_args(["--repository", "127.0.0.1:5000", "--push"]), "envbuild/verl")
    assert (o.repo, o.in_registry) == ("127.0.0.1:5000/envbuild/verl", True)
    o = B.options_from_args(p.parse_args(["--repository", "127.0.0.1:5000/mine/img"]), "envbuild/verl")
    assert (o.repo, o.in_registry) == ("127.0.0.1:5000/mine/img", True)
    assert B.options_from_args(p.parse_args([]), "envbuild/verl").in_registry is False
    with pytest.raises(InputError, match="--repository"):
        B.options_from_args(p.parse_args(["--repository", "Bad Registry!"]), "envbuild/verl")
    # the old spellings still work for a release, with a warning
    o = B.options_from_args(p.parse_args(["--registry", "127.0.0.1:5000", "--push"]), "envbuild/verl")
    assert o.repo == "127.0.0.1:5000/envbuild/verl" and "--registry is deprecated" in capsys.readouterr().err
    monkeypatch.setenv("ENVBUILD_REPO", "127.0.0.1:5000/x/y")
    assert B.options_from_args(p.parse_args([]), "envbuild/verl").repo == "127.0.0.1:5000/x/y"
    assert "$ENVBUILD_REPO is deprecated" in capsys.readouterr().err


def test_the_build_gets_the_pytorch_index_the_lock_used(tmp_path, monkeypatch):
    import argparse

    p = argparse.ArgumentParser()
    B.add_arguments(p)
    monkeypatch.delenv("ENVBUILD_PYTORCH_INDEX", raising=False)
    o = B.options_from_args(p.parse_args([]), "envbuild/verl")
    assert o.torch_index_root == "https://download.pytorch.org/whl"  # the public index by default
    assert B.options_from_args(p.parse_args([]), "envbuild/verl", "https://mirror.example/whl").torch_index_root \
        == "https://mirror.example/whl"
    monkeypatch.setenv("ENVBUILD_PYTORCH_INDEX", "https://env.example/whl/")
    o = B.options_from_args(p.parse_args([]), "envbuild/verl", "https://mirror.example/whl")
    assert o.torch_index_root == "https://env.example/whl"
    b = PL.Builder(o, FakeEngine(), lock_fn=None, render_fn=None, base_fn=None)
    lr = SimpleNamespace(torch_index="https://env.example/whl/cu126", combo=SimpleNamespace(cuda="cu126"))
    assert b._secret_values(lr)["torch-index-url"] == "https://env.example/whl/cu126"
    assert "torch-index-url" not in b._secret_values(SimpleNamespace(torch_index="default", combo=lr.combo))


def test_ca_bundle_default_follows_pip_then_ssl_env(tmp_path, monkeypatch):
    a, c = tmp_path / "a.pem", tmp_path / "c.pem"
    a.write_text("x"), c.write_text("y")
    for v in B.CA_ENV:
        monkeypatch.delenv(v, raising=False)
    assert B.default_ca_bundle() is None
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(c))
    assert B.default_ca_bundle() == str(c)
    monkeypatch.setenv("PIP_CERT", str(a))
    assert B.default_ca_bundle() == str(a)
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "missing"))
    assert B.default_ca_bundle() == str(c)


def test_step_tracker_follows_buildkit_plain_output():
    steps = []
    t = BL.StepTracker(steps.append)
    for ln in BUILDKIT_FAIL_COMPILE:
        t(ln + "\n")
    assert steps[-1].startswith("[3/4] RUN") and len(steps) == 2
    assert t.failed.startswith("[3/4] RUN")


def test_summary_prints_where_images_and_results_are(tmp_path, capsys):
    b = make_builder(tmp_path, FakeEngine())
    recs, _ = PL.run_all(b, [combo()], 1)
    assert B.summarize(recs, b.o, False, 1) == 0
    out = capsys.readouterr().out
    assert "images: envbuild/verl" in out and str(tmp_path / "results" / "records") in out
    assert recs[0].image["ref"] in out
    # neither probed nor pushed (the headline's defaults): the summary says what makes it pickable
    assert "not pickable yet" in out and "--probe cpu --push --repository" in out
    b.o.probe, b.o.push = "cpu", True
    B.summarize(recs, b.o, False, 1)
    assert "not pickable yet" not in capsys.readouterr().out


def test_rich_progress_renders_states_and_steps(tmp_path):
    import io

    stream = io.StringIO()
    combos = [combo(), combo("hf", "")]
    eng = FakeEngine({"vllm": lambda call, on_line, stop: _replay(BUILDKIT_FAIL_COMPILE, on_line, ok=False)})
    b = make_builder(tmp_path, eng)
    with PR.RichProgress(combos, stream=stream) as prog:
        b.progress = prog
        recs, _ = PL.run_all(b, combos, 2)
    out = stream.getvalue()
    assert combo().id in out and combo("hf", "").id in out
    assert prog.rows[combo().id][0] == "fail" and prog.rows[combo("hf", "").id][0] == "ok"
    assert prog.rows[combo().id][1] == "compile-failure"


def test_plain_progress_beats_between_state_lines_with_the_running_build_step():
    """Piped, a build step of minutes was one line and then silence (issue 50): the one progress
    model's beat now says which combination runs, in which step, for how long."""
    import io
    import time

    stream = io.StringIO()
    c = combo()
    with PR.PlainProgress([c], stream=stream, every=0.05) as prog:
        prog.update(c.id, "building")
        prog.step(c.id, "#12 [engine 2/3] RUN uv pip install --no-deps")
        time.sleep(0.3)
        prog.update(c.id, "ok")
        time.sleep(0.15)
    lines = stream.getvalue().splitlines()
    beats = [ln for ln in lines if "build: " in ln]
    assert any("build: 0/1 combinations done" in ln and f"running {c.id} (#12 [engine 2/3] RUN uv pip" in ln
               for ln in beats), lines
    assert "build: 1/1 combinations done" in beats[-1] and f"last: {c.id}: ok" in beats[-1]
    assert any(ln.endswith(f"{c.id}: building (0s)") for ln in lines)  # the state lines stay
