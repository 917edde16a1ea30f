"""A rendered context reaches the real BuildKit with the bytes it has now, never an earlier copy.

BuildKit sends a context to the daemon as rsync does, by size and time, and keeps the last copy per
folder name (moby/buildkit#2592). envbuild's render used to give every file one fixed time, so a lock
re-rendered with the same length (another version or hash) was not sent again: the build read the
old lock, --no-cache or not (this stop's CI: the PyTorch-index test's second run on a warm daemon
installed the first run's torch). Context times now follow the bytes (render.set_context_times).
"""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = [pytest.mark.docker]


def test_a_changed_file_of_the_same_size_reaches_the_build(tmp_path):
    from envbuild.base import bootstrap
    from envbuild.docker import detect
    from envbuild.render import set_context_times

    engine = detect()
    base = bootstrap(engine, log=lambda *a: None).ref  # reused when present
    ctx = tmp_path / "envbuild-sync-test"  # the folder name is what BuildKit keys its copy on
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {base}\nRUN --mount=type=bind,source=lock.txt,target=/lock.txt cat /lock.txt\n")

    def build_reads(content: str) -> str:
        (ctx / "lock.txt").write_text(content)
        set_context_times(ctx)
        p = subprocess.run([engine.client, "build", "--no-cache", "--progress", "plain", "--network", "host", str(ctx)],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "DOCKER_BUILDKIT": "1"})
        assert p.returncode == 0, p.stderr[-2000:]
        return next(ln.split()[-1] for ln in p.stderr.splitlines() if ln.split()[-1:] and ln.split()[-1].startswith("vllm=="))

    assert build_reads("vllm==0.8.4\n") == "vllm==0.8.4"
    assert build_reads("vllm==0.8.5\n") == "vllm==0.8.5"  # the same size: only the time can tell
