"""The race: its lanes (DFlash, plain decoding, and any other drafters) advanced in one worker,
each on its own compute clock.

Running the lanes at once on a CPU would make them compete for the same cores, so the worker
interleaves their steps instead, always advancing the lane whose clock (prefill seconds plus the
draft and verify seconds of its blocks) is furthest behind. An event is released to the viewer once
the display clock reaches its timestamp, so at every frame every pane shows the same moment of
compute time and the on-screen race matches the measured speeds. The snapshots it yields are
plain data; rendering them is someone else's job.

A replay feeds recorded events through the same race: their timestamps are the recorded compute
clocks, and `speed` paces the display at a multiple of real time. A `Control` (see `control.py`)
pauses the race and steps it one cycle of its lead lane (the first, DFlash) at a time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from dflash_core.events import Block, Prefill, StopReason, Summary

from .control import Control

Event = Prefill | Block | Summary
FRAME_S = 0.08  # the shortest time between two frames


@dataclass(frozen=True)
class SideView:
    """What the viewer may see of one side at one moment."""

    name: str
    prefill: Prefill | None
    blocks: tuple[Block, ...]
    summary: Summary | None  # set once this side has finished on screen
    elapsed_s: float  # this side's compute clock as shown on screen
    block_size: int
    # (compute seconds, tokens so far) after each released event, for the speed chart
    timeline: tuple[tuple[float, int], ...] = ()

    @property
    def done(self) -> bool:
        return self.summary is not None

    @property
    def output_ids(self) -> list[int]:
        if self.summary is not None:
            return list(self.summary.output_ids)
        ids = [self.prefill.token_id] if self.prefill else []
        for block in self.blocks:
            ids.extend(block.committed_ids)
        return ids

    @property
    def num_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_summary(self, stop_reason: StopReason = "running") -> Summary | None:
        """The engine's summary, or a provisional one over the blocks shown so far."""
        if self.summary is not None:
            return self.summary
        if self.prefill is None:
            return None
        return Summary(
            output_ids=tuple(self.output_ids),
            prompt_len=self.prefill.prompt_len,
            block_size=self.block_size,
            stop_reason=stop_reason,
            prefill=self.prefill,
            blocks=self.blocks,
            total_s=self.elapsed_s,
        )


@dataclass(frozen=True)
class Snapshot:
    lanes: dict[str, SideView]  # every lane's view, by name, the lead lane first
    wall_s: float  # since the race started
    done: bool
    stopped: bool = False  # the race was cut short by `stop`: what is shown is all there is
    paused: bool = False  # the viewer paused the race at this snapshot
    # Nothing changed since the last snapshot: yielded only so that whoever streams the frames
    # gets control back at least every `keepalive_s` (and can notice a client that left).
    idle: bool = False
    released: str | None = None  # why a paused race was let go, when that ended it (see control.py)

    @property
    def lead(self) -> SideView:
        """The lane whose cycles Pause / Step count (DFlash in the app's races)."""
        return next(iter(self.lanes.values()))

    @property
    def dflash(self) -> SideView:
        return self.lanes["dflash"]

    @property
    def plain(self) -> SideView:
        return self.lanes["plain"]


class _Runner:
    """One side: pulls events from its generator and stamps them with its own compute clock."""

    def __init__(self, name: str, events: Iterator[Event], block_size: int):
        self.name = name
        self.events = events
        self.block_size = block_size
        self.clock = 0.0
        self.finished = False
        self.pending: deque[tuple[float, Event]] = deque()  # computed, not yet on screen
        self.prefill: Prefill | None = None
        self.blocks: list[Block] = []
        self.summary: Summary | None = None
        self.timeline: list[tuple[float, int]] = []
        self.tokens = 0
        self.block_stamps: list[float] = []  # compute clock at the end of each computed block

    def step(self) -> None:
        event = next(self.events)
        # The engine's clocks count compute time only, so time this generator sits suspended
        # while the other side runs does not leak into either side.
        if isinstance(event, Prefill):
            self.clock = event.seconds
        elif isinstance(event, Block):
            self.clock = event.elapsed_s
            self.block_stamps.append(self.clock)
        else:
            self.clock = event.total_s
            self.finished = True
        self.pending.append((self.clock, event))

    def release(self, until: float) -> bool:
        released = False
        while self.pending and self.pending[0][0] <= until:
            stamp, event = self.pending.popleft()
            released = True
            if isinstance(event, Prefill):
                self.prefill = event
                self.tokens = 1
            elif isinstance(event, Block):
                self.blocks.append(event)
                self.tokens += len(event.committed_ids)
            else:
                self.summary = event
                # The summary's blocks are the run's record; a remote engine's streamed blocks are
                # provisional (vllm_client.py), and a local engine's are the same blocks.
                self.blocks = list(event.blocks)
            if not isinstance(event, Summary):
                self.timeline.append((stamp, self.tokens))
        return released

    def view(self, display_clock: float) -> SideView:
        elapsed = self.summary.total_s if self.summary else min(display_clock, self.clock)
        return SideView(
            name=self.name,
            prefill=self.prefill,
            blocks=tuple(self.blocks),
            summary=self.summary,
            elapsed_s=max(elapsed, 0.0),
            block_size=self.block_size,
            timeline=tuple(self.timeline),
        )


def race(
    lanes: Mapping[str, Iterator[Event]],
    *,
    block_sizes: Mapping[str, int],
    pace: bool = True,
    frame_s: float = FRAME_S,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    stop: Callable[[], bool] = lambda: False,
    speed: float | None = None,
    control: Control | None = None,
    keepalive_s: float = 1.0,
) -> Iterator[Snapshot]:
    """Yield snapshots of every lane until all have finished on screen, or until `stop()`.

    lanes: each lane's events by name, the lead lane first; block_sizes: each drafting lane's
    block size (a lane left out decodes one token per cycle).

    stop: asked before every engine step (one cycle of one side); once it returns True the race
    computes nothing more and ends with a snapshot of what is on screen, marked `stopped`.

    speed: for recorded events (a replay): show compute time at `speed` times real time.
    control: pause / step / continue; the race then runs on `control.clock`, which stops while
    paused, and while paused shows at most the lead lane's cycles the control allows. A race the
    control releases (paused past its budget, `Control.hold`; or out of wall time,
    `Control.out_of_time`) ends like a stopped one, `released` set.
    keepalive_s: the longest stretch without a snapshot (paused, or waiting for the next recorded
    event); the ones that only keep the stream alive are marked `idle`.
    pace: after the fastest lane finishes, fewer lanes are left to compute, so their events would
    arrive faster than during the shared phase; pacing keeps the on-screen clock running at
    the rate of the shared phase (compute seconds shown per second spent computing), so that the
    race the viewer sees stays proportional to the measured times.
    """
    runners = [_Runner(name, events, block_sizes.get(name, 1)) for name, events in lanes.items()]
    lead = runners[0]

    def views() -> dict[str, SideView]:
        return {r.name: r.view(display) for r in runners}
    if control is not None:
        clock = control.clock
    t0 = clock()
    busy = 0.0  # wall seconds spent computing (not waiting for the consumer of the frames)
    rate: float | None = None  # compute seconds shown per wall second, fixed once a side finishes
    anchor = (0.0, 0.0)  # (wall, display clock) when the rate was fixed
    last_frame = float("-inf")
    shown_any = False
    dirty = False  # released events not yet in a frame
    display = 0.0
    last_yield = 0.0  # wall time of the last snapshot of any kind
    while True:
        shown = len(lead.blocks)
        released = None
        if control is not None and control.holding(shown) and not stop():
            # Show what was released (the stepped cycle) and mark the pause, then wait.
            dirty, last_frame = False, clock() - t0
            yield Snapshot(views(), last_frame, False, paused=True)
            while control.holding(shown) and not stop():
                control.hold(shown, until=stop, for_s=keepalive_s)
                if control.holding(shown) and not stop():
                    yield Snapshot(views(), last_frame, False, paused=True,
                                   idle=True)
            released = control.released
        elif control is not None and control.out_of_time():  # its wall-clock budget, paused or not
            released = control.released
        if stop() or released:
            yield Snapshot(views(), clock() - t0, True, stopped=True,
                           released=released)
            return
        active = [r for r in runners if not r.finished]
        if active:
            started = clock()
            min(active, key=lambda r: r.clock).step()
            busy += clock() - started
            active = [r for r in runners if not r.finished]
        wall = clock() - t0
        computed = min((r.clock for r in active), default=float("inf"))
        if speed:
            display = min(computed, speed * wall)
        else:
            if pace and rate is None and active and len(active) < len(runners) and busy > 0:
                rate, anchor = computed / busy, (wall, computed)
            display = computed if not (pace and rate) else min(computed, anchor[1] + rate * (wall - anchor[0]))
        allowed = control.cap() if control is not None else None
        if allowed is not None and allowed <= len(lead.block_stamps):
            # Paused: no further than the end of the last cycle allowed, on every lane.
            display = min(display, lead.block_stamps[allowed - 1] if allowed else 0.0)
        released = [r.release(display) for r in runners]  # every side, no short-circuit
        dirty = any(released) or dirty
        finished = not active and not any(r.pending for r in runners)
        # The first tokens go out at once (time to first visible token); later ones in frames.
        if finished or (dirty and (not shown_any or wall - last_frame >= frame_s)):
            shown_any, dirty, last_frame, last_yield = True, False, wall, wall
            yield Snapshot(views(), wall, finished)
        elif wall - last_yield >= keepalive_s:
            last_yield = wall
            yield Snapshot(views(), wall, False, idle=True)
        if finished:
            return
        if not active:
            # Everything is computed; wait for the on-screen clock to reach the next event.
            next_stamp = min(r.pending[0][0] for r in runners if r.pending)
            if speed:
                due = next_stamp / speed
            else:
                due = anchor[0] + (next_stamp - anchor[1]) / rate if rate else wall
            sleep(max(0.0, min(due - wall, frame_s)))
