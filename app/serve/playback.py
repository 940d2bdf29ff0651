"""The Replay tab's handler: a recorded race streamed through the live race's frames.

The recorded events run through the same race, paced by their recorded compute clocks at a
multiple of real time, under the viewer's Pause / Step / Continue; no model is needed. What a
replay may cost is bounded: a visitor names a recorded run by its name (never a path) or uploads a
file, which must not be another session's trace; at most `replay_concurrency` replays play and
`replay_queue` wait (`ReplaySlots`), and a visitor's place is taken before the file is read: the
server parses one trace at a time, and a file once while it is unchanged (`TraceParses`); a recording longer than `max_replay_s` in real time plays
faster, and frames and charts are drawn less often the bigger the recording, so that its total
drawing work stays proportional to its size; a frame of n bytes (each within the budgets of
`view/budget.py`) takes at least n x (replays playing) / BYTES_DRAWN_PER_S seconds, its drawing
included, before the next is drawn: all replays together draw at most BYTES_DRAWN_PER_S, and each
browser is sent no more than it draws (`view/frames.draw_s`). Any failure while loading or playing a trace reaches the visitor as a message.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path

import gradio as gr

from ..guard.callers import session_of, visitor_of
from ..guard.limits import Limits
from ..guard.readers import Readers
from ..guard.traces import TraceStore
from ..race.control import Controls
from ..race.interleave import FRAME_S, race
from ..view import texts
from ..view.frames import (
    CHART_EVERY_S,
    ChartPacer,
    Frame,
    draw_s,
    html_bytes,
    note_frame,
    race_frame,
    released_text,
    start_frame,
)
from ..view.pinned import run_label
from .failures import visitor_error
from .replay import RecordedPieces, ReplayError, load_trace

# Drawing a frame costs about a microsecond per token shown, a chart frame about as much per block:
# the pacing keeps either under these rates, so a replay's drawing never grows with its length twice.
TOKENS_DRAWN_PER_S = 50_000
BLOCKS_CHARTED_PER_S = 20_000
# What the replays playing send, together: building a frame's HTML costs the CPU a live race needs,
# so the rate is the server's, shared by the replays playing (one replay alone: the biggest running
# frame of a shipped replay, 235 KB every FRAME_S of 0.08 s, is 2.9 MB/s and never slowed; four
# replays of crafted traces that fill every budget send 3 MB/s in all, not four times that).
BYTES_DRAWN_PER_S = 3_000_000
MIN_SPEED, MAX_SPEED = 0.1, 4.0  # a class can follow each cycle at 0.1x
WAIT_POLL_S = 1.0  # a replay waiting for a slot says so this often (and notices a client that left)


def _speed(value) -> float:
    try:
        speed = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ReplayError(texts.BAD_SPEED_TYPE.format(value=str(value)[:40])) from None
    if not MIN_SPEED <= speed <= MAX_SPEED:  # NaN included
        raise ReplayError(texts.BAD_SPEED.format(speed=speed))
    return speed


class ReplayBusy(Exception):
    pass


class ReplaySlots:
    """At most `concurrency` replays play at once and `queue` more wait, and one visitor holds at
    most `per_visitor` of all these places; another is refused."""

    def __init__(self, concurrency: int, queue: int, per_visitor: int | None = None):
        self.concurrency, self.queue, self.per_visitor = concurrency, queue, per_visitor
        self._cond = threading.Condition()
        self.playing = self.waiting = 0
        self._held: Counter[str] = Counter()  # places (playing or waiting) by visitor

    def join(self, visitor: str = "") -> None:
        """Take a place in line, or raise ReplayBusy."""
        with self._cond:
            # A call with no address ("") comes from this process (tests, a script), not a visitor.
            if visitor and self.per_visitor is not None and self._held[visitor] >= self.per_visitor:
                raise ReplayBusy(texts.REPLAY_YOURS_BUSY.format(held=self._held[visitor]))
            if self.playing + self.waiting >= self.concurrency + self.queue:
                raise ReplayBusy(texts.REPLAY_BUSY.format(playing=self.playing, waiting=self.waiting))
            self.waiting += 1
            self._held[visitor] += 1

    def wait(self, timeout: float) -> bool:
        """Move from the line to a slot within `timeout` seconds; False if none came free."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.playing < self.concurrency, timeout):
                return False
            self.waiting -= 1
            self.playing += 1
            return True

    def leave(self, playing: bool, visitor: str = "") -> None:
        with self._cond:
            if playing:
                self.playing -= 1
            else:
                self.waiting -= 1
            self._held[visitor] -= 1
            if self._held[visitor] <= 0:
                del self._held[visitor]
            self._cond.notify_all()


class TraceParses:
    """Traces parsed one at a time server-wide (a large upload costs CPU time and memory
    while it is parsed), each file once: the last `keep` parsed are kept by (path, size,
    modification time), so many replays of one upload share one parse."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self.parsed = 0  # files parsed so far
        self._slot = threading.Lock()
        self._kept: OrderedDict[tuple, object] = OrderedDict()

    def load(self, path):
        """The `Recording` of `path` (`load_trace`, with its errors)."""
        key = _file_key(path)
        with self._slot:
            if key is not None and key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
            recording = load_trace(path)
            self.parsed += 1
            if key is not None:
                self._kept[key] = recording
                while len(self._kept) > self.keep:
                    self._kept.popitem(last=False)
            return recording


def _file_key(path) -> tuple | None:
    try:
        resolved = Path(path).resolve()
        stat = os.stat(resolved)
    except (OSError, TypeError, ValueError):  # load_trace says what is wrong
        return None
    return str(resolved), stat.st_size, stat.st_mtime_ns


class Playback:
    def __init__(self, controls: Controls, limits: Limits | None = None, traces: TraceStore | None = None,
                 recorded: dict[str, str] | None = None, readers: Readers | None = None):
        """recorded: the recorded runs offered, by name -> file (None: any path may be named, for
        code that calls `replay` directly); traces: the store whose files belong to sessions."""
        self.controls = controls  # each session's Pause / Step / Continue
        self.limits = limits or Limits()
        self.traces = traces
        self.recorded = recorded
        self.slots = ReplaySlots(self.limits.replay_concurrency, self.limits.replay_queue, self.limits.per_visitor)
        self.parses = TraceParses()
        self.readers = readers or Readers()  # whether anyone still reads a session's stream

    def source(self, shipped, uploaded, session: str | None) -> str | None:
        """The file to replay: the upload, else the recorded run named; never another session's trace."""
        if uploaded:
            path = str(uploaded)
            known, owner = self.traces.owner(path) if self.traces is not None else (False, None)
            if known and owner != session:
                raise ReplayError(texts.NOT_YOURS.format(name=Path(path).name))
            return path
        if not shipped or self.recorded is None:
            return shipped
        if shipped not in self.recorded:
            raise ReplayError(texts.UNKNOWN_RECORDING.format(name=str(shipped)[:80]))
        return self.recorded[shipped]

    def replay(self, shipped, uploaded, speed, request: gr.Request = None):
        """Stream a recorded race, paced by its recorded compute clocks at `speed` times real time."""
        session, visitor = session_of(request), visitor_of(request)
        try:
            source = self.source(shipped, uploaded, session)
            speed = _speed(speed)
        except (ReplayError, TypeError, ValueError, OverflowError) as exc:
            raise visitor_error(str(exc)) from None
        try:
            self.slots.join(visitor)  # before the file is read: a place, then the parse
        except ReplayBusy as exc:
            raise visitor_error(str(exc)) from None
        try:
            recording = self._load(source, shipped, uploaded)
        except BaseException:
            self.slots.leave(False, visitor)
            raise
        playing, control, run = False, None, None
        gone = self.readers.watch(getattr(request, "session_hash", None))
        try:
            control = self.controls.get(session)
            run = control.reset()
            while not self.slots.wait(WAIT_POLL_S):
                if control.superseded(run) or gone() or control.out_of_time():
                    return
                yield note_frame(texts.REPLAY_WAITING.format(playing=self.slots.playing)).values()
            playing = True
            try:
                yield from self._play(recording, speed, control, run, gone)
            except gr.Error:
                raise
            except Exception as exc:  # noqa: BLE001 - as above: a message, never silence
                raise visitor_error(_failed(shipped, uploaded, exc, recording.name)) from None
        finally:
            if control is not None:
                control.done(run)
            self.slots.leave(playing, visitor)

    def _load(self, source, shipped, uploaded):
        """The recording of `source` (`parses`); every failure becomes the visitor's message."""
        try:
            return self.parses.load(source)
        except (ReplayError, TypeError, ValueError, OverflowError) as exc:
            raise visitor_error(str(exc)) from None
        except gr.Error:  # already the visitor's message
            raise
        except Exception as exc:  # noqa: BLE001 - a fault no check foresaw still reaches the visitor
            raise visitor_error(_failed(shipped, uploaded, exc)) from None

    def _play(self, recording, speed: float, control, run: int, gone=lambda: False):
        control.viewer.text_of = recording.text_of
        control.viewer.label = run_label(f"recording {recording.name}", f"block {recording.block_size}, "
                                         f"T={recording.temperature:g}", recording.settings.get("prompt", ""))
        control.viewer.prompt_ids = tuple(recording.settings.get("prompt_ids") or ())
        note = texts.REPLAY_NOTE.format(name=recording.name)
        if recording.thinking is not None:
            note += " " + texts.RECORDED_THINKING.format(words=recording.thinking.words())
        recorded_s = max(run.total_s for run in recording.runs.values())
        if recorded_s / speed > self.limits.max_replay_s:
            played = recorded_s / self.limits.max_replay_s
            note = texts.REPLAY_CAPPED.format(
                recorded_s=recorded_s / speed, speed=speed, played=played, limit_s=self.limits.max_replay_s
            ) + " " + note
            speed = played
        lanes = tuple(recording.runs)
        yield start_frame(texts.REPLAY_START.format(label=recording.label(), speed=speed), lanes).values()
        pieces = {lane: RecordedPieces(recording, lane) for lane in lanes}
        running = texts.REPLAYING.format(name=recording.name, speed=speed)
        tokens = sum(len(run.output_ids) for run in recording.runs.values())
        blocks = sum(len(run.blocks) for run in recording.runs.values())
        pacer = ChartPacer(max(CHART_EVERY_S, blocks / BLOCKS_CHARTED_PER_S))
        snapshot = None
        next_frame = 0.0  # when the last frame's bytes allow the next one (time.perf_counter)
        for snapshot in race(
            {lane: recording.events(lane) for lane in lanes},
            block_sizes={lane: summary.block_size for lane, summary in recording.runs.items()},
            speed=speed, control=control, stop=lambda: control.superseded(run) or gone(),
            frame_s=max(FRAME_S, tokens / TOKENS_DRAWN_PER_S),
        ):
            if snapshot.idle:  # nothing new: the frame only lets Gradio see a client that left
                yield Frame().values()
                continue
            if snapshot.stopped:
                released = released_text(snapshot, control)
                if released is not None:  # paused too long: the slot goes to someone else
                    frame = race_frame(snapshot, pieces, recording.text_of, None, True, control.viewer, running=released)
                    frame.control_status = released
                    yield frame.values()
                return  # or a newer replay or race of this viewer took over the panes
            with_charts = pacer.due(snapshot)
            if not snapshot.done:
                time.sleep(max(0.0, next_frame - time.perf_counter()))
                started = time.perf_counter()  # drawing the frame counts towards its time
                values = race_frame(
                    snapshot, pieces, recording.text_of, None, with_charts, control.viewer, running=running
                ).values()
                size = html_bytes(values)  # the server's rate shared by the replays, and the browser's own
                next_frame = started + max(size * max(1, self.slots.playing) / BYTES_DRAWN_PER_S,
                                           draw_s(size, with_charts))
                yield values
        time.sleep(max(0.0, next_frame - time.perf_counter()))
        yield race_frame(snapshot, pieces, recording.text_of, recording.report(), True, control.viewer, note=note).values()


def _failed(shipped, uploaded, exc: Exception, name: str | None = None) -> str:
    """The message of a replay that failed in a way no check caught: the trace named by its file's
    name, the error's first line with every folder left out of the paths it quotes."""
    if name is None:
        try:
            name = Path(str(uploaded or shipped)).stem[:80] or "the trace"
        except (TypeError, ValueError):  # str() of a 5,000-digit number raises
            name = "the trace"
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    first = _FOLDERS.sub("", first)
    return texts.REPLAY_FAILED.format(name=name, error=f"{type(exc).__name__}: {first}")


_FOLDERS = re.compile(r"(?:/[^/\s'\"]+)+/(?=[^/\s'\"])")  # "/srv/app/x.json" -> "x.json"
