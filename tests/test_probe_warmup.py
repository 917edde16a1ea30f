"""probe/warmup.py: the gpu level's work started ahead in a thread; a module that fails to import
stops the imports quietly (the gpu level imports it again and reports it), `wait` ends with the
thread, and ENVBUILD_PROBE_WARM_IMPORT=no turns the imports off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


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
        print(sorted(warmup.timings()), warmup.wanted(), warmup.wanted("no"))
    """)
    assert out.strip() == "['warm_cuda'] True False"
    assert _run("from envbuild.probe import warmup; print(warmup.wanted())",
                {"ENVBUILD_PROBE_WARM_IMPORT": "no"}).strip() == "False"
