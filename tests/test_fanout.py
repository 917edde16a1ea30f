"""Ray fan-out of probes: a real local Ray cluster (CPU-only, logical GPUs), real images probed
at the contract level, a node killed mid-probe retried elsewhere, then recorded as error."""

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envbuild.fanout import Attempt, Outcome, write_outcome
from envbuild.outcome import record_status
from envbuild.probe_exec import expect_of
from envbuild.probe_run import ProbeJob, jobs_from_results
from envbuild.matrix import load_matrix
from envbuild.expand import plan
from envbuild.selector import Selectors
from envbuild.paths import default_matrix
from envbuild.record import Record, iter_records, write_record
from envbuild.fold import fold

DOCKER = "/usr/bin/docker"
FAST, SLOW = "envbuild-test/fanout:fast", "envbuild-test/fanout:slow"


def _combos():
    pl = plan(load_matrix(default_matrix()), Selectors(verl="0.4.1", cuda="cu124"))
    by_engine = {c.engine: c for c in reversed(pl.combos)}  # the first (oldest) per engine
    return by_engine["vllm"], by_engine["hf"]


# ---------------------------------------------------------------- units (no Ray)


def test_record_status_and_error_is_never_a_verdict(tmp_path):
    vllm, hf = _combos()
    job = ProbeJob(vllm.to_dict(), {"ref": FAST, "id": "sha256:" + "1" * 64}, {"kind": "bootstrap", "ref": "b"}, "ab" * 32)
    assert expect_of(job.combo) == {"cuda": "cu124", "torch": "2.6.0", "engine_version": "0.8.4", "verl": "0.4.1",
                                     "platform": "linux/amd64"}
    fail = {"status": "fail", "cause": "module-missing", "checks": [{"name": "import-torch", "status": "fail",
                                                                      "detail": "No module named 'torch'"}]}
    assert record_status({"contract": fail})[:2] == ("fail", "module-missing")
    assert record_status({"contract": {"status": "needs-gpu"}})[0] == "ok"
    assert record_status({"contract": {"status": "timeout", "checks": []}})[:2] == ("fail", "timeout")
    # The build record the probes are of (a probe-only record counts only for an image one made).
    write_record(tmp_path, Record(combo=job.combo, stage="build", status="ok", image=job.image, lock_hash="ab" * 32,
                                  timings={"render": 0.1, "build": 1.0}))
    # Lost three times: an infrastructure error naming every node, and the table keeps the row unbroken.
    lost = Outcome(job, attempts=[Attempt(f"node{i}", "h", "lost", "NodeDiedError") for i in range(3)])
    rec = write_outcome(tmp_path, lost)
    assert (rec.status, rec.cause, rec.stage) == ("error", "node-lost", "probe")
    assert all(f"node{i}" in rec.detail for i in range(3))
    row = fold(iter_records(tmp_path))[0]
    assert row.status != "broken" and row.failure is None
    # A verdict after a lost attempt still counts, and says what was lost.
    ok = Outcome(job, verdicts={"contract": fail}, attempts=[Attempt("n1", "h", "lost", "x"), Attempt("n2", "h", "verdict")])
    rec2 = write_outcome(tmp_path, ok)
    assert rec2.status == "fail" and "earlier attempts lost: n1" in rec2.detail
    jobs, missing = jobs_from_results(tmp_path, [vllm, hf])
    assert [j.combo["id"] for j in jobs] == [vllm.id] and missing == [hf.id]


# ---------------------------------------------------------------- the real cluster

HOLDER = textwrap.dedent("""
    import json, os, sys, time
    import ray
    from ray.cluster_utils import Cluster
    ip = "127.0.0.1"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "node_ip_address": ip,
                                                       "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1, num_gpus=1, node_ip_address=ip) for _ in range(3)]
    c.wait_for_nodes()
    print(json.dumps({"address": c.address}), flush=True)

    def ancestors(pid):
        out = []
        while pid > 1:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                break
            out.append(pid)
        return out

    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "kill-node-of":
            up = ancestors(int(rest[0]))
            hit = [n for n in nodes if n.all_processes["raylet"][0].process.pid in up]
            for n in hit:
                c.remove_node(n, allow_graceful=False)
                nodes.remove(n)
            print(json.dumps({"killed": len(hit)}), flush=True)
        elif cmd == "quit":
            break
    c.shutdown()
""")


def _docker_build(tag: str, dockerfile: str, tmp: Path) -> None:
    d = tmp / tag.replace("/", "_").replace(":", "_")
    d.mkdir()
    (d / "Dockerfile").write_text(dockerfile)
    p = subprocess.run([DOCKER, "build", "-q", "--network", "host", "-t", tag, str(d)], capture_output=True,
                       text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"}, timeout=600)
    assert p.returncode == 0, p.stderr


def _docker_run_pids(image: str) -> list[int]:
    """The `docker run` clients probing `image` (probe_image names its containers envbuild-probe-*)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in args]
        if "run" in words and image in words and any(w.startswith("envbuild-probe-") for w in words):
            pids.append(int(d.name))
    return pids


def _readline(proc, timeout: float) -> str:
    r, _, _ = select.select([proc.stdout], [], [], timeout)
    assert r, "ray holder did not answer in time"
    return proc.stdout.readline()


@pytest.fixture
def images(tmp_path):
    from envbuild.base import bootstrap
    from envbuild.docker import detect

    base = bootstrap(detect(), log=lambda *a: None).ref  # reused when present
    # Real images: the bootstrap base plus a venv (no torch: the probe's verdict is a failure,
    # which is what must arrive). The slow one's interpreter starts 40 s late, so that a node
    # can be killed while it is being probed.
    _docker_build(FAST, f"FROM {base}\nRUN python3 -m venv /opt/venv\n", tmp_path)
    _docker_build(SLOW, f"FROM {base}\nRUN python3 -m venv /opt/venv && rm /opt/venv/bin/python && "
                        "printf '#!/bin/sh\\nsleep 40\\nexec /usr/bin/python3 \"$@\"\\n' > /opt/venv/bin/python && "
                        "chmod +x /opt/venv/bin/python\n", tmp_path)
    yield
    for img in (FAST, SLOW):
        ids = subprocess.run([DOCKER, "ps", "-aq", "--filter", f"ancestor={img}"], capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run([DOCKER, "rm", "-f", *ids], capture_output=True)
    subprocess.run([DOCKER, "rmi", "-f", FAST, SLOW], capture_output=True)


@pytest.mark.docker
@pytest.mark.slow
def test_ray_fanout_streams_verdicts_and_retries_lost_nodes(tmp_path, images):
    pytest.importorskip("ray")
    vllm, hf = _combos()
    results = tmp_path / "results"
    # The build records the fan-out starts from: which image each combination has.
    for combo, img in ((vllm, FAST), (hf, SLOW)):
        write_record(results, Record(combo=combo.to_dict(), stage="build", status="ok", image={"ref": img},
                                     base={"kind": "bootstrap", "ref": "base"}, lock_hash="cd" * 32))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    cli = None
    try:
        address = json.loads(_readline(holder, 180))["address"]
        assert address.startswith("127.0.0.1:")
        cli = subprocess.Popen([sys.executable, "-m", "envbuild", "probe", "--ray", address, "--verl", "0.4.1",
                                "--cuda", "cu124", "--results", str(results), "--level", "contract",
                                "--timeout", "120", "--retries", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        kills, killed_pids, fast_seen_at, t0 = 0, set(), None, time.monotonic()
        while cli.poll() is None and time.monotonic() - t0 < 300:
            for pid in _docker_run_pids(SLOW):
                if pid in killed_pids or kills >= 3:
                    continue
                holder.stdin.write(f"kill-node-of {pid}\n")
                holder.stdin.flush()
                if json.loads(_readline(holder, 60))["killed"]:
                    kills += 1
                killed_pids.add(pid)
            if fast_seen_at is None and any(r.stage == "probe" and r.combo["id"] == vllm.id for r in iter_records(results)):
                fast_seen_at = time.monotonic()
            time.sleep(0.5)
        out = cli.communicate(timeout=60)[0]
        assert cli.returncode is not None, "fan-out did not finish in time"
    finally:
        for p in (cli, holder):
            if p is not None and p.poll() is None:
                if p is holder:
                    try:
                        holder.stdin.write("quit\n")
                        holder.stdin.flush()
                        holder.wait(timeout=60)
                    except (OSError, subprocess.TimeoutExpired):
                        pass
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()

    probes = {r.combo["id"]: r for r in iter_records(results) if r.stage == "probe"}
    assert set(probes) == {vllm.id, hf.id}, out
    # The fast image's verdict arrived, from the probe in a container, and was recorded as it came.
    fast = probes[vllm.id]
    v = fast.probe["contract"]
    assert v.status in ("fail", "needs-gpu", "pass") and v.runner["mode"] == "image", v
    assert v.runner["image"] == FAST and any(c.name == "import-torch" for c in v.checks)
    assert fast.status == ("fail" if v.status == "fail" else "ok") and fast.machine.get("ray_node")
    assert fast_seen_at is not None, "the verdict was not streamed before the run ended"
    # The slow one lost its node three times (1 + 2 retries), each on a different node: an error.
    assert kills == 3, out
    slow = probes[hf.id]
    assert (slow.status, slow.cause) == ("error", "node-lost"), slow.detail
    nodes = [part.split(" on ")[1].split(" ")[0] for part in slow.detail.split("#")[1:]]
    assert len(nodes) == 3 and len(set(nodes)) == 3, slow.detail
    assert "retry 1/2 elsewhere" in out and "retry 2/2 elsewhere" in out
    row = {r.id: r for r in fold(iter_records(results))}[hf.id]
    assert row.status != "broken"
    # Two selected combinations had no image: said. Exit 1: the fast image's verdict is a failure.
    assert "no image recorded" in out and cli.returncode == (1 if fast.status == "fail" else 3), out
    print(out)


@pytest.mark.docker
def test_ci_probe_records_the_verdict_of_the_recorded_image(tmp_path, images, run_cli):
    """`envbuild ci probe` (the generated workflow's GPU step) probes the image the build record
    names, on this machine, with the same record as the fan-out."""
    vllm, _ = _combos()
    results = tmp_path / "results"
    write_record(results, Record(combo=vllm.to_dict(), stage="build", status="ok", image={"ref": FAST},
                                 base={"kind": "bootstrap", "ref": "base"}, lock_hash="cd" * 32))
    p = run_cli("ci", "probe", "--verl", "0.4.1", "--vllm", vllm.engine_version, "--cuda", "cu124",
                "--results", results, "--levels", "contract,gpu", "--timeout", "120")
    rec = next(r for r in iter_records(results) if r.stage == "probe")
    v = rec.probe["contract"]
    assert v.runner["image"] == FAST and v.status in ("fail", "needs-gpu", "pass")
    # A failing contract level stops there: the gpu level of a broken stack is not run.
    assert ("gpu" in rec.probe) == (v.status != "fail")
    assert p.returncode == (1 if rec.status == "fail" else 0), p.stdout + p.stderr
    assert f"{vllm.id}: {rec.status}" in p.stdout


def test_unreachable_head_is_one_line_infra_error(tmp_path, run_cli):
    vllm, _ = _combos()
    write_record(tmp_path, Record(combo=vllm.to_dict(), stage="build", status="ok", image={"ref": FAST}))
    p = run_cli("probe", "--ray", "127.0.0.1:1", "--verl", "0.4.1", "--vllm", vllm.engine_version,
                "--cuda", "cu124", "--results", tmp_path, timeout=60)
    assert p.returncode == 3 and "ray-unreachable" in p.stderr and "Traceback" not in p.stderr
    assert not [r for r in iter_records(tmp_path) if r.stage == "probe"]  # nothing recorded: no verdict
