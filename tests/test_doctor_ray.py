"""`envbuild doctor` Ray checks against a real local Ray head (127.0.0.1, 2 logical GPUs), and rollout ports."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from envbuild.doctor import FAIL, PASS, SKIP, Options, check_ray
from envbuild.doctor.cluster import _query_ray, check_rollout_ports, rollout_ports
from envbuild.verl_config import build_config


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` with its own ports and temp dir; SIGTERM to it stops everything it started."""
    ray = shutil.which("ray")
    if not ray:
        pytest.skip("ray is not installed (pip install ray)")
    port = free_port()
    temp = tempfile.mkdtemp(prefix="rdoc")  # short: Ray's unix socket paths must stay under 107 chars
    log = open(os.path.join(temp, "head.log"), "w")
    cmd = [ray, "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1",
           "--num-gpus", "2", "--num-cpus", "1", "--include-dashboard=false", "--disable-usage-stats",
           "--temp-dir", temp, "--ray-client-server-port", str(free_port()),
           "--dashboard-agent-listen-port", str(free_port()), "--min-worker-port", "0", "--max-worker-port", "0"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("ray head did not start: " + open(log.name).read()[-2000:])
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this fixture started, nothing else
            proc.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_cluster_with_enough_gpus_passes_via_cli(ray_head, run_cli, tmp_path):
    t0 = time.monotonic()
    p = run_cli("doctor", "--json", "--skip", "env", "--skip", "data", "--skip", "output", "--skip", "grpo", "--",
                f"+ray_kwargs.ray_init.address={ray_head}", "trainer.nnodes=1", "trainer.n_gpus_per_node=2",
                timeout=240)
    checks = {c["name"]: c for c in json.loads(p.stdout)["checks"]}
    ray = checks["ray.cluster"]
    assert ray["status"] == PASS, ray
    assert ray["details"]["gpus"] == 2 and len(ray["details"]["nodes"]) == 1
    assert "2 GPUs" in ray["reason"] and "ray_kwargs.ray_init.address" not in ray["reason"]
    assert time.monotonic() - t0 < 200


def test_cluster_short_of_gpus_fails(ray_head):
    r = _query_ray(ray_head, "ray_init.address", 1, 4, "trainer.nnodes=1 x n_gpus_per_node=4", Options())
    assert r.status == FAIL and "only 0 node(s) have 4 GPUs" in r.reason


def test_cluster_short_of_nodes_fails_via_ray_address_env(ray_head, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_head)
    res = check_ray(build_config(None, ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]), Options())
    r = {x.name: x for x in res}["ray.cluster"]
    assert r.status == FAIL and ray_head in r.reason and "only 1 node(s)" in r.reason


def test_nothing_listening_fails_fast():
    port = free_port()
    t0 = time.monotonic()
    res = check_ray(build_config(None, [f"+ray_init.address=127.0.0.1:{port}"]), Options())
    r = {x.name: x for x in res}["ray.cluster"]
    assert r.status == FAIL and "does not answer" in r.reason and "ray_init.address" in r.reason
    assert time.monotonic() - t0 < 10


def test_no_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    one = {x.name: x for x in check_ray(build_config(None, []), Options())}
    assert one["ray.cluster"].status == SKIP
    two = {x.name: x for x in check_ray(build_config(None, ["trainer.nnodes=2"]), Options())}
    assert two["ray.cluster"].status == FAIL and "one-machine" in two["ray.cluster"].reason


def test_rollout_port_in_use_fails():
    cfg = build_config(None, ["actor_rollout_ref.rollout.name=sglang", "trainer.n_gpus_per_node=2"])
    assert rollout_ports(cfg) == ("sglang", [30000, 30001])  # verl's SGLang rollout: 30000 + rank
    assert check_rollout_ports(build_config(None, ["actor_rollout_ref.rollout.name=vllm"])).status == SKIP
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = check_rollout_ports(cfg, ports=[port])
        assert r.status == FAIL and r.details["busy"] == [port]
    finally:
        s.close()
    assert check_rollout_ports(cfg, ports=[port]).status == PASS
