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
