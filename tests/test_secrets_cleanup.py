"""Credentials on disk live only as long as the build that needs them: removed on every exit
Python sees, and a folder that a kill -9 left behind is removed by the next run."""

import os
import signal
import subprocess
import sys
import tempfile
import time

from envbuild.secretfiles import SECRETS_PREFIX, secret_files

HOLD = """
import sys, time
from envbuild.secretfiles import secret_files
with secret_files({"index-url": "https://user:s3cret@index.example/simple"}) as f:
    print(f["index-url"], flush=True)
    time.sleep(600)
"""


def test_removed_on_exit_and_on_error():
    with secret_files({"a": "x"}) as f:
        d = os.path.dirname(f["a"])
        assert oct(os.stat(d).st_mode & 0o777) == "0o700" and open(f["a"]).read() == "x"
    assert not os.path.exists(d)
    try:
        with secret_files({"a": "x"}) as f:
            d = os.path.dirname(f["a"])
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert not os.path.exists(d)


def test_a_folder_left_by_kill_9_is_removed_by_the_next_run():
    p = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    path = p.stdout.readline().strip()
    d = os.path.dirname(path)
    assert os.path.basename(d).startswith(f"{SECRETS_PREFIX}{p.pid}-") and "s3cret" in open(path).read()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert os.path.exists(d)  # nothing in the killed process could remove it
    deadline = time.time() + 5
    while time.time() < deadline and os.path.exists(d):
        with secret_files({}):  # the next run
            pass
    assert not os.path.exists(d)
    # a live process's folder is never touched
    live = tempfile.mkdtemp(prefix=f"{SECRETS_PREFIX}{os.getpid()}-")
    with secret_files({}):
        pass
    assert os.path.exists(live)
    os.rmdir(live)
