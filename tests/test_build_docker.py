"""envbuild.docker without a daemon: client detection against fake clients, argv, logging,
timeouts, references, registry checks against a local HTTP server."""

from __future__ import annotations

import http.server
import os
import stat
import threading
import time

import pytest

from envbuild import docker as D
from envbuild import push as P
from envbuild import runlog
from envbuild import secretfiles as S
from envbuild import values as V
from envbuild.errors import InfraError

FAKE = """#!/bin/sh
# a fake docker client: behaviour from its own file name
case "$1 $2" in
  "version --format") {version} ;;
  "buildx version") {buildx} ;;
  "build --help") {help} ;;
esac
"""
UP = 'echo 20.10.24; exit 0'
DOWN = 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2; exit 1'
NO = 'echo "docker: unknown command: docker buildx" >&2; exit 1'
YES = 'echo "github.com/docker/buildx v0.12"; exit 0'
LEGACY_HELP = 'echo "Install the buildx component to build images with BuildKit:"; exit 0'
BK_HELP = ('if [ "$DOCKER_BUILDKIT" = 1 ]; then echo "      --secret stringArray   Secret file to expose"; '
           'else echo "  -q, --quiet"; fi; exit 0')


def fake_client(tmp_path, name, version=UP, buildx=NO, help=LEGACY_HELP):
    p = tmp_path / name
    p.write_text(FAKE.format(version=version, buildx=buildx, help=help))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_detect_prefers_buildx(tmp_path):
    e = D.detect(fake_client(tmp_path, "docker", buildx=YES))
    assert e.mode == "buildx" and "buildx" in e.describe()
    assert e.build_argv("ctx")[:4] == [e.client, "buildx", "build", "--load"]


def test_detect_skips_a_client_without_buildkit_for_one_with_it(tmp_path, monkeypatch):
    new = fake_client(tmp_path, "new-docker")  # newer client, no buildx: its legacy builder refuses BuildKit
    deb = fake_client(tmp_path, "debian-docker", help=BK_HELP)
    monkeypatch.setattr(D, "_candidates", lambda: [new, deb])
    e = D.detect()
    assert (e.client, e.mode) == (deb, "buildkit")
    assert e._env()["DOCKER_BUILDKIT"] == "1"


def test_detect_says_when_no_client_can_build(tmp_path, monkeypatch):
    new = fake_client(tmp_path, "new-docker")
    monkeypatch.setattr(D, "_candidates", lambda: [new])
    with pytest.raises(InfraError, match="no-buildkit: no docker client can build with BuildKit"):
        D.detect()


def test_detect_says_when_no_daemon_answers(tmp_path):
    with pytest.raises(InfraError) as ei:
        D.detect(fake_client(tmp_path, "docker", version=DOWN, buildx=YES))
    assert ei.value.cause == "daemon-error" and "no Docker daemon answers" in str(ei.value)
    assert "\n" not in str(ei.value)


def test_build_argv_host_network_secrets_labels_tags():
    e = D.Engine("/usr/bin/docker", "buildkit")
    argv = e.build_argv("/ctx", dockerfile="/ctx/Dockerfile", tags=["r:a", "r:b"], labels={"k": "v"},
                        secrets={"ca-bundle": "/etc/ca.pem", "index-url": "/tmp/s/index-url"}, iidfile="/tmp/iid")
    s = " ".join(argv)
    assert argv[:2] == ["/usr/bin/docker", "build"] and argv[-1] == "/ctx"
    assert "--network host" in s and "--progress plain" in s
    assert "--secret id=ca-bundle,src=/etc/ca.pem" in s and "--secret id=index-url,src=/tmp/s/index-url" in s
    assert "-t r:a -t r:b" in s and "--label k=v" in s and "-f /ctx/Dockerfile" in s


def test_secret_files_are_private_and_removed():
    with S.secret_files({"index-url": "https://u:p@idx/simple"}) as f:
        p = f["index-url"]
        assert open(p).read() == "https://u:p@idx/simple"
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(p)).st_mode) == 0o700
    assert not os.path.exists(p)


def test_run_logged_keeps_log_and_tail(tmp_path):
    log = tmp_path / "logs" / "x.log"
    seen = []
    r = runlog.run_logged(["sh", "-c", "for i in $(seq 1 300); do echo line$i; done; exit 3"], log, on_line=seen.append)
    assert (r.ok, r.rc) == (False, 3)
    assert r.tail[-1] == "line300" and len(r.tail) == runlog.TAIL_LINES and len(seen) == 300
    text = log.read_text()
    assert "line1\n" in text and "envbuild: exit 3" in text


def test_run_logged_timeout_kills_the_process_group(tmp_path):
    t = time.monotonic()
    # a child that ignores nothing but would outlive its parent if only the parent were killed
    pidfile = tmp_path / "bg.pid"
    r = runlog.run_logged(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; sleep 60"], tmp_path / "t.log", timeout=1)
    assert r.timed_out and not r.ok and time.monotonic() - t < 20
    assert "timed out after 1s" in (tmp_path / "t.log").read_text()
    bg = int(pidfile.read_text())
    for _ in range(50):  # the background child is gone too (reaped by init shortly after)
        try:
            os.kill(bg, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"background child {bg} outlived the timeout")


def test_run_logged_stop_event_interrupts(tmp_path):
    ev = threading.Event()
    threading.Timer(0.5, ev.set).start()
    r = runlog.run_logged(["sleep", "60"], tmp_path / "s.log", stop=ev)
    assert r.interrupted and not r.ok and r.seconds < 20


@pytest.mark.parametrize("ref,repo,tag", [
    ("127.0.0.1:5000/envbuild/verl:verl0.4.1-x", "127.0.0.1:5000/envbuild/verl", "verl0.4.1-x"),
    ("envbuild/verl", "envbuild/verl", "latest"),
    ("localhost:5000/a", "localhost:5000/a", "latest"),
    ("r/a@sha256:" + "a" * 64, "r/a", "@sha256:" + "a" * 64),
])
def test_split_ref(ref, repo, tag):
    assert V.split_ref(ref) == (repo, tag)


def test_registry_host():
    assert V.registry_host("127.0.0.1:5000/envbuild/verl") == "127.0.0.1:5000"
    assert V.registry_host("envbuild/verl") is None  # the default registry: never asked by name


class _Registry(http.server.BaseHTTPRequestHandler):
    tags = {"/v2/envbuild/verl/manifests/have": "sha256:" + "e" * 64}

    def do_HEAD(self):
        dig = self.tags.get(self.path)
        self.send_response(200 if dig and "manifest" in self.headers.get("Accept", "") else 404)
        if dig:
            self.send_header("Docker-Content-Digest", dig)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_registry_digest_asks_the_v2_api():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{srv.server_address[1]}"
        e = D.Engine("docker", "buildkit")
        assert P.registry_digest(f"{host}/envbuild/verl:have") == "sha256:" + "e" * 64
        assert e.registry_has(f"{host}/envbuild/verl:have")
        assert e.remote_digest(f"{host}/envbuild/verl:have") == f"{host}/envbuild/verl@sha256:" + "e" * 64
        assert not e.registry_has(f"{host}/envbuild/verl:missing")
    finally:
        srv.shutdown()
    assert P.registry_digest("127.0.0.1:9/envbuild/verl:x", timeout=2) is None  # nothing listens: absent
