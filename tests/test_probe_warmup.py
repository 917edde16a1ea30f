"""probe/warmup.py: the gpu level's work started ahead in a thread; a module that fails to import
stops the imports quietly (the gpu level imports it again and reports it), `wait` ends with the
thread(s), ENVBUILD_PROBE_WARM_IMPORT=beside (the default) imports in a thread of their own once torch
is in, =after behind CUDA in its thread, =no turns the imports off, and a value it does not know is a one-line error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _run(code: str, env_extra: dict | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ENVBUILD_PROBE_WARM_IMPORT"}
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_imports_run_in_order_and_a_failure_stops_them_quietly(tmp_path):
    (tmp_path / "warm_a.py").write_text("import time\ntime.sleep(0.3)\nA = 1\n")
    (tmp_path / "warm_bad.py").write_text("raise ImportError('broken on purpose')\n")
    (tmp_path / "warm_c.py").write_text("C = 1\n")
    out = _run(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from envbuild.probe import warmup
        warmup.start("float32", ("warm_a", "warm_bad", "warm_c"))
        warmup.wait()
        t = warmup.timings()
        print("warm_a" in sys.modules, "warm_c" in sys.modules, t["warm_import"] >= 0.3, "warm_cuda" in t)
    """)
    assert out.split() == ["True", "False", "True", "True"]


def test_without_modules_only_cuda_is_warmed_and_the_switch():
    out = _run("""
        import sys
        from envbuild.probe import warmup
        warmup.wait()  # nothing started: returns at once
        warmup.start("float32")
        warmup.wait()
        print(sorted(warmup.timings()), warmup.how(), warmup.how("yes"), warmup.how("after"), warmup.how("no"))
    """)
    assert out.split() == ["['warm_cuda']", "beside", "beside", "after", "no"]
    assert _run("from envbuild.probe import warmup; print(warmup.how())",
                {"ENVBUILD_PROBE_WARM_IMPORT": "no"}).strip() == "no"


def test_beside_imports_in_a_thread_of_their_own_once_torch_is_in(tmp_path):
    pytest.importorskip("torch")  # the second thread starts once torch is imported
    # The module notes, as it is imported, its thread and whether torch was imported already.
    (tmp_path / "warm_probe_mod.py").write_text(
        "import sys, threading\nSEEN = (threading.current_thread().name, 'torch' in sys.modules)\n")
    out = _run(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from envbuild.probe import warmup
        warmup.start("float32", ("warm_probe_mod",), beside=True)
        warmup.wait()
        import warm_probe_mod
        print(*warm_probe_mod.SEEN, sorted(warmup.timings()))
    """)
    assert out.split() == ["probe-warm-import", "True", "['warm_cuda',", "'warm_import']"]


def test_a_bad_switch_value_is_a_one_line_error_before_any_work():
    p = subprocess.run([sys.executable, "-m", "envbuild.probe", "--level", "env", "--engine", "hf"], capture_output=True, text=True,
                       env={**os.environ, "ENVBUILD_PROBE_WARM_IMPORT": "sideways"}, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "envbuild-probe: ENVBUILD_PROBE_WARM_IMPORT='sideways': expected one of beside, after, no (or yes)"]
