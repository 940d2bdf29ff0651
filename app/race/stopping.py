"""Stop requests for running races, one per browser session.

A race registers its session while it runs (`running`); the Stop button's handler asks it to stop
(`request`), and the race polls the flag before every engine step, so it ends within one cycle
and reports what it had shown. Entries live only while their race runs, so nothing accumulates
per visitor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StopRequests:
    def __init__(self):
        self._lock = threading.Lock()
        self._running: dict[str, tuple[threading.Event, threading.Event]] = {}  # session: (stop, ended)

    @contextmanager
    def running(self, session: str | None) -> Iterator[threading.Event]:
        """Registers a race of `session` for its duration; yields the event that asks it to stop."""
        stop, ended = threading.Event(), threading.Event()
        with self._lock:
            if session is not None:
                self._running[session] = (stop, ended)
        try:
            yield stop
        finally:
            with self._lock:
                if session is not None and self._running.get(session, (None,))[0] is stop:
                    del self._running[session]
            ended.set()

    def request(self, session: str | None, wait_s: float = 0.0) -> bool:
        """Ask the session's running race to stop; True if one was running.

        wait_s: how long to wait for it to end (it ends after the engine step in progress).
        """
        with self._lock:
            entry = self._running.get(session) if session is not None else None
        if entry is None:
            return False
        stop, ended = entry
        stop.set()
        ended.wait(wait_s)
        return True

    def __len__(self) -> int:
        return len(self._running)
