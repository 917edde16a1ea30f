"""`pip install .` (a real wheel, not the source tree) gives a CLI that finds the matrix and templates."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_wheel_install_finds_default_matrix_and_templates(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    # --no-deps: the dependencies come from the outer environment; what is tested is the wheel.
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(root)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    where = subprocess.run([str(py), "-c", "import envbuild, envbuild.paths as p; print(envbuild.__file__);"
                            "print(p.default_matrix()); print(p.templates_dir())"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    mod, matrix, templates = where.stdout.split()
    assert str(venv) in mod and str(venv) in matrix and str(venv) in templates  # not the source tree
    out = subprocess.run([str(venv / "bin" / "envbuild"), "plan", "--cuda", "cu124", "--vllm", "0.8.4", "--json"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"torch": "2.6.0"' in out.stdout
    assert (Path(templates) / "Dockerfile.j2").is_file()
