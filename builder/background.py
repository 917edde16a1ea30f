"""Work in threads of their own for `envbuild build`: the bases every combination starts FROM,
each resolved once and shared (BaseFutures), and one call run beside another (Background: the
push and the probe of one image at once). No build logic: envbuild.pipeline drives them.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable

from .values import Base


class BaseFutures:
    """The bases builds start FROM, each resolved once and shared (thread-safe memoised futures).

    `resolve(combo)` makes a combination's base; `key(combo)` names which base that is, so
    combinations with the same key share one resolution (its result or its error). `start`
    begins a resolution in a thread of its own (so nothing queues behind a running build) and
    returns its future; calling the object waits for it. `shared(key, thunk)` memoises any other
    resolution under a key of its own (auto's fallback to the one bootstrap base)."""

    def __init__(self, resolve: Callable[[object], Base], key: Callable[[object], str] | None = None):
        self.resolve = resolve
        self.key = key or (lambda combo: combo.id)
        self._futs: dict[str, Future] = {}
        self._threads: list[threading.Thread] = []
        self._lk = threading.Lock()

    def _future(self, key: str, thunk) -> Future:
        with self._lk:
            f = self._futs.get(key)
            if f is not None:
                return f
            f = self._futs[key] = Future()
            # daemon: a run that exits early is never held by it; run() waits for it explicitly
            t = threading.Thread(target=self._run, args=(f, thunk), name=f"envbuild-base-{len(self._futs)}",
                                 daemon=True)
            self._threads.append(t)
        t.start()
        return f

    @staticmethod
    def _run(f: Future, thunk) -> None:
        if not f.set_running_or_notify_cancel():
            return
        try:
            f.set_result(thunk())
        except BaseException as e:  # noqa: BLE001 - handed to every waiter, raised there
            f.set_exception(e)

    def start(self, combo) -> Future:
        return self._future(self.key(combo), lambda: self.resolve(combo))

    def shared(self, key: str, thunk):
        return self._future(key, thunk).result()

    def __call__(self, combo) -> Base:
        return self.start(combo).result()

    def running(self) -> int:
        with self._lk:
            return sum(1 for f in self._futs.values() if not f.done())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for every resolution started; True when none is left running."""
        with self._lk:
            threads = list(self._threads)
        end = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in threads)


class Background:
    """One call in a thread of its own: (True, result) or (False, the exception) on join(), and
    the seconds it took."""

    def __init__(self, fn, name: str):
        self._fn, self._out, self.seconds = fn, None, 0.0
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def _run(self):
        t = time.monotonic()
        try:
            self._out = (True, self._fn())
        except BaseException as e:  # noqa: BLE001 - re-raised or recorded by the caller
            self._out = (False, e)
        self.seconds = time.monotonic() - t

    def alive(self) -> bool:
        return self._t.is_alive()

    def join(self):
        self._t.join()
        return self._out
