"""How long commands show their progress. One model (Progress) for every long command: the stage,
items done of the total, what is running and for how long, the elapsed time; piped (CI, Slurm logs)
a plain line every `every` seconds, on a terminal one live line. `envbuild build` adds its own
views over it: one line per state change when piped (with the same beat between them), a live
table on a terminal."""

from __future__ import annotations

import sys
import threading
import time

FINAL_STATES = ("ok", "reused", "fail", "error", "interrupted")


class PlainProgress:
    """One line per state change (CI logs), and between them the one model's beat: which
    combinations run, in which state or build step, for how long (a 7-minute build step is
    otherwise one line, then silence)."""

    def __init__(self, combos, stream=None, every: float = 20.0):
        self.stream = stream or sys.stdout
        self.t0 = {c.id: None for c in combos}
        self.lock = threading.Lock()
        self.beat = Progress("build", len(self.t0), "combinations", stream=self.stream, every=every, live=False)

    def __enter__(self):
        self.beat.__enter__()
        return self

    def __exit__(self, *exc):
        self.beat.__exit__(*exc)
        return False

    def update(self, cid: str, state: str, note: str = "") -> None:
        with self.lock:
            if self.t0.get(cid) is None and state not in ("queued",):
                self.t0[cid] = time.monotonic()
            el = time.monotonic() - self.t0[cid] if self.t0.get(cid) else 0.0
            print(f"[{time.strftime('%H:%M:%S')}] {cid}: {state} ({el:.0f}s)" + (f" {note}" if note else ""),
                  file=self.stream, flush=True)
        if state.split()[0] in FINAL_STATES:
            self.beat.finish(cid, f"{cid}: {state}")
        elif state != "queued":
            self.beat.start(cid, state)

    def step(self, cid: str, step: str) -> None:
        self.beat.start(cid, step[:60])  # the beat names the build step; the log has every line

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


class Progress:
    """The one progress model of a long command (lock, census, wheelhouse, venv, build). Piped, a
    plain line every `every` seconds (a log silent for minutes looks hung); on a terminal, one
    live line redrawn every second above which the command's own lines print, erased at the end.
    Its threads are daemons and `with` ends them: ^C stops the command at once."""

    def __init__(self, stage: str, total: int | None = None, unit: str = "", stream=None, every: float = 20.0,
                 live: bool = True):
        self.stage, self.total, self.unit = stage, total, unit
        self.stream = stream or sys.stderr
        self.every = every
        self.live_ok = live
        self.done = 0
        self.what = ""
        self.running: dict[str, tuple[str, float]] = {}  # item -> (its state, since when)
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live = None
        self.lock = threading.Lock()

    def __enter__(self):
        if getattr(self.stream, "isatty", lambda: False)():
            self._live = self._start_live() if self.live_ok else None
        elif self.every > 0:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="envbuild-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._live is not None:
            self._live.stop()
        return False

    def _start_live(self):
        try:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text
        except ImportError:  # a minimal install: the command's own lines only
            return None
        live = Live(console=Console(file=self.stream), get_renderable=lambda: Text(self.line(), no_wrap=True,
                                                                                    overflow="ellipsis"),
                    refresh_per_second=1, transient=True,
                    # the command's own lines print above the live line when they go to the terminal
                    # too; redirected to a file, they stay there
                    redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
        live.start()
        return live

    def advance(self, n: int = 1, what: str = "") -> None:
        with self.lock:
            self.done += n
            if what:
                self.what = what

    def stage_to(self, stage: str, total: int | None = None) -> None:
        with self.lock:
            self.stage, self.total, self.done, self.what = stage, total, 0, ""

    def start(self, item: str, state: str = "") -> None:
        """An item is running (again, in another state: its clock keeps its first start)."""
        with self.lock:
            since = self.running.get(item, ("", time.monotonic()))[1]
            self.running[item] = (state, since)

    def finish(self, item: str, what: str = "") -> None:
        with self.lock:
            self.running.pop(item, None)
            self.done += 1
            self.what = what or self.what

    def wrap(self, fn, item: str, state: str = ""):
        """fn, counted as `item` running while it runs."""
        def run(*a, **k):
            self.start(item, state)
            try:
                return fn(*a, **k)
            finally:
                self.finish(item)
        return run

    def line(self) -> str:
        with self.lock:
            now = time.monotonic()
            of = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
            unit = f" {self.unit}" if self.unit else ""
            items = sorted(self.running.items(), key=lambda kv: kv[1][1])
            running = ", ".join(f"{k} ({st + ', ' if st else ''}{now - t:.0f}s)" for k, (st, t) in items[:3])
            running += f" +{len(items) - 3}" if len(items) > 3 else ""
            what = f" (last: {self.what})" if self.what else ""
            return (f"[{time.strftime('%H:%M:%S')}] {self.stage}: {of}{unit} done, {now - self.t0:.0f}s elapsed"
                    + (f"; running {running}" if running else "") + what)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                print(self.line(), file=self.stream, flush=True)
            except (OSError, ValueError):  # the stream went away: stop beating, never the command
                return
