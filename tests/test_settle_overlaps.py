"""dockerfiles/settle-overlaps.py: where two distributions of one install step write a file with
different bytes, the one whose name sorts last keeps it, whatever order uv's parallel install
left. Real uv, a real venv and two hand-made wheels; no network."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from envbuild.index_config import uv_exe
from envbuild.paths import templates_dir

HELPER = templates_dir() / "settle-overlaps.py"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(where: Path, name: str, files: dict[str, bytes], script: str) -> Path:
    """A minimal pure-Python wheel: `files`, plus a console script `tool` -> `<script>`."""
    di = f"{name}-1.0.dist-info"
    content = {**files,
               f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
               f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
               f"{di}/entry_points.txt": f"[console_scripts]\ntool = {script}\n".encode()}
    record = "".join(f"{p},sha256={_b64(d)},{len(d)}\n" for p, d in content.items()) + f"{di}/RECORD,,\n"
    path = where / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in {**content, f"{di}/RECORD": record.encode()}.items():
            z.writestr(p, d)
    return path


@pytest.fixture
def stack(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    ws = {
        "alpha": wheel(wheels, "alpha", {"alpha/__init__.py": b"def main():\n    print('alpha')\n",
                                         "shared/data.txt": b"from alpha\n", "ns/__init__.py": b""}, "alpha:main"),
        "beta": wheel(wheels, "beta", {"beta/__init__.py": b"def main():\n    print('beta')\n",
                                       "shared/data.txt": b"from beta\n", "ns/__init__.py": b""}, "beta:main"),
    }
    venv = tmp_path / "venv"
    subprocess.run([uv_exe(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = venv / "bin" / "python"

    def lock(*names: str) -> Path:
        p = tmp_path / f"{'-'.join(names)}.txt"
        p.write_text("".join(f"{n}==1.0 \\\n    --hash=sha256:{hashlib.sha256(ws[n].read_bytes()).hexdigest()}\n"
                             for n in names))
        return p

    def install_cmd(lock_path: Path) -> list[str]:
        return [uv_exe(), "pip", "install", "-q", "--python", str(py), "--no-deps", "--require-hashes", "--no-index",
                "--find-links", str(wheels), "-r", str(lock_path)]

    def settle(lock_path: Path, cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([str(py), "-I", str(HELPER), str(lock_path), "--", *cmd],
                              capture_output=True, text=True)

    return venv, lock, install_cmd, settle


def site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def test_the_last_name_keeps_an_overlapping_file_whatever_the_install_order(stack):
    venv, lock, install_cmd, settle = stack
    both = lock("alpha", "beta")
    # beta, then alpha over it: alpha's script and data are on disk, as a parallel install may leave them
    for n in ("beta", "alpha"):
        subprocess.run(install_cmd(lock(n)), check=True)
    assert "alpha" in (venv / "bin" / "tool").read_text()
    p = settle(both, install_cmd(both))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "alpha and beta write bin/tool with different bytes; beta's is kept" in p.stdout
    assert "shared/data.txt" in p.stdout and "ns/__init__.py" not in p.stdout  # equal bytes are no overlap
    assert "import main" in (venv / "bin" / "tool").read_text() and "from beta" in (venv / "bin" / "tool").read_text()
    assert (site(venv) / "shared" / "data.txt").read_bytes() == b"from beta\n"
    assert (site(venv) / "alpha" / "__init__.py").is_file()  # the other distribution is still installed
    # the other order gives the same files
    venv2_tool = (venv / "bin" / "tool").read_bytes()
    for n in ("alpha", "beta"):
        subprocess.run(install_cmd(lock(n)) + ["--reinstall-package", n], check=True)
    assert settle(both, install_cmd(both)).returncode == 0
    assert (venv / "bin" / "tool").read_bytes() == venv2_tool


def test_nothing_runs_without_an_overlap_and_a_failed_settle_says_which_files(stack):
    venv, lock, install_cmd, settle = stack
    only = lock("alpha")
    subprocess.run(install_cmd(only), check=True)
    p = settle(only, ["false"])  # would fail if it ran
    assert p.returncode == 0 and p.stdout == "", p.stdout + p.stderr
    both = lock("alpha", "beta")
    subprocess.run(install_cmd(lock("beta")), check=True)
    subprocess.run(install_cmd(only) + ["--reinstall-package", "alpha"], check=True)  # alpha's files on top
    p = settle(both, ["true"])  # a command that changes nothing: beta's files are not there
    assert p.returncode == 1 and "still differ from their RECORD" in p.stderr and "bin/tool" in p.stderr, p.stderr
