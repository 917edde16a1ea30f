"""Where envbuild finds its data (default matrix, templates) and keeps caches."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """`matrix` or `dockerfiles`: inside the wheel, or the source tree for editable installs."""
    for cand in (_PKG / "_data" / name, _PKG.parent / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"envbuild data folder {name!r} not found next to {_PKG}")


def installed() -> bool:
    """True for a wheel install (data copied into the package), False for a source checkout."""
    return (_PKG / "_data").is_dir()


def metadata_snapshot() -> Path:
    """The recorded metadata to read: the user's refreshed copy when it is newer than the bundled one."""
    bundled, user = data_dir("matrix") / "metadata.json", user_data_dir() / "metadata.json"
    if user.is_file() and (not bundled.is_file() or user.stat().st_mtime >= bundled.stat().st_mtime):
        return user
    return bundled


def metadata_snapshot_for_write() -> Path:
    """Where `plan --refresh-metadata` writes: the checkout's matrix/ (reviewed, committed), or for
    an installed envbuild the user's data dir: never site-packages."""
    return user_data_dir() / "metadata.json" if installed() else data_dir("matrix") / "metadata.json"


def user_data_dir() -> Path:
    root = os.environ.get("ENVBUILD_DATA") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "envbuild")
    return Path(root)


def default_matrix() -> Path:
    return data_dir("matrix") / "verl.yaml"


def templates_dir() -> Path:
    return data_dir("dockerfiles")


def cache_dir() -> Path:
    root = os.environ.get("ENVBUILD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "envbuild")
    p = Path(root)
    p.mkdir(parents=True, exist_ok=True)
    return p
