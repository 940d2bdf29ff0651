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
    lane: str = "dflash"  # whose cycles the cycle view lays out (`lanes.CYCLE_LANES`)
    pieces: dict | None = None  # per lane, the pane text of its tokens (`extend(ids)`), for the run shown
    report: object = None  # the finished run's `RaceReport` (None while it runs)
    label: str = ""  # the run's source, settings and prompt, in words (`view/pinned.run_label`)
    prompt_ids: tuple[int, ...] = ()  # the prompt the run decoded (prompt lookup's cycles search it)
    # The cycle of `lane` (0-based) the panes were stepped back to, while the run stands still;
    # None: they show the run's latest snapshot.
    back_at: int | None = None

    @property
    def shown(self) -> int:
        """Cycles of the race's lead lane (DFlash) on screen."""
        return len(self.latest.lead.blocks) if self.latest is not None else 0


# Why a race was let go (`Control.released`): paused for its whole pause budget, the session table
# dropped its viewer to make room for newer ones, or it reached its wall-clock budget.
PAUSE_EXPIRED, EVICTED, TIME_UP = "pause expired", "evicted", "time up"
# "Start paused" holds for a run that starts this soon after it (a race may wait in the queue); a
# later run, started by someone who has forgotten it, plays.
ARM_S = 60.0
# The button's two requests (start paused, the run) travel apart: the run may start first.
ARM_LATE_S = 3.0


class Control:
    """One viewer's pause state; the buttons' handlers and the race's worker share it.

    Each run (a race or a replay, from `reset`) has two budgets that no click renews:
    max_pause_s: the seconds it may spend paused in all; past them `hold` lets the race go
    (`released`), and the race ends, freeing the model.
    max_run_s: the wall seconds it may last from its start, paused or not (`out_of_time`).
    """

    def __init__(self, clock=time.perf_counter, max_pause_s: float | None = None, max_run_s: float | None = None):
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.paused = False
        self.limit: int | None = None  # DFlash cycles allowed on screen while paused
        self.stopped = False
        self.max_pause_s, self.max_run_s = max_pause_s, max_run_s
        self.released: str | None = None  # PAUSE_EXPIRED, EVICTED or TIME_UP once the race was let go
        self._started = clock()  # the run's start, for its wall-clock budget
        self._held = 0.0  # seconds spent blocked in `hold`, left out of `clock()`
        self._held_at_start = 0.0  # `_held` when the run started: the run's pause time is the growth
        self.run = 0  # which run of this viewer the control drives; a newer one supersedes the rest
        self.active = False  # a run is playing (the session table keeps such a control)
        self._armed_at: float | None = None  # when "start paused" was asked for the next run
        self._armed_cycles = 0  # the cycles it shows before it holds
        self.viewer = Viewer()

    def clock(self) -> float:
        return self._clock() - self._held

    def arm(self, at: int = 0) -> None:
        """The next run (started within `ARM_S`) starts paused after `at` DFlash cycles (0: before
        cycle 1); a run that started at most `ARM_LATE_S` ago (one click sent both) pauses there, or
        where it is when it has shown more already."""
        with self._lock:
            if self.active and self._clock() - self._started <= ARM_LATE_S:
                self.paused = True
                self.limit = at if self.limit is None else self.limit
            else:
                self._armed_at, self._armed_cycles = self._clock(), at

    def advance_to(self, cycles: int) -> None:
        """Paused, with `cycles` DFlash cycles allowed on screen (never fewer than allowed already)."""
        with self._lock:
            self.paused = True
            self.limit = max(self.limit or 0, cycles)
        self._wake.set()

    def reset(self) -> int:
        """A new race starts playing, or paused before cycle 1 when `arm` was called just before;
        returns its run number."""
        with self._lock:
            armed = self._armed_at is not None and self._clock() - self._armed_at <= ARM_S
            self._armed_at = None
            self.paused, self.limit = armed, self._armed_cycles if armed else None
            self.stopped, self.released = False, None
            self._started, self._held_at_start = self._clock(), self._held
            self.run += 1
            self.active = True
            run = self.run
        self._wake.set()
        return run

    def superseded(self, run: int) -> bool:
        """True once a newer run of this viewer has started: the older one must end."""
        return self.run != run

    def done(self, run: int) -> None:
        """Run `run` has ended (the session table may now drop this control)."""
        with self._lock:
            if self.run == run:
                self.active = False

    def paused_s(self) -> float:
        """Seconds the current run has spent paused so far."""
        return self._held - self._held_at_start

    def out_of_time(self) -> bool:
        """True once the run has lasted `max_run_s` wall seconds; it is then released (TIME_UP)."""
        if self.max_run_s is not None and self.released is None and self._clock() - self._started >= self.max_run_s:
            self.release(TIME_UP)
        return self.released == TIME_UP

    def pause(self, shown: int) -> None:
        with self._lock:
            self.paused = True
            if self.limit is None:
                self.limit = shown

    def step(self, shown: int) -> None:
        """One more DFlash cycle (pauses first when playing)."""
        with self._lock:
            self.paused = True
            self.limit = max(self.limit if self.limit is not None else shown, shown) + 1
        self._wake.set()

    def resume(self) -> None:
        with self._lock:
            self.paused, self.limit = False, None
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
        seconds; once the run's pause budget or wall-clock budget is spent the race is released
        (`released`). The time blocked is left out of `clock()`."""
        started = self._clock()
        while self.holding(shown) and not until():
            now = self._clock()
            if self.max_pause_s is not None and self.paused_s() + now - started >= self.max_pause_s:
                self.release(PAUSE_EXPIRED)
                break
            if self.out_of_time():
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
    """Every viewer's `Control`, by Gradio session: a bounded table. Only a race or a replay adds a
    session (`get`); the buttons find one (`find`) and never add, so calls with made-up session ids
    cannot push real viewers out. Past `size`, the least recently used controls with no run playing
    are dropped first; a race that a dropped control holds paused is released, so that it ends."""

    def __init__(self, size: int = 256, max_pause_s: float | None = None, max_run_s: float | None = None):
        self.size = size
        self.max_pause_s, self.max_run_s = max_pause_s, max_run_s
        self._table: dict[str, Control] = {}
        self._lock = threading.Lock()

    def get(self, session: str | None) -> Control:
        """The session's control, added when it has none (for a run about to start)."""
        key = session or ""
        evicted = []
        with self._lock:
            control = self._table.pop(key, None) or Control(max_pause_s=self.max_pause_s, max_run_s=self.max_run_s)
            self._table[key] = control  # most recently used last
            excess = len(self._table) - self.size
            if excess > 0:
                idle = [k for k, c in self._table.items() if not c.active and c is not control]
                playing = [k for k, c in self._table.items() if c.active and c is not control]
                for old in (idle + playing)[:excess]:
                    evicted.append(self._table.pop(old))
        for old in evicted:
            old.release(EVICTED)
        return control

    def detached(self) -> Control:
        """A control with this table's budgets that no session can reach (an agent's race)."""
        return Control(max_pause_s=self.max_pause_s, max_run_s=self.max_run_s)

    def find(self, session: str | None) -> Control | None:
        """The session's control, or None when it never raced (nothing is added)."""
        with self._lock:
            return self._table.get(session or "")

    def drop(self, session: str | None) -> None:
        """Forget a session; a race it paused is told to stop waiting (it then ends)."""
        with self._lock:
            control = self._table.pop(session or "", None)
        if control is not None:
            control.reset()  # a newer run number: the paused race is superseded and returns
