import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# A shell started without job control (`cmd &` in a script, some CI runners) starts its children
# with SIGINT ignored, and Python then never raises KeyboardInterrupt: the Ctrl-C tests need the
# handler Python installs when SIGINT reaches it.
signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (ci/test.sh: -n 2 --dist loadfile --no-loadscope-reorder), files that
    hold a slow test go first, each file's own order kept: the workers hand out files in this
    order, so the longest ones start at once instead of being left for the end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow = {it.path for it in items if it.get_closest_marker("slow")}
    first = {}
    for it in items:
        first.setdefault(it.path, len(first))
    items.sort(key=lambda it: (it.path not in slow, first[it.path]))


@pytest.fixture(autouse=True)
def _own_envbuild_state(tmp_path_factory, monkeypatch):
    """Each test gets its own envbuild state and config dirs (keys pinned on first use, table
    serials seen, a default table): never the user's, never another test's."""
    root = tmp_path_factory.mktemp("envbuild-home")
    monkeypatch.setenv("ENVBUILD_STATE", str(root / "state"))
    monkeypatch.setenv("ENVBUILD_CONFIG", str(root / "config"))
    for name in ("ENVBUILD_TABLE", "ENVBUILD_PUBKEY"):
        monkeypatch.delenv(name, raising=False)


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
