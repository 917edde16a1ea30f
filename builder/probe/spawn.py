"""How the probe starts a process of its own package (the contract level's readers, a level run
side by side): the same interpreter, with the folder holding this package first on its path, since
in an image the package is mounted beside the environment, not installed into it."""

from __future__ import annotations

import os


def package() -> str:
    """This package's import name: envbuild.probe from a checkout, envbuild_probe in an image."""
    return __package__ or "envbuild.probe"


def child_env() -> dict[str, str]:
    pkg = package()
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "." in pkg:  # envbuild.probe: the folder holding `envbuild`
        parent = os.path.dirname(parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (parent, os.environ.get("PYTHONPATH")) if p)}
