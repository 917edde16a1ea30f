"""Copies matrix/, dockerfiles/ and the nightly's step scripts (ci/nightly/) into the wheel as
envbuild/_data (see envbuild.paths)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        for name in ("matrix", "dockerfiles", "ci/nightly"):
            dst = Path(self.build_lib) / "envbuild" / "_data" / name
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(Path(__file__).parent / name, dst)


setup(cmdclass={"build_py": BuildPyWithData})
