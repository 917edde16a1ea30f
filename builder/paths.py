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
