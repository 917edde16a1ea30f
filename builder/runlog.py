"""A logged, killable command (a build's docker client): its output appended to a log file, its
last lines kept, its whole process group killed at a deadline or when asked to stop (Ctrl-C).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

TAIL_LINES = 200


@dataclass
class BuildResult:
    ok: bool
    rc: int
    seconds: float
    image_id: str | None = None
    timed_out: bool = False
    interrupted: bool = False
    tail: list[str] = field(default_factory=list)

def run_logged(argv: list[str], log_path: str | os.PathLike, *, env: dict | None = None,
               timeout: float | None = None, on_line: Callable[[str], None] | None = None,
               stop: threading.Event | None = None) -> BuildResult:
    """Run argv with stdout+stderr appended to log_path; keep the last lines; kill the whole
    process group on timeout or when `stop` is set (Ctrl-C)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    t0 = time.monotonic()
    timed_out = interrupted = False
    with open(log_path, "a", buffering=1) as log:
        log.write(f"$ {' '.join(argv)}\n")
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", env=env, start_new_session=True)
        except OSError as e:
            log.write(f"cannot start: {e}\n")
            return BuildResult(False, 127, 0.0, tail=[str(e)])

        def reader():
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                if on_line:
                    try:
                        on_line(line)
                    except Exception:
                        pass

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        while proc.poll() is None:
            if timeout is not None and time.monotonic() - t0 > timeout:
                timed_out = True
            elif stop is not None and stop.is_set():
                interrupted = True
            if timed_out or interrupted:
                _kill(proc)
                break
            time.sleep(0.2)
        proc.wait()
        th.join(timeout=10)
        secs = time.monotonic() - t0
        if timed_out:
            log.write(f"\nenvbuild: timed out after {timeout:.0f}s, killed\n")
        elif interrupted:
            log.write("\nenvbuild: interrupted, killed\n")
        log.write(f"envbuild: exit {proc.returncode} after {secs:.1f}s\n")
    return BuildResult(proc.returncode == 0 and not timed_out and not interrupted, proc.returncode, secs,
                       timed_out=timed_out, interrupted=interrupted, tail=list(tail))


def _kill(proc: subprocess.Popen) -> None:
    # The docker client closing its session makes BuildKit cancel the solve. SIGINT first (the
    # client's clean cancel), harder signals if it lingers, then whatever is left of its group.
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers would hold the output pipe open
    except ProcessLookupError:
        pass
