"""dockerfiles/compile-bytecode.py: each install step's bytecode, through a cache shared by builds.
What it writes must be what uv's --compile-bytecode writes (byte for byte, mode for mode), whether
a file came from the cache or was compiled, or the layers of two builds would differ. Real uv, a
real venv at one path (a .pyc holds its source's path, as /opt/venv is in every image), real
hand-made wheels; no network."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.index_config import uv_exe
from envbuild.paths import templates_dir
from test_settle_overlaps import wheel

HELPER = templates_dir() / "compile-bytecode.py"
STEP_ENV = {"SOURCE_DATE_EPOCH": "946684800", "PYTHONHASHSEED": "0"}  # as every install step sets them

ALPHA = {
    # a set constant is a frozenset in the .pyc, written in hash order: the fixed seed matters
    "alpha/__init__.py": b"def main():\n    return 'x' in {'a', 'b', 'c', 'x'}\n",
    "alpha/tool.py": b"#!/usr/bin/env python\nprint('tool')\n",  # made executable below
    "alpha/py2.py": b"print 'vendored Python 2'\n",  # does not compile: skipped, as uv skips it
    "alpha/data.txt": b"not Python\n",
}
BETA = {"beta/__init__.py": b"VALUE = 2\n", "beta/sub/mod.py": b"import alpha\nX = [1, 2, 3]\n"}


@pytest.fixture
def step(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    ws = {"alpha": wheel(wheels, "alpha", ALPHA, "alpha:main"), "beta": wheel(wheels, "beta", BETA, "beta:main")}
    lock = tmp_path / "layer.txt"
    lock.write_text("".join(f"{n}==1.0 \\\n    --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}\n"
                            for n, w in ws.items()))
    venv, cache = tmp_path / "venv", tmp_path / "cache"
    env = {**os.environ, **STEP_ENV}

    def install(*extra: str) -> Path:
        """A fresh venv at the same path with the step's two distributions; its site-packages."""
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([uv_exe(), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
        subprocess.run([uv_exe(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-deps",
                        "--require-hashes", "--no-index", "--find-links", str(wheels), "-r", str(lock), *extra],
                       check=True, env=env)
        site = next((venv / "lib").glob("python3*/site-packages"))
        os.chmod(site / "alpha" / "tool.py", 0o755)  # an executable source: its .pyc is not
        return site

    def compile_step() -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "python"), "-I", str(HELPER), str(lock), str(cache)],
                              capture_output=True, text=True, env=env)

    return install, compile_step, cache


def pycs(site: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(site)): (p.read_bytes(), p.stat().st_mode & 0o777)
            for p in sorted(site.rglob("*.pyc")) if p.parts[-3] in ("alpha", "beta", "sub")}


def test_a_hit_and_a_miss_write_what_uv_writes(step):
    install, compile_step, cache = step
    want = pycs(install("--compile-bytecode"))  # what uv's own --compile-bytecode writes
    tag = sys.implementation.cache_tag
    assert set(want) == {f"alpha/__pycache__/__init__.{tag}.pyc", f"alpha/__pycache__/tool.{tag}.pyc",
                         f"beta/__pycache__/__init__.{tag}.pyc", f"beta/sub/__pycache__/mod.{tag}.pyc"}, want.keys()

    site = install()
    first = compile_step()
    assert first.returncode == 0, first.stderr
    assert "bytecode for 4 files of 2 distributions: 0 from the cache (0 distributions), 4 compiled, " \
           "1 not Python 3 source" in first.stdout
    assert pycs(site) == want
    assert len([p for p in cache.rglob("*") if p.is_file()]) == 2  # one entry per distribution

    site = install()  # the next build of a layer with these files
    second = compile_step()
    assert second.returncode == 0, second.stderr
    assert "bytecode for 4 files of 2 distributions: 4 from the cache (2 distributions), 0 compiled, " \
           "1 not Python 3 source" in second.stdout  # the entry remembers what does not compile
    assert pycs(site) == want


def test_an_entry_that_does_not_fit_is_compiled_again(step):
    install, compile_step, cache = step
    site = install()
    assert compile_step().returncode == 0
    want = pycs(site)
    cb = _module()
    for entry in (p for p in cache.rglob("*") if p.is_file()):
        items = cb.unpack(entry.read_bytes())
        assert items is not None
        if any("alpha" in p for p in items):  # torn: the checksum no longer matches
            entry.write_bytes(entry.read_bytes()[:-40] + entry.read_bytes()[-32:])
        else:  # whole, but a .pyc in it is of another source
            entry.write_bytes(cb.pack([(p, d[:8] + b"\0" * 8 + d[16:]) for p, d in items.items()]))
    site = install()
    p = compile_step()
    assert p.returncode == 0, p.stderr
    assert "0 from the cache (0 distributions), 4 compiled" in p.stdout, p.stdout
    assert pycs(site) == want
    install()
    assert "4 from the cache (2 distributions), 0 compiled" in compile_step().stdout  # whole again


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("envbuild_compile_bytecode", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_another_interpreter_setting_is_another_entry(step, monkeypatch):
    install, compile_step, cache = step
    install()
    assert compile_step().returncode == 0
    install()
    monkeypatch.setenv("PYTHONHASHSEED", "1")  # frozenset order may differ: never shared with seed 0
    p = subprocess.run([str(cache.parent / "venv" / "bin" / "python"), "-I", str(HELPER),
                        str(cache.parent / "layer.txt"), str(cache)],
                       capture_output=True, text=True, env={**os.environ, "SOURCE_DATE_EPOCH": "946684800"})
    assert p.returncode == 0 and "0 from the cache (0 distributions), 4 compiled" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("mode", ["CHECKED_HASH", "UNCHECKED_HASH", "TIMESTAMP"])
def test_the_bytes_are_py_compiles(tmp_path, mode):
    """The helper makes a .pyc itself (the file written in place, not through a rename): its bytes
    are py_compile's in every invalidation mode, and a source that does not compile gives none."""
    import py_compile

    cb = _module()
    src = tmp_path / "m.py"
    src.write_bytes(b"X = frozenset({'a', 'b'})\ndef f():\n    return [x for x in range(3)]\n")
    os.utime(src, (946684800, 946684800))
    pm = py_compile.PycInvalidationMode[mode]
    want = Path(py_compile.compile(str(src), cfile=str(tmp_path / "want.pyc"), invalidation_mode=pm, doraise=True))
    assert cb.pyc_bytes(src.read_bytes(), str(src), pm) == want.read_bytes()
    (tmp_path / "bad.py").write_bytes(b"print 'two'\n")
    assert cb._compile((str(tmp_path / "bad.py"), pm)) == (str(tmp_path / "bad.py"), b"")


def test_a_pyc_already_there_is_replaced_with_the_mode_asked_for(tmp_path):
    cb = _module()
    target = tmp_path / "__pycache__" / "m.pyc"
    cb._put(str(target), b"first", 0o644)  # the folder is made
    os.chmod(target, 0o400)
    cb._put(str(target), b"second", 0o644)
    assert target.read_bytes() == b"second" and target.stat().st_mode & 0o777 == 0o644
