"""Built-in lessons: each a race recorded by this app (assets/traces/), replayed paused at chosen
cycles with a short callout per stop, Next / Previous between them.

A callout's numbers come from the recorded trace itself (`{tau}`, `{speedup}`, a lane's), filled in
when the lesson opens, so they are always the recording's; the machine it was recorded on is named
from the trace's `hardware`. `open` arms the viewer's control to hold at the first stop and picks
the recording; the replay handler, chained after it, plays it there. `move` goes to another stop:
further in the race (the replay moves on to it) or back (the cycle view and the panes show that cycle).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import gradio as gr

from ..race.control import Controls
from .replay import SHIPPED
from .stepping import NOTHING_TO_LOOK_AT, look_at

END = 10**6  # a stop at the end of the race: the replay plays out


@dataclass(frozen=True)
class Stop:
    cycle: int  # DFlash cycles on screen, counted from 1 (END: the whole race)
    text: str  # a `str.format` template over the trace's figures (`figures`)


@dataclass(frozen=True)
class Lesson:
    key: str
    title: str
    trace: str  # the recorded run's name: assets/traces/<trace>.json
    stops: tuple[Stop, ...]
    speed: float = 1.0


LESSONS = (
    Lesson("one-cycle", "One cycle", "code-greedy", (
        Stop(1, "Cycle 1 of a block-4 race: the drafter saw one committed token (slot 0) and three masks, and "
                "filled all three in **one pass**; the target checked all of them in **one pass** and kept all "
                "three, plus its own next token (the bonus): 4 tokens for one target pass. *Inside a cycle* "
                "shows each slot's top-3 and the verdict."),
        Stop(2, "Cycle 2: the target kept the first draft and replaced the second with its own token (the bonus, "
                "yellow); the third draft came after a rejected one, so it is thrown away unchecked. Hover a "
                "struck-out draft in the strip for both top-5 lists."),
        Stop(5, "Cycle 5: no draft kept. The cycle still commits one token, the bonus, so it is never worse "
                "than a plain step in tokens, only in time (the drafter's pass and a wider verify)."),
        Stop(END, "The whole race: tau {tau:.2f} tokens per cycle, {speedup:.2f}× plain decoding on the "
                  "recorded compute clocks, and the same text as plain decoding (temperature 0)."),
    ), speed=0.5),
    Lesson("block-size", "Block size", "code-greedy-b16", (
        Stop(1, "The same prompt with a block-16 drafter: one pass fills 15 masks, and the target verifies 16 "
                "positions at once. A long accepted run pays more per cycle than at block 4."),
        Stop(END, "Block 16 here: tau {tau:.2f}, {speedup:.2f}× plain. The block-4 recording of this prompt (lesson "
                  "*One cycle*) kept {b4_tau:.2f} tokens per cycle for {b4_speedup:.2f}×. On this CPU a verify of "
                  "16 positions costs several plain steps (the line under the summary counts them), so a cycle "
                  "must keep several tokens just to break even."),
    )),
    Lesson("drafters", "Drafters compared", "code-greedy", (
        Stop(END, "Four lanes on one prompt: DFlash (one drafter pass per cycle) tau {tau:.2f}, {speedup:.2f}×; "
                  "the AR drafter ({ar_passes:.0f} passes per cycle, one per draft) tau {ar_tau:.2f}, "
                  "{ar_speedup:.2f}×; prompt lookup (no model, copies from the context) tau {lookup_tau:.2f}, "
                  "{lookup_speedup:.2f}×. The lanes table under the panes has each one's draft cost."),
    ), speed=2.0),
    Lesson("cpu-gpu", "Why a CPU is not a GPU", "code-greedy-b16", (
        Stop(END, "{speedup:.2f}× with tau {tau:.2f}: the line under the summary counts this run's cycle in plain "
                  "steps. On a GPU a verify of 16 costs about one plain step: press *a GPU as in the paper* in "
                  "the what-if model (under the charts) and move the verify cost back up to this run's."),
    ), speed=2.0),
)
BY_KEY = {lesson.key: lesson for lesson in LESSONS}


def figures(name: str) -> dict:
    """The recorded figures a callout may quote, and the machine, from assets/traces/<name>.json."""
    data = json.loads((SHIPPED / f"{name}.json").read_text(encoding="utf-8"))
    report, hardware = data["report"], data.get("hardware") or {}
    out = {"tau": report["tau"], "speedup": report["speedup"]}
    for lane, row in (report.get("lanes") or {}).items():
        out.update({f"{lane}_tau": row["tau"], f"{lane}_speedup": row["speedup"],
                    f"{lane}_passes": row.get("draft_passes_per_cycle", 0)})
    threads = hardware.get("threads")
    out["machine"] = ", ".join(str(x) for x in (hardware.get("device"), hardware.get("cpu") or hardware.get("gpu"),
                                                f"{threads} thread{'s' if threads != 1 else ''}" if threads else None)
                               if x)
    return out


class Lessons:
    def __init__(self, controls: Controls):
        self.controls = controls

    @staticmethod
    def callout(key: str, stop: int) -> str:
        lesson = BY_KEY[key]
        known = figures(lesson.trace)
        if lesson.key == "block-size":  # set beside the block-4 recording of the same prompt
            b4 = figures("code-greedy")
            known.update(b4_tau=b4["tau"], b4_speedup=b4["speedup"])
        where = "the end" if lesson.stops[stop].cycle == END else f"cycle {lesson.stops[stop].cycle}"
        return (f"**Lesson: {lesson.title}** · stop {stop + 1} of {len(lesson.stops)} ({where}) · recorded by this "
                f"app on {known['machine']} · `{lesson.trace}`\n\n{lesson.stops[stop].text.format(**known)}")

    def open(self, key: str, request: gr.Request = None):
        """One click: the lesson's recording picked, its replay armed to hold at the first stop.
        Returns the recorded run, the speed, the callout and the lesson state."""
        lesson = BY_KEY[key]
        self.controls.get(getattr(request, "session_hash", None)).arm(lesson.stops[0].cycle)
        return lesson.trace, lesson.speed, self.callout(key, 0), {"key": key, "stop": 0}

    def opener(self, key: str):
        """`open` for lesson `key`, as a handler (Gradio passes the request by annotation)."""

        def open_lesson(request: gr.Request = None):
            return self.open(key, request)

        return open_lesson

    def previous(self, state, request: gr.Request = None):
        return self.move(-1, state, request)

    def next(self, state, request: gr.Request = None):
        return self.move(1, state, request)

    def move(self, delta: int, state, request: gr.Request = None):
        """Another stop of the lesson open: the callout, the state, the cycle panel opened or not, then
        the follow checkbox and the race's outputs at that stop (`look_at`)."""
        key = (state or {}).get("key")
        if key not in BY_KEY:
            return (gr.skip(),) * 3 + NOTHING_TO_LOOK_AT
        lesson = BY_KEY[key]
        stop = min(max(int(state.get("stop", 0)) + delta, 0), len(lesson.stops) - 1)
        cycle = lesson.stops[stop].cycle
        control = self.controls.find(getattr(request, "session_hash", None))
        said = (self.callout(key, stop), {"key": key, "stop": stop})
        if control is None:
            return (*said, gr.skip(), *NOTHING_TO_LOOK_AT)
        viewer = control.viewer
        if control.active and cycle > viewer.shown:
            viewer.follow = True  # the replay moves on to the stop; its frames show the cycle
            if cycle == END:
                control.resume()
            else:
                control.advance_to(cycle)
            return (*said, gr.skip(), True, *NOTHING_TO_LOOK_AT[1:])
        looked = look_at(control, min(cycle, viewer.shown) - 1)
        if looked is NOTHING_TO_LOOK_AT:
            return (*said, gr.skip(), *NOTHING_TO_LOOK_AT)
        return (*said, gr.Accordion(open=True), *looked)
