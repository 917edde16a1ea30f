"""probe/requirements.py: pip check's reading of an environment without pip, line for line what
the installed pip says about the same distributions, plus what this pip may predate (wheels for
another platform) and what it only warns about (requirements that do not parse)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _dist(site: Path, name: str, version: str, requires=(), tag: str | None = None) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"  # as installers name it
    d.mkdir(parents=True)
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (d / "METADATA").write_text("\n".join(meta) + "\n")
    if tag:
        (d / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")


def _env(tmp_path: Path) -> dict:
    first, later = tmp_path / "first", tmp_path / "later"
    _dist(first, "Eb_Alpha", "1.0", ["eb-beta>=2", "eb-gamma", 'eb-delta; extra == "x"',
                                     'eb-epsilon; python_version < "3"'], tag="py3-none-any")
    _dist(first, "eb-beta", "1.0", tag="py3-none-any")
    _dist(later, "eb-beta", "3.0", tag="py3-none-any")  # shadowed by the first: never imported
    _dist(first, "eb-bad", "1.0", ["eb-beta (>=1"])
    _dist(first, "eb-wrongplat", "1.0", tag="cp27-cp27mu-manylinux1_i686")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (first, later)))}


def _ours(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envbuild.probe.requirements"], capture_output=True, text=True,
                          env=env, timeout=120, cwd="/")


def test_it_says_what_pip_check_says(tmp_path):
    env = _env(tmp_path)
    ours = _ours(env)
    assert ours.returncode == 1, ours.stderr
    mine = [ln for ln in ours.stdout.splitlines() if ln.startswith(("eb-", "Eb_"))]
    pip = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"], capture_output=True,
                         text=True, env=env, timeout=120, cwd="/")
    theirs = sorted(ln for ln in pip.stdout.splitlines() if ln.startswith(("eb-", "Eb_")))
    assert pip.returncode == 1
    # pip's own wording for the requirements it reads; the first eb-beta decides, as for pip.
    assert theirs and set(theirs) <= set(mine) and len(mine) == len(set(mine)) == 4
    assert "eb-alpha 1.0 requires eb-gamma, which is not installed." in mine
    assert "eb-alpha 1.0 has requirement eb-beta>=2, but you have eb-beta 1.0." in mine
    # What pip before 23.3 does not check, and what it only logs.
    extra = set(mine) - set(theirs)
    assert extra <= {"eb-wrongplat 1.0 is not supported on this platform"} | {
        ln for ln in mine if ln.startswith("eb-bad 1.0 has a requirement that does not parse: 'eb-beta (>=1'")}
    assert any(ln.startswith("eb-bad 1.0 has a requirement that does not parse") for ln in mine)
    assert "eb-wrongplat 1.0 is not supported on this platform" in mine
    assert not any("eb-delta" in ln or "eb-epsilon" in ln for ln in mine)  # markers that do not apply


def test_a_consistent_environment_passes_and_no_packaging_is_its_own_exit(tmp_path):
    site = tmp_path / "ok"
    _dist(site, "eb-one", "1.0", ["eb-two>=1"], tag="py3-none-any")
    _dist(site, "eb-two", "1.5", tag="py3-none-any")
    env = {**os.environ, "PYTHONPATH": str(site)}
    got = _ours(env)
    assert not any(ln.startswith("eb-") for ln in got.stdout.splitlines())
    # Without packaging (a stand-in that fails to import shadows it) the answer is "cannot tell".
    stub = tmp_path / "nopkg" / "packaging"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no packaging here')\n")
    got = _ours({**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path / "nopkg"), str(site)))})
    assert got.returncode == 3 and got.stdout == ""


def test_a_check_child_that_dies_is_read_again_in_process_never_a_pass(tmp_path):
    # A `pip check` killed at env's timeout (or crashed) prints nothing: that is no answer, and env
    # reads the requirements itself, so a broken environment still fails.
    from envbuild.probe import env_level
    from envbuild.probe.verdict import Verdict
    _dist(tmp_path, "eb-lonely", "1.0", ["eb-missing"], tag="py3-none-any")
    sys.path.insert(0, str(tmp_path))
    try:
        for how, code in (("pip check", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                          ("pip check", "import sys; sys.exit(2)"),
                          (env_level.OWN_CHECK, "import sys; sys.exit(1)")):
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            v = Verdict("env", "hf")
            env_level._check_pip(v, (proc, 0.0, how))
            (c,) = [c for c in v.checks if c.name == "pip-check"]
            assert c.status == "fail" and "eb-lonely 1.0 requires eb-missing, which is not installed." in c.detail, (how, code)
    finally:
        sys.path.remove(str(tmp_path))
