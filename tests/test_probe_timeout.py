"""A probe that hangs is killed at its timeout (here and in a container), and a container probe of
an image without torch is a verdict (fail, cause named), not a crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from envbuild.docker import default_client as docker_exe
from envbuild.probe_exec import probe_here
from envbuild.probe_run import probe_image, probe_image_levels

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


def test_the_probe_does_not_wait_for_the_stacks_exit_handlers(tmp_path):
    # The verdict is written, then the process ends at once: the teardown of torch, Ray and an
    # engine takes seconds and judges nothing (probe/__main__.py).
    site = tmp_path / "site"
    site.mkdir()
    # (the probe's process alone: its children, pip check, do not inherit the variable)
    (site / "sitecustomize.py").write_text("import atexit, os, time\n"
                                           "if os.environ.pop('SLOW_EXIT', None):\n"
                                           "    atexit.register(time.sleep, 120)\n")
    t0 = time.monotonic()
    v = probe_here(level="env", engine="hf", expect={}, timeout=60,
                   extra_env={"PYTHONPATH": str(site), "SLOW_EXIT": "1"})
    assert v["status"] != "timeout" and v["runner"]["exit_code"] is not None, v
    assert v["checks"] and time.monotonic() - t0 < 30


def killed_in_verl_import(tmp_path, first: float, level: str, env: dict | None = None) -> tuple[Path, list[float]]:
    """probe_here with a verl whose import hangs, until the probe is killed at its limit after the
    hang began: the limit has to outlast torch's import before verl's is reached (10 s on a quiet
    machine, a minute under load), so it starts at `first` and doubles, four tries. Every run must
    end as a timeout. -> (the hanging process's pid file, each run's seconds)."""
    site = tmp_path / "site"
    (site / "verl").mkdir(parents=True)
    pidfile = tmp_path / "pid"
    (site / "verl" / "__init__.py").write_text(HANG.format(pidfile=str(pidfile)))
    took: list[float] = []
    for limit in (first, 2 * first, 4 * first, 8 * first):
        pidfile.unlink(missing_ok=True)
        t0 = time.monotonic()
        v = probe_here(level=level, engine="hf", expect={}, timeout=limit,
                       extra_env={"PYTHONPATH": str(site), **(env or {})})
        took.append(time.monotonic() - t0)
        assert v["status"] == "timeout", v
        if pidfile.exists():
            return pidfile, took
    pytest.fail(f"the probe was killed before it reached verl even at {8 * first:.0f} s")


@pytest.mark.slow
def test_here_hang_in_verl_import_is_killed(tmp_path):
    pytest.importorskip("torch")
    pidfile, _took = killed_in_verl_import(tmp_path, 20, "contract")
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


def _site_image(tmp_path_factory, name: str, files: dict[str, str]):
    """An image of the bootstrap base whose system Python has `files` (path -> text) in its
    dist-packages and /opt/venv/bin/python (where the probe looks); yields its tag, then removes it."""
    docker = docker_exe()
    if not shutil.which(docker):
        pytest.skip("no docker client")
    base = _base_image(docker)
    ctx = tmp_path_factory.mktemp("ctx")
    for rel, text in files.items():
        (ctx / "site" / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx / "site" / rel).write_text(text)
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\n"
        "RUN mkdir -p /opt/venv/bin && ln -s /usr/bin/python3 /opt/venv/bin/python\n"
        "COPY site /usr/lib/python3/dist-packages/\n")
    tag = f"envbuild-test/{name}:{os.getpid()}"
    r = subprocess.run([docker, "build", "--network", "host", "-t", tag, str(ctx)], capture_output=True, text=True,
                       env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    yield tag
    subprocess.run([docker, "rmi", "-f", tag], capture_output=True)


HANG_VERL = {"verl/__init__.py": "import time\ntime.sleep(3600)\n"}


@pytest.fixture(scope="module")
def hang_image(tmp_path_factory):
    yield from _site_image(tmp_path_factory, "probe-hang", HANG_VERL)


@pytest.mark.docker
def test_container_hang_is_killed_and_removed(hang_image):
    docker = docker_exe()
    t0 = time.monotonic()
    v = probe_image(hang_image, level="contract", engine="hf", expect={}, timeout=20, pull="never")
    assert time.monotonic() - t0 < 90
    assert v["status"] == "timeout", v
    cmd = v["runner"]["cmd"]
    name = cmd[cmd.index("--name") + 1]
    assert "--read-only" in cmd and cmd[cmd.index("--network") + 1] == "none"  # the probe needs no network (issue 26)
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


# ----------------------------------------------------------------------------- all levels, one container
# A stand-in CPU torch and transformers' metadata, so the env level passes, and a verl whose import
# hangs, so the contract level does not end.
FAKE_TORCH = ("__version__ = '2.6.0+cpu'\n"
              "class version:\n    cuda = None\n"
              "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n")


@pytest.fixture(scope="module")
def env_passes_contract_hangs(tmp_path_factory):
    meta = {f"{d}-{v}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {d}\nVersion: {v}\n"
            for d, v in (("transformers", "4.51.3"), ("verl", "0.4.1"))}
    yield from _site_image(tmp_path_factory, "probe-staged", {**HANG_VERL, "torch/__init__.py": FAKE_TORCH, **meta})


def _probe_containers(docker: str, image: str) -> int:
    out = subprocess.run([docker, "ps", "-a", "-q", "--filter", f"ancestor={image}"], capture_output=True, text=True)
    return len(out.stdout.split())


@pytest.mark.docker
def test_levels_run_in_one_container_and_an_ended_level_keeps_its_verdict(env_passes_contract_hangs):
    image, docker = env_passes_contract_hangs, docker_exe()
    started, t0 = [], time.monotonic()

    def on_level(lv):
        started.append((lv, _probe_containers(docker, image)))

    got = probe_image_levels(image, levels=["env", "contract"], engine="hf", expect={"verl": "0.4.1"},
                             timeout=15, on_level=on_level, pull="never")
    took = time.monotonic() - t0
    assert list(got) == ["env", "contract"]
    env, contract = got["env"], got["contract"]
    # env ended in the container and keeps its own verdict; contract outlived its 15 s and is a timeout
    assert env["status"] == "pass" and env["level"] == "env", env
    assert {c["name"] for c in env["checks"]} >= {"import-torch", "verl-version"}
    assert all(c["level"] == "env" for c in env["checks"])
    assert (contract["status"], contract["cause"], contract["level"]) == ("timeout", "timeout", "contract")
    # one container for both levels: contract starts in the one env ran in; each level has its own
    # clock (15 s each, not 30 s in all)
    assert [lv for lv, _ in started] == ["env", "contract"] and started[1][1] == 1, started
    assert env["runner"]["cmd"] == contract["runner"]["cmd"] and "--levels-dir" in env["runner"]["cmd"]
    assert 15 <= contract["runner"]["wall_seconds"] < 40 and env["runner"]["wall_seconds"] < 15
    assert took < 60 and _probe_containers(docker, image) == 0


@pytest.mark.docker
def test_a_failing_level_stops_the_run_and_a_level_not_asked_for_still_decides(hang_image):
    # No torch: env fails, so contract never runs; asked for contract alone, the probe's final
    # verdict (env's failure) is contract's.
    both = probe_image_levels(hang_image, levels=["env", "contract"], engine="hf", expect={}, timeout=60, pull="never")
    assert list(both) == ["env"] and both["env"]["status"] == "fail" and both["env"]["cause"] == "module-missing"
    alone = probe_image_levels(hang_image, levels=["contract"], engine="hf", expect={}, timeout=60, pull="never")
    assert list(alone) == ["contract"]
    v = alone["contract"]
    assert (v["status"], v["level"], v["runner"]["exit_code"]) == ("fail", "contract", 1)
    assert any(c["name"] == "import-torch" and c["status"] == "fail" for c in v["checks"])
