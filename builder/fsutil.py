"""Atomic writes: a reader never sees half a file, a crash never leaves one. And a lock file for
work two processes on one machine must not do at once."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from pathlib import Path

import errno

from .errors import InfraError, InputError

# The disk itself failed or filled: infrastructure. Anything else about a path (missing, a file
# where a folder belongs, no permission) is the path the user gave: bad input, named.
_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)


def path_error(path: str | os.PathLike, e: OSError) -> InputError | InfraError:
    where = e.filename or str(path)
    if e.errno in _DISK:
        return InfraError("disk", f"{where}: {e.strerror or e}")
    return InputError(str(path), None, "path", str(where), f"cannot write here ({e.strerror or e})")

# A name taken from data (a combination id, a keyid) that becomes one path component: no
# separator, no leading dot or dash, no "..", no control character, bounded length.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}")


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int = 0o644) -> Path:
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise path_error(path, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise path_error(path, e) from None
        raise
    return path


LOCK_WAIT_S = 900.0  # the longest envbuild waits for another envbuild's lock before exit 3


@contextlib.contextmanager
def exclusive(path: str | os.PathLike, what: str = "", timeout: float = LOCK_WAIT_S):
    """Hold an exclusive lock on `path` (created if missing) for the block. The kernel drops it if
    the holder dies, so no stale lock is ever left. A second process waits, says once on stderr
    what it waits for, and gives up after `timeout` s (InfraError: exit 3)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
    except OSError as e:
        raise path_error(path, e) from None
    with f:
        wait_lock(f, path, what or str(path), timeout)
        yield


def wait_lock(f, path: Path, what: str, timeout: float = LOCK_WAIT_S) -> None:
    """flock(LOCK_EX) on the open file `f`, waiting at most `timeout` s (see exclusive)."""
    import sys
    import time

    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    print(f"envbuild: waiting for {what}: another envbuild holds {path} (up to {timeout:.0f} s)", file=sys.stderr)
    end = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= end:
                raise InfraError("lock-wait", f"{what}: {path} is still held by another envbuild after "
                                              f"{timeout:.0f} s; let it finish, or stop it") from None
            time.sleep(0.2)


def write_json_atomic(path: str | os.PathLike, obj: object) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def safe_name(value: object, field: str = "id", where: str = "input") -> str:
    """`value` if it is safe as one file name component, else InputError (exit 2).

    fullmatch, not match with ^...$: `$` would let a trailing newline through.
    """
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise InputError(where, None, field, value,
                         "not usable as a file name (letters, digits and . _ + - only, no '..', "
                         "at most 201 characters, starting with a letter or digit)")
    return value
