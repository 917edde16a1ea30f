"""The bootstrap base for another platform (linux/arm64 on an amd64 host): its input hash and
reference, the errors when emulation or a registry is missing, the interpreter copy for a handler
without the F flag, and, on the real engine under qemu, a base that runs as aarch64 and a
BuildKit build FROM it by digest.

Run the real part: pytest -m "docker and slow" tests/test_base_arm64.py   (~7 min cold on 2 cores,
seconds when the base is already in the registry)
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from envbuild import base as Bs
from envbuild.docker import Engine
from envbuild.errors import InfraError, InputError
from envbuild.probe.hardware import host_platform, platform_arch, platform_machine

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = os.environ.get("ENVBUILD_REGISTRY_ADDR", "127.0.0.1:5000")
ARM = "linux/arm64"
MIRROR = "http://m/debian"


@pytest.fixture
def amd64_host(monkeypatch):
    """The unit tests reason about an amd64 host, whatever this one is."""
    monkeypatch.setattr(Bs, "host_platform", lambda: "linux/amd64")


# --- inputs and references -------------------------------------------------------------------

def test_amd64_inputs_are_what_they_always_were():
    """linux/amd64's inputs (and so its tag) are unchanged: bases made before the platform axis
    are reused."""
    legacy = {"recipe": Bs.RECIPE, "suite": "bookworm", "mirror": MIRROR, "variant": "minbase",
              "packages": sorted(Bs.PACKAGES), "arch": "amd64"}
    assert Bs.inputs("bookworm", MIRROR) == legacy
    assert Bs.inputs("bookworm", MIRROR, platform="linux/amd64") == legacy
    assert Bs.default_tag("bookworm", Bs.inputs("bookworm", MIRROR)) == \
        f"envbuild/base:bookworm-py3-{Bs.input_hash(legacy)[:12]}"


def test_the_input_hash_differs_per_platform():
    amd = Bs.inputs("bookworm", MIRROR, platform="linux/amd64")
    arm = Bs.inputs("bookworm", MIRROR, platform=ARM)
    assert arm["arch"] == platform_arch(ARM) and {**arm, "arch": amd["arch"]} == amd
    assert Bs.input_hash(arm) != Bs.input_hash(amd)
    assert Bs.default_tag("bookworm", arm) != Bs.default_tag("bookworm", amd)
    # Any spelling of the platform is the same base.
    assert Bs.inputs("bookworm", MIRROR, platform="aarch64") == arm


def test_a_foreign_base_lives_in_the_registry(amd64_host):
    arm = Bs.inputs("bookworm", MIRROR, platform=ARM)
    ref = Bs._base_ref("bookworm", arm, ARM, None, REGISTRY)
    assert ref == f"{REGISTRY}/envbuild/base:bookworm-py3-{Bs.input_hash(arm)[:12]}"
    assert Bs._base_ref("bookworm", arm, ARM, "my/base:x", REGISTRY) == f"{REGISTRY}/my/base:x"
    assert Bs._base_ref("bookworm", arm, ARM, "reg.example:443/my/base:x", None) == "reg.example:443/my/base:x"
    # The host's platform ignores the registry: a local tag, as always.
    amd = Bs.inputs("bookworm", MIRROR)
    assert Bs._base_ref("bookworm", amd, "linux/amd64", None, REGISTRY) == Bs.default_tag("bookworm", amd)


def test_a_foreign_base_without_a_registry_is_refused(amd64_host):
    arm = Bs.inputs("bookworm", MIRROR, platform=ARM)
    with pytest.raises(InputError) as e:
        Bs._base_ref("bookworm", arm, ARM, None, None)
    msg = str(e.value)
    assert "\n" not in msg and "--registry" in msg and "127.0.0.1:5000" in msg
    with pytest.raises(InputError, match="registry host"):
        Bs._base_ref("bookworm", arm, ARM, None, "not a host/")
    with pytest.raises(InputError, match="--registry"):  # the whole bootstrap stops before any work
        Bs.bootstrap(None, mirror=MIRROR, platform=ARM, log=lambda s: None)


def test_an_unknown_platform_is_input_error():
    with pytest.raises(InputError, match="linux/amd64, linux/arm64"):
        Bs.bootstrap(None, mirror=MIRROR, platform="linux/sparc", log=lambda s: None)


# --- emulation ------------------------------------------------------------------------------

HANDLER = ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: {flags}\noffset 0\n"
           "magic 7f454c460201010000000000000000000200b700\nmask ffffffffffffff00fffffffffffffffffeffffff\n")


def test_emulation_reads_the_binfmt_handler(tmp_path):
    assert Bs.emulation(ARM, tmp_path) is None  # binfmt_misc not mounted / no handler
    h = tmp_path / f"qemu-{platform_machine(ARM)}"
    h.write_text(HANDLER.format(flags="POF"))
    assert Bs.emulation(ARM, tmp_path) == {"interpreter": "/usr/libexec/qemu-binfmt/aarch64-binfmt-P", "flags": "POF"}
    h.write_text(HANDLER.format(flags=""))
    assert Bs.emulation(ARM, tmp_path)["flags"] == ""
    h.write_text(HANDLER.format(flags="POF").replace("enabled", "disabled"))
    assert Bs.emulation(ARM, tmp_path) is None


def test_missing_emulation_is_one_line_saying_what_to_do(tmp_path, monkeypatch, amd64_host):
    with pytest.raises(InfraError) as e:
        Bs.require_emulation(ARM, tmp_path)
    assert e.value.cause == "no-emulation" and "\n" not in str(e.value)
    assert "ci/emulation.sh" in str(e.value) and "qemu-aarch64" in str(e.value)

    # bootstrap: not in the registry, not here, no handler -> that error, before any debootstrap.
    monkeypatch.setattr(Bs, "BINFMT", tmp_path)
    monkeypatch.setattr(Bs, "_registry_digest", lambda ref: None)
    monkeypatch.setattr(Bs.shutil, "which", lambda name: pytest.fail("debootstrap must not be looked for"))

    class Nothing:
        def inspect(self, ref):
            return None

    with pytest.raises(InfraError, match="no-emulation"):
        Bs.bootstrap(Nothing(), mirror=MIRROR, platform=ARM, registry=REGISTRY, log=lambda s: None)


def test_a_foreign_base_in_the_registry_is_reused_by_digest(monkeypatch, amd64_host):
    dig = "sha256:" + "b" * 64
    asked = []
    monkeypatch.setattr(Bs, "_registry_digest", lambda ref: asked.append(ref) or dig)
    monkeypatch.setattr(Bs.shutil, "which", lambda name: None)  # debootstrap missing: must not be needed
    got = Bs.bootstrap(None, mirror=MIRROR, platform=ARM, registry=REGISTRY, log=lambda s: None)
    ref = f"{REGISTRY}/envbuild/base:bookworm-py3-{Bs.input_hash(Bs.inputs('bookworm', MIRROR, platform=ARM))[:12]}"
    assert asked == [ref] and got == Bs.Base("bootstrap", ref, dig)
    assert got.pinned == f"{ref}@{dig}"


def test_a_foreign_base_built_here_but_not_pushed_is_pushed(monkeypatch, amd64_host):
    monkeypatch.setattr(Bs, "_registry_digest", lambda ref: None)
    monkeypatch.setattr(Bs.shutil, "which", lambda name: None)

    class Here:
        pushed = []

        def inspect(self, ref):
            return {"Architecture": "arm64", "Os": "linux"}

        def push(self, ref):
            self.pushed.append(ref)
            return f"{ref.rsplit(':', 1)[0]}@sha256:{'c' * 64}"

    eng = Here()
    got = Bs.bootstrap(eng, mirror=MIRROR, platform=ARM, registry=REGISTRY, log=lambda s: None)
    assert eng.pushed == [got.ref] and got.digest == "sha256:" + "c" * 64


def test_without_the_F_flag_the_interpreter_is_copied_in_for_the_second_stage_only(tmp_path, monkeypatch):
    root = tmp_path / "rootfs"
    (root / "usr").mkdir(parents=True)
    interp = tmp_path / "host" / "qemu-aarch64-static"
    interp.parent.mkdir()
    interp.write_text("#!/bin/sh\n")
    inside = root / str(interp).lstrip("/")
    seen = []

    def fake_run(cmd, env=None, hint=""):
        seen.append((cmd, inside.is_file(), env))

    monkeypatch.setattr(Bs, "_run", fake_run)
    Bs._second_stage(root, [], {"interpreter": str(interp), "flags": "PO"})
    (cmd, present, env), = seen
    assert cmd == ["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"] and present
    assert env == Bs.CHROOT_ENV
    assert not inside.exists() and sorted(p.name for p in root.iterdir()) == ["usr"]  # copy and its folders gone

    seen.clear()  # with F: nothing is copied
    Bs._second_stage(root, [], {"interpreter": str(interp), "flags": "POF"})
    assert seen[0][1] is False and sorted(p.name for p in root.iterdir()) == ["usr"]


def test_build_argv_passes_the_platform_only_when_given():
    eng = Engine(client="/usr/bin/docker", mode="buildkit")
    argv = eng.build_argv("/ctx", tags=["t"], platform=ARM)
    assert argv[argv.index("--platform") + 1] == ARM and argv[-1] == "/ctx"
    assert "--platform" not in eng.build_argv("/ctx", tags=["t"])


# --- the real thing: qemu, the engine, the registry -------------------------------------------

def _registry_up() -> bool:
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{REGISTRY}/v2/", timeout=3):
            return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def engine():
    from envbuild.docker import detect

    try:
        eng = detect()
    except InfraError as e:
        pytest.skip(f"no Docker engine ({e}; ci/services.sh starts one)")
    if not _registry_up():
        if os.environ.get("CI"):
            pytest.fail(f"the registry on {REGISTRY} is not answering (run ci/services.sh)")
        pytest.skip(f"the registry on {REGISTRY} is not answering (ci/services.sh starts it)")
    return eng


@pytest.fixture(scope="module")
def emulated():
    """qemu for linux/arm64 with the F flag (containers need it); set up here when root."""
    if host_platform() == ARM:
        pytest.skip("this host is linux/arm64: nothing to emulate")
    h = Bs.emulation(ARM)
    if h is None or "F" not in h["flags"]:
        if os.geteuid() != 0:
            pytest.skip("linux/arm64 emulation is not set up and setting it up needs root (ci/emulation.sh)")
        p = subprocess.run(["bash", str(ROOT / "ci" / "emulation.sh")], capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stdout + p.stderr
        h = Bs.emulation(ARM)
    assert h and "F" in h["flags"], h
    return h


@pytest.fixture(scope="module")
def arm_base(engine, emulated):
    """The arm64 base, bootstrapped when the registry lacks it (~7 min), else reused from it.
    The registry keeps it (the cache); the local copies this test made are removed."""
    if os.geteuid() != 0 and not Bs.shutil.which("sudo"):
        pytest.skip("debootstrap needs root")
    ref = Bs.default_bootstrap_ref(platform=ARM, registry=REGISTRY)
    here_before = engine.image_exists(ref)
    base = Bs.bootstrap(engine, platform=ARM, registry=REGISTRY, log=print)
    yield base
    if not here_before:
        engine.remove(base.ref, base.pinned)


@pytest.mark.docker
@pytest.mark.slow
def test_arm64_base_runs_as_aarch64(engine, arm_base):
    assert re.fullmatch(re.escape(REGISTRY) + r"/envbuild/base:bookworm-py3-[0-9a-f]{12}@sha256:[0-9a-f]{64}",
                        arm_base.pinned), arm_base.pinned
    p = subprocess.run([engine.client, "run", "--rm", "--network", "host", "--platform", ARM, arm_base.pinned,
                        "python3", "-c", "import platform; print(platform.machine())"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "aarch64"
    d = engine.inspect(arm_base.pinned)
    assert (d["Os"], d["Architecture"]) == ("linux", "arm64")
    # Asked again: the registry's copy, same digest, no debootstrap.
    again = Bs.bootstrap(engine, platform=ARM, registry=REGISTRY, log=lambda s: None)
    assert again == arm_base


@pytest.mark.docker
@pytest.mark.slow
def test_buildkit_builds_for_arm64_from_the_pinned_base(engine, arm_base, tmp_path):
    marker = uuid.uuid4().hex[:12]
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {arm_base.pinned}\n"
        f"RUN echo {marker} && python3 -c 'import platform; print(\"machine=\" + platform.machine())' | tee /machine\n")
    tag = f"envbuild-test/arm64-build:{marker}"
    try:
        res = engine.build(tmp_path / "ctx", log_path=tmp_path / "build.log", tags=[tag], platform=ARM, timeout=600)
        log = (tmp_path / "build.log").read_text()
        assert res.ok, log[-3000:]
        assert "machine=aarch64" in log
        d = engine.inspect(tag)
        assert (d["Os"], d["Architecture"]) == ("linux", "arm64")
    finally:
        engine.remove(tag, force=True)
        # Its BuildKit cache records (the RUN step names the marker); never anyone else's.
        engine.prune_cache([c["ID"] for c in engine.cache_entries() if marker in (c.get("Description") or "")])


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.network
def test_the_probe_env_level_runs_an_arm64_image_under_emulation(engine, arm_base, tmp_path):
    """The probe's env level on a linux/arm64 image with a real aarch64 torch (the CPU build the
    default index serves for torch 2.9.1 on aarch64), through the launcher `build` uses: it runs
    emulated (`docker run --platform`), reads machine aarch64, and a row expecting amd64 is told
    platform-mismatch. The wheels are fetched here (pip, the configured index) for aarch64 and
    installed offline in the build. ~3 min warm, most of it torch's import under qemu."""
    import sys

    from envbuild.probe_run import probe_image

    ctx = tmp_path / "ctx"
    (ctx / "w").mkdir(parents=True)
    from envbuild.index_config import default_index_url, uv_exe

    # pip evaluates markers for this machine even with --platform: uv resolves for aarch64, pip fetches.
    p = subprocess.run([uv_exe(), "pip", "compile", "-", "--python-platform", "aarch64-manylinux_2_28",
                        "--python-version", "3.11", "--no-header", "--no-annotate", "--quiet"],
                       input="torch==2.9.1\n", capture_output=True, text=True, timeout=600,
                       env={**os.environ, "UV_DEFAULT_INDEX": default_index_url()})
    assert p.returncode == 0, p.stderr[-2000:]
    (tmp_path / "reqs.txt").write_text(p.stdout)
    assert "torch==2.9.1" in p.stdout and "nvidia" not in p.stdout  # aarch64 2.9.1 here is a CPU build
    p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11", "--implementation", "cp",
                        "-r", str(tmp_path / "reqs.txt"), "-d", str(ctx / "w")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    assert any(f.name.startswith("torch-2.9.1-") and "aarch64" in f.name for f in (ctx / "w").iterdir())
    marker = uuid.uuid4().hex[:12]
    (ctx / "Dockerfile").write_text(
        f"FROM {arm_base.pinned}\n"
        "COPY w /w\n"
        f"RUN echo {marker} && python3 -m venv /opt/venv && "
        "/opt/venv/bin/python -m pip install -q --no-index --no-compile --no-deps /w/*.whl && rm -rf /w\n")
    tag = f"envbuild-test/arm64-probe:{marker}"
    try:
        res = engine.build(ctx, log_path=tmp_path / "build.log", tags=[tag], platform=ARM, timeout=1800)
        assert res.ok, (tmp_path / "build.log").read_text()[-3000:]
        want = {"torch": "2.9.1", "cuda": "cpu", "platform": ARM}
        v = probe_image(tag, level="env", engine="hf", expect=want, gpus=False)
        checks = {c["name"]: c for c in v["checks"]}
        assert checks["platform"]["status"] == "pass", checks["platform"]
        assert v["versions"]["machine"] == "aarch64"
        assert checks["import-torch"]["status"] == "pass", checks["import-torch"]
        assert checks["torch-version"]["status"] == "pass" and checks["torch-cuda"]["status"] == "pass"
        # The same image judged as an amd64 row: the probe says it is not that platform's image.
        v = probe_image(tag, level="env", engine="hf", expect={**want, "platform": "linux/amd64"}, gpus=False)
        checks = {c["name"]: c for c in v["checks"]}
        assert (checks["platform"]["status"], checks["platform"]["cause"]) == ("fail", "platform-mismatch")
        assert v["status"] == "fail"
    finally:
        engine.remove(tag, force=True)
        engine.prune_cache([c["ID"] for c in engine.cache_entries() if marker in (c.get("Description") or "")])
