"""How `envbuild build` shows its progress: one line per state change (logs, pipes) or a live
table on a terminal."""

from __future__ import annotations

import sys
import threading
import time

class PlainProgress:
    """One line per state change (CI logs)."""

    def __init__(self, combos, stream=None):
        self.stream = stream or sys.stdout
        self.t0 = {c.id: None for c in combos}
        self.lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, cid: str, state: str, note: str = "") -> None:
        with self.lock:
            if self.t0.get(cid) is None and state not in ("queued",):
                self.t0[cid] = time.monotonic()
            el = time.monotonic() - self.t0[cid] if self.t0.get(cid) else 0.0
            print(f"[{time.strftime('%H:%M:%S')}] {cid}: {state} ({el:.0f}s)" + (f" {note}" if note else ""),
                  file=self.stream, flush=True)

    def step(self, cid: str, step: str) -> None:
        pass  # plain output reports states only; the step is in the log

    def message(self, text: str) -> None:
        with self.lock:
            print(text, file=self.stream, flush=True)


class RichProgress(PlainProgress):
    """A live table: per combination, state, current step and elapsed time."""

    def __init__(self, combos, stream=None):
        super().__init__(combos, stream)
        self.rows = {c.id: ["queued", "", None, None] for c in combos}  # state, note, start, end

    def __enter__(self):
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=self.stream)
        self.live = Live(self._table(), console=self.console, refresh_per_second=2, transient=False,
                         get_renderable=self._table)
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)
        return False

    def _table(self):
        from rich.table import Table

        t = Table(box=None, pad_edge=False)
        for col in ("combination", "state", "elapsed", "step"):
            t.add_column(col, no_wrap=col != "step", overflow="ellipsis")
        now = time.monotonic()
        colors = {"ok": "green", "reused": "green", "fail": "red", "error": "yellow"}
        for cid, (state, note, start, end) in self.rows.items():
            el = "" if start is None else f"{(end or now) - start:5.0f}s"
            color = colors.get(state.split()[0], "cyan")
            t.add_row(cid, f"[{color}]{state}[/]", el, note[:80])
        return t

    def update(self, cid, state, note=""):
        with self.lock:
            row = self.rows[cid]
            if row[2] is None and state != "queued":
                row[2] = time.monotonic()
            row[0], row[1] = state, note
            if state.split()[0] in ("ok", "reused", "fail", "error", "interrupted"):
                row[3] = time.monotonic()

    def step(self, cid, step):
        with self.lock:
            self.rows[cid][1] = step

    def message(self, text):
        self.console.print(text, markup=False, highlight=False)


class Heartbeat:
    """One progress model for a long command whose output may be a pipe (CI, Slurm logs): the
    stage, items (or bytes) done of the total and the elapsed time, every `every` seconds when
    the stream is not a terminal (a terminal gets the command's own lines). A daemon thread: ^C
    stops the command at once, and `with` ends the beats."""

    def __init__(self, stage: str, total: int | None = None, unit: str = "", stream=None, every: float = 20.0):
        self.stage, self.total, self.unit = stage, total, unit
        self.stream = stream or sys.stderr
        self.every = every
        self.done = 0
        self.what = ""
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def __enter__(self):
        isatty = getattr(self.stream, "isatty", lambda: False)
        if not isatty() and self.every > 0:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        return False

    def advance(self, n: int = 1, what: str = "") -> None:
        with self.lock:
            self.done += n
            if what:
                self.what = what

    def stage_to(self, stage: str, total: int | None = None) -> None:
        with self.lock:
            self.stage, self.total, self.done, self.what = stage, total, 0, ""

    def line(self) -> str:
        with self.lock:
            of = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
            unit = f" {self.unit}" if self.unit else ""
            what = f" (last: {self.what})" if self.what else ""
            return (f"[{time.strftime('%H:%M:%S')}] {self.stage}: {of}{unit} done, "
                    f"{time.monotonic() - self.t0:.0f}s elapsed{what}")

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                print(self.line(), file=self.stream, flush=True)
            except (OSError, ValueError):  # the stream went away: stop beating, never the command
                return
