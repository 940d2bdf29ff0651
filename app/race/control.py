"""Pause, Step and Continue for a race (live or replayed), and the paused-aware clock it runs on.

The race's worker calls `hold(shown)` between its steps; while the viewer has paused and no step
is owed, that call blocks, so nothing is computed or shown. The clock the race paces itself by
(`clock()`) stops while blocked, so the on-screen clocks stay honest: a pause is never counted as
compute time and the race resumes at the rate it had. A Step allows one more DFlash cycle on
screen; the race shows the plain side up to that cycle's compute time. Beside it, `Viewer` holds
what the viewer has on screen, which the buttons and the cycle view read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .interleave import Snapshot


@dataclass
class Viewer:
    """What one viewer has on screen: written by the frames of a race, read by Pause / Step and
    the cycle view."""

    latest: Snapshot | None = None  # the race's newest snapshot shown
    text_of: Callable[[int], str] = str  # one token's text, for the race shown
    follow: bool = True  # the cycle view shows the newest cycle (else the one picked)

    @property
    def shown(self) -> int:
        """Cycles of the race's lead lane (DFlash) on screen."""
        return len(self.latest.lead.blocks) if self.latest is not None else 0


# Why a paused race was let go (`Control.released`): its viewer left it paused past the deadline,
# or the session table dropped the viewer to make room for newer ones.
PAUSE_EXPIRED, EVICTED = "pause expired", "evicted"


class Control:
    """One viewer's pause state; the buttons' handlers and the race's worker share it.

    max_pause_s: how long a race may stay paused without a Pause, Step or Continue from its
    viewer; past it `hold` lets the race go (`released`), and the race ends, freeing the model.
    """

    def __init__(self, clock=time.perf_counter, max_pause_s: float | None = None):
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.paused = False
        self.limit: int | None = None  # DFlash cycles allowed on screen while paused
        self.stopped = False
        self.max_pause_s = max_pause_s
        self.released: str | None = None  # PAUSE_EXPIRED or EVICTED once the race was let go
        self._touched = clock()  # the viewer's last Pause, Step or Continue
        self._held = 0.0  # seconds spent blocked in `hold`, left out of `clock()`
        self.run = 0  # which run of this viewer the control drives; a newer one supersedes the rest
        self.viewer = Viewer()

    def clock(self) -> float:
        return self._clock() - self._held

    def reset(self) -> int:
        """A new race starts playing (not paused); returns its run number."""
        with self._lock:
            self.paused, self.limit, self.stopped, self.released = False, None, False, None
            self._touched = self._clock()
            self.run += 1
            run = self.run
        self._wake.set()
        return run

    def superseded(self, run: int) -> bool:
        """True once a newer run of this viewer has started: the older one must end."""
        return self.run != run

    def pause(self, shown: int) -> None:
        with self._lock:
            self.paused = True
            self._touched = self._clock()
            if self.limit is None:
                self.limit = shown

    def step(self, shown: int) -> None:
        """One more DFlash cycle (pauses first when playing)."""
        with self._lock:
            self.paused = True
            self._touched = self._clock()
            self.limit = max(self.limit if self.limit is not None else shown, shown) + 1
        self._wake.set()

    def resume(self) -> None:
        with self._lock:
            self.paused, self.limit = False, None
            self._touched = self._clock()
        self._wake.set()

    def release(self, why: str) -> None:
        """Let the race go: it never waits here again, and a race waiting now ends."""
        with self._lock:
            self.released = why
        self._wake.set()

    def stop(self) -> None:
        with self._lock:
            self.stopped, self.paused, self.limit = True, False, None
        self._wake.set()

    def holding(self, shown: int) -> bool:
        """True when the race must wait: paused, and the cycles owed are on screen."""
        with self._lock:
            return (
                self.paused and not self.stopped and self.released is None and self.limit is not None
                and shown >= self.limit
            )

    def hold(self, shown: int, poll_s: float = 0.05, until=lambda: False, for_s: float | None = None) -> None:
        """Block while `holding(shown)` and not `until()` (the race's Stop), for at most `for_s`
        seconds; past the pause deadline the race is released (`released`). The time blocked is
        left out of `clock()`."""
        started = self._clock()
        while self.holding(shown) and not until():
            now = self._clock()
            if self.max_pause_s is not None and now - self._touched >= self.max_pause_s:
                self.release(PAUSE_EXPIRED)
                break
            if for_s is not None and now - started >= for_s:
                break
            self._wake.wait(poll_s)
            self._wake.clear()
        self._held += self._clock() - started

    def cap(self) -> int | None:
        """DFlash cycles the race may show now (None: no limit)."""
        with self._lock:
            return self.limit if self.paused else None


class Controls:
    """Every viewer's `Control`, by Gradio session; a bounded table, oldest sessions dropped (a race
    one of them holds paused is released, so that it ends)."""

    def __init__(self, size: int = 256, max_pause_s: float | None = None):
        self.size = size
        self.max_pause_s = max_pause_s
        self._table: dict[str, Control] = {}
        self._lock = threading.Lock()

    def get(self, session: str | None) -> Control:
        key = session or ""
        evicted = []
        with self._lock:
            control = self._table.pop(key, None) or Control(max_pause_s=self.max_pause_s)
            self._table[key] = control  # most recently used last
            while len(self._table) > self.size:
                evicted.append(self._table.pop(next(iter(self._table))))
        for old in evicted:
            old.release(EVICTED)
        return control

    def drop(self, session: str | None) -> None:
        """Forget a session; a race it paused is told to stop waiting (it then ends)."""
        with self._lock:
            control = self._table.pop(session or "", None)
        if control is not None:
            control.reset()  # a newer run number: the paused race is superseded and returns
