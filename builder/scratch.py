"""Private temporary folders that a kill -9 cannot leave behind for good.

Each folder is made in the temp directory of the moment (TMPDIR) and its path and owner pid are
appended to `scratch.list` in the state dir; every new folder first removes the listed ones whose
process is gone, wherever they were made. Used for secret files (credentialed index URLs, a CA
bundle) and the resolver's work folders.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

LIST_NAME = "scratch.list"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _list_path() -> Path | None:
    from .state import state_dir
    try:
        d = state_dir()
        d.mkdir(parents=True, exist_ok=True)
        return d / LIST_NAME
    except OSError:
        return None  # no writable state dir: folders are still removed on every normal exit


def clean_stale() -> list[str]:
    """Remove listed folders whose process is gone; keep the others listed."""
    lp = _list_path()
    if lp is None:
        return []
    removed = []
    with open(lp, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        keep = []
        for line in f.read().splitlines():
            pid, _, path = line.partition(" ")
            if not pid.isdigit() or not path:
                continue
            if _alive(int(pid)) and os.path.isdir(path):
                keep.append(line)
            elif os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        f.seek(0)
        f.truncate()
        f.write("".join(k + "\n" for k in keep))
    return removed


def _note(path: str) -> None:
    lp = _list_path()
    if lp is None:
        return
    with open(lp, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"{os.getpid()} {path}\n")


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    """A 0700 temp folder, listed until it is removed (on every exit path Python sees)."""
    clean_stale()
    d = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    os.chmod(d, 0o700)
    _note(d)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
