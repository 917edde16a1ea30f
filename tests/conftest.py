import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_cli():
    """Run the real `envbuild` entry point in a subprocess; returns CompletedProcess."""

    def _run(*args, env=None, cwd=None, timeout=600):
        return subprocess.run([sys.executable, "-m", "envbuild", *map(str, args)], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)

    return _run


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("ENVBUILD_CACHE", str(d))
    return d
