"""Archives the nightly carries from one run to the next (its records, its table history): packed
the same, byte for byte, from the same files, and unpacked as data only.

Unpacking takes regular files at plain relative paths inside the target folder and nothing
else: a link, a device, an absolute or `..` path, an odd file name or an oversized member stops
it with a one-line error naming the member, before anything is written (a symlink in
history.tar.gz once put a runner's file on the public site).
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

from .errors import InputError
from .fsutil import safe_name, write_atomic

MAX_MEMBER_BYTES = 16 << 20  # a record or a signed table is far smaller
MAX_TOTAL_BYTES = 2 << 30
MAX_MEMBERS = 200_000


def pack(root: str | os.PathLike, names: list[str]) -> bytes:
    """tar.gz of the files `names` (relative to `root`), sorted, with no times, owners or modes
    of this machine in it: the same files give the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for rel in sorted(names):
            data = (Path(root) / rel).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
            t.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def files_under(root: str | os.PathLike, pattern: str) -> list[str]:
    """Relative paths of the regular files (not links) under `root` matching `pattern`."""
    base = Path(root)
    return sorted(str(p.relative_to(base)) for p in base.glob(pattern) if p.is_file() and not p.is_symlink())


def unpack(data: bytes, dest: str | os.PathLike, where: str,
           accept: Callable[[str], bool] = lambda rel: True) -> list[str]:
    """Write the regular files of the tar.gz `data` that `accept(relative path)` takes under
    `dest`; the relative paths written. Any member that is not a plain file at a safe path is
    refused (InputError naming `where` and the member) and nothing is written."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
        members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise InputError(where, None, "archive", None, f"not a readable tar.gz ({e})") from None
    if len(members) > MAX_MEMBERS:
        raise InputError(where, None, "members", len(members), f"more than {MAX_MEMBERS} members")
    take, total = [], 0
    for m in members:
        if m.isdir():
            _safe_parts(m.name, where, allow_dot=True)  # a folder is made by the files in it
            continue
        if not m.isreg():
            raise InputError(where, None, "member", m.name, "is not a regular file (a link, device or "
                             "other special member): refused")
        parts = _safe_parts(m.name, where)
        if m.size > MAX_MEMBER_BYTES:
            raise InputError(where, None, "member", m.name, f"is larger than {MAX_MEMBER_BYTES >> 20} MiB")
        total += m.size
        if total > MAX_TOTAL_BYTES:
            raise InputError(where, None, "archive", None, f"unpacks to more than {MAX_TOTAL_BYTES >> 30} GiB")
        rel = "/".join(parts)
        if accept(rel):
            take.append((rel, m))
    out = Path(dest)
    for rel, m in take:
        f = tar.extractfile(m)
        write_atomic(out / rel, f.read() if f else b"")
    return [rel for rel, _ in take]


def _safe_parts(name: str, where: str, allow_dot: bool = False) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")] if not name.startswith("/") else None
    if parts is None or (not parts and not allow_dot):
        raise InputError(where, None, "member", name, "is an absolute or empty path: refused")
    for p in parts:
        safe_name(p, "member", where)  # no '..', no odd characters
    return parts
