"""dockerfiles/venv-seed.py: the tools step moves the venv's seed extras into an archive in its own
layer, and the last install step unpacks them back. Moving must take all of a distribution (its
packages whole, its .pth, its scripts, so nothing imports as a leftover namespace) and nothing of
another; restoring must give back the same tree, byte for byte and mode for mode; the archive's
bytes must follow from the tree alone (the tools layer is shared by every image). Real uv, a real
venv, hand-made wheels; no network."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from envbuild.index_config import uv_exe
from envbuild.paths import templates_dir
from test_settle_overlaps import wheel

HELPER = templates_dir() / "venv-seed.py"
STEP_ENV = {**os.environ, "SOURCE_DATE_EPOCH": "946684800"}  # as the tools step sets it


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every path under root: (sha256 of a file's bytes, or 'dir'), mode."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir",
                                       p.stat().st_mode & 0o7777)
            for p in sorted(root.rglob("*"))}


def seed(py: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([py, "-I", str(HELPER), *args], capture_output=True, text=True, env=STEP_ENV)


def test_stash_takes_one_distribution_whole_and_restore_gives_it_back(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    alpha = wheel(wheels, "alpha", {"alpha/__init__.py": b"def main():\n    print('alpha')\n",
                                    "alpha/sub/mod.py": b"X = 1\n", "alpha-hook.pth": b"import alpha\n"}, "alpha:main")
    beta = wheel(wheels, "beta", {"beta/__init__.py": b"VALUE = 2\n"}, "beta:main")
    venv = tmp_path / "venv"
    subprocess.run([uv_exe(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = str(venv / "bin" / "python")
    for w in (alpha, beta):  # one at a time: both write bin/tool, and beta's is the one left
        # hash-checked .pyc, as in an install step (SOURCE_DATE_EPOCH): an import does not rewrite them
        subprocess.run([uv_exe(), "pip", "install", "-q", "--python", py, "--no-deps", "--compile-bytecode", str(w)],
                       check=True, env=STEP_ENV)
    os.chmod(next(venv.glob("lib/python3*/site-packages/alpha/sub/mod.py")), 0o755)  # modes come back too
    before = tree(venv)
    site = next((venv / "lib").glob("python3*/site-packages"))

    archive = tmp_path / "seed.tar"
    p = seed(py, "stash", str(archive), "Alpha", "gamma")
    assert p.returncode == 0, p.stderr
    assert not list(site.glob("alpha*")), sorted(os.listdir(site))  # package, .pth, dist-info: all gone
    assert (site / "beta").is_dir() and list(site.glob("beta-1.0.dist-info"))
    assert "from beta import main" in (venv / "bin" / "tool").read_text()  # not alpha's to take
    r = subprocess.run([py, "-c", "import alpha"], capture_output=True, text=True)
    assert r.returncode != 0 and "No module named 'alpha'" in r.stderr  # not even as a namespace
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    rel_site = str(site.relative_to(venv))
    assert {f"{rel_site}/alpha/sub/mod.py", f"{rel_site}/alpha-hook.pth", f"{rel_site}/alpha-1.0.dist-info/RECORD"} \
        <= {m.name for m in members}
    assert {(m.mtime, m.uid, m.gid, m.uname) for m in members} == {(946684800, 0, 0, "")}
    assert [m.name for m in members] == sorted((m.name for m in members), key=lambda n: n.split("/"))

    time.sleep(1.1)  # the restored files get a later time than the installed ones, as in a later step
    p = seed(py, "restore", str(archive))
    assert p.returncode == 0, p.stderr
    assert tree(venv) == before
    r = subprocess.run([py, "-c", "import alpha.sub.mod as m; print(m.X)"], capture_output=True, text=True)
    assert r.stdout.strip() == "1", r.stderr

    # the same tree gives the same archive, though every file now has another time
    again = tmp_path / "again.tar"
    assert seed(py, "stash", str(again), "alpha").returncode == 0
    assert again.read_bytes() == archive.read_bytes()


def test_nothing_stashed_is_nothing_restored(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([uv_exe(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = str(venv / "bin" / "python")
    before = tree(venv)
    p = seed(py, "stash", str(tmp_path / "s.tar"), "setuptools")
    assert p.returncode == 0 and "0 entries" in p.stdout, p.stdout + p.stderr  # uv's venv seeds nothing
    p = seed(py, "restore", str(tmp_path / "none.tar"))
    assert p.returncode == 0 and tree(venv) == before
    p = seed(py, "restore")
    assert p.returncode != 0 and "usage" in p.stderr
