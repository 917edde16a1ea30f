"""A probe that hangs is killed at its timeout (here and in a container), and a container probe of
an image without torch is a verdict (fail, cause named), not a crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from envbuild.probe_run import docker_exe, probe_here, probe_image

HANG = "import os, time\nopen({pidfile!r}, 'w').write(str(os.getpid()))\ntime.sleep(3600)\n"


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie still answers kill(0): check its state
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.2)
    return False


def test_here_hang_at_start_is_killed(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    pidfile = tmp_path / "pid"
    (site / "sitecustomize.py").write_text(HANG.format(pidfile=str(pidfile)))
    t0 = time.monotonic()
    v = probe_here(level="env", engine="hf", expect={}, timeout=5, extra_env={"PYTHONPATH": str(site)})
    assert time.monotonic() - t0 < 30
    assert v["status"] == "timeout" and v["cause"] == "timeout" and v["runner"]["exit_code"] is None
    assert pidfile.exists() and _gone(int(pidfile.read_text()))


@pytest.mark.slow
def test_here_hang_in_verl_import_is_killed(tmp_path):
    pytest.importorskip("torch")
    site = tmp_path / "site"
    (site / "verl").mkdir(parents=True)
    pidfile = tmp_path / "pid"
    (site / "verl" / "__init__.py").write_text(HANG.format(pidfile=str(pidfile)))
    v = probe_here(level="contract", engine="hf", expect={}, timeout=90, extra_env={"PYTHONPATH": str(site)})
    assert v["status"] == "timeout"
    assert pidfile.exists(), "the probe was killed before it reached verl: raise the timeout"
    assert _gone(int(pidfile.read_text()))


# ----------------------------------------------------------------------------- in a container
def _base_image(docker: str) -> str:
    from envbuild.base import default_bootstrap_ref
    from envbuild.errors import EnvbuildError
    try:
        ref = default_bootstrap_ref()
    except EnvbuildError as e:
        pytest.skip(f"no bootstrap base: {e}")
    if subprocess.run([docker, "image", "inspect", ref], capture_output=True).returncode != 0:
        pytest.skip(f"bootstrap base {ref} not built here: run `envbuild base bootstrap`")
    return ref


@pytest.fixture(scope="module")
def hang_image(tmp_path_factory):
    docker = docker_exe()
    if not shutil.which(docker):
        pytest.skip("no docker client")
    base = _base_image(docker)
    ctx = tmp_path_factory.mktemp("ctx")
    (ctx / "verl").mkdir()
    (ctx / "verl" / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "RUN mkdir -p /opt/venv/bin && ln -s /usr/bin/python3 /opt/venv/bin/python\n"
        "COPY verl /usr/lib/python3/dist-packages/verl\n")
    tag = f"envbuild-test/probe-hang:{os.getpid()}"
    r = subprocess.run([docker, "build", "--network", "host", "-t", tag, str(ctx)], capture_output=True, text=True,
                       env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    yield tag
    subprocess.run([docker, "rmi", "-f", tag], capture_output=True)


@pytest.mark.docker
def test_container_hang_is_killed_and_removed(hang_image):
    docker = docker_exe()
    t0 = time.monotonic()
    v = probe_image(hang_image, level="contract", engine="hf", expect={}, timeout=20, pull="never")
    assert time.monotonic() - t0 < 90
    assert v["status"] == "timeout", v
    cmd = v["runner"]["cmd"]
    name = cmd[cmd.index("--name") + 1]
    assert "--read-only" in cmd and cmd[cmd.index("--network") + 1] == "host"
    left = subprocess.run([docker, "ps", "-a", "-q", "--filter", f"name=^/{name}$"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


@pytest.mark.docker
def test_container_without_torch_is_a_fail_verdict(hang_image):
    v = probe_image(hang_image, level="env", engine="hf", expect={"cuda": "12.4"}, timeout=120, pull="never")
    checks = {c["name"]: c for c in v["checks"]}
    assert v["status"] == "fail" and v["runner"]["exit_code"] == 1
    c = checks["import-torch"]
    assert (c["status"], c["cause"]) == ("fail", "module-missing") and "torch" in c["detail"]
    assert v["versions"]["python"].startswith("3.")


@pytest.mark.docker
def test_missing_image_is_an_error_not_a_verdict():
    if not shutil.which(docker_exe()):
        pytest.skip("no docker client")
    v = probe_image("envbuild-test/no-such-image:none", level="env", engine="hf", expect={}, timeout=60,
                    pull="never")
    assert v["status"] == "error" and v["cause"] == "docker-error"
