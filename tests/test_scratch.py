"""kill -9 leaves nothing behind for good (issue 27): scratch folders are swept by the next run
whatever TMPDIR says, and the resolver dies with envbuild."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envbuild import scratch


def test_a_folder_of_a_killed_run_is_swept_from_another_tmpdir(tmp_path, monkeypatch):
    a, b = tmp_path / "tmp-a", tmp_path / "tmp-b"
    a.mkdir()
    b.mkdir()
    code = ("import os, sys, time\nfrom envbuild.scratch import scratch_dir\n"
            "with scratch_dir('envbuild-secrets-') as d:\n    print(d, flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(a)})
    left = p.stdout.readline().strip()
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert Path(left).is_dir() and Path(left).parent == a  # kill -9 skipped every finally
    monkeypatch.setenv("TMPDIR", str(b))
    import tempfile
    tempfile.tempdir = None
    try:
        with scratch.scratch_dir("envbuild-lock-") as mine:
            assert Path(mine).parent == b and not Path(left).exists()
    finally:
        tempfile.tempdir = None


def test_uv_dies_with_a_killed_lock(tmp_path):
    """The launcher the resolver runs behind: its child gets SIGKILL when its parent dies."""
    from envbuild.uvcompile import _DIE_WITH_PARENT
    code = ("import subprocess, sys, time\n"
            f"p = subprocess.Popen({_DIE_WITH_PARENT!r} + ['sleep', '60'])\n"
            "print(p.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the resolver outlived envbuild")


def test_a_lock_wait_says_what_it_waits_for_and_gives_up_with_exit_3(tmp_path, capsys):
    """Issue 49, item 6: a second envbuild waited on another's lock forever, silently."""
    import fcntl
    import time

    from envbuild.errors import InfraError
    from envbuild.fsutil import exclusive

    lock = tmp_path / "x.lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another envbuild holds it
        t0 = time.monotonic()
        with pytest.raises(InfraError) as e:
            with exclusive(lock, "the table folder T", timeout=0.5):
                pass
        assert 0.5 <= time.monotonic() - t0 < 5 and e.value.exit_code == 3
        assert "the table folder T" in str(e.value) and "still held" in str(e.value)
        assert "waiting for the table folder T" in capsys.readouterr().err
    with exclusive(lock, "the table folder T", timeout=0.5):  # free again: taken at once
        pass
