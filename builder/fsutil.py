"""Atomic writes: a reader never sees half a file, a crash never leaves one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int = 0o644) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj: object) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
