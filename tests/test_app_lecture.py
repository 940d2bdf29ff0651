"""What a class needs: a run that starts paused before cycle 1, cycles counted from 1 everywhere,
cycles labelled in words, the cycle view stepped back and on, the outputs of an earlier run cleared,
and a finished race slower than plain decoding explained with its own numbers.

Runs the app's handlers in-process on a shipped recorded race (no model, no server).
"""

from __future__ import annotations

import html
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from app.race.control import ARM_S, Control
from app.serve.replay import load_trace, shipped_traces
from app.ui import App, recorded_runs
from app.view import texts
from app.view.cycle_view import cycle_html
from app.view.frames import FRAME_FIELDS
from app.view.render import cycle_label
from app.view.why_speed import CycleCost, why_html
from dflash_core import Block

SHIPPED = shipped_traces()
pytestmark = pytest.mark.skipif(not SHIPPED, reason="no shipped traces")


def frame_of(values) -> dict:
    return dict(zip(FRAME_FIELDS, values))


def block(draft, accepted, verify_len=None, position=10):
    return Block(3, position, tuple(draft), accepted, 9, (*draft[:accepted], 9), 0.01, 0.02, 0.1, 1, verify_len)


def test_start_paused_holds_the_next_run_before_cycle_one_and_only_a_run_started_soon():
    now = [0.0]
    control = Control(clock=lambda: now[0])
    control.arm()
    control.reset()
    assert control.paused and control.limit == 0 and control.holding(0)
    control.resume()
    assert not control.holding(0)
    control.reset()  # not armed again: plays
    assert not control.paused
    control.arm()
    now[0] += ARM_S + 1  # armed, then forgotten: a later run plays
    control.reset()
    assert not control.paused and control.limit is None
    now[0] += 1  # the run's request came first: the pause asked for with it still lands before cycle 1
    control.arm()
    assert control.paused and control.limit == 0 and control.holding(0)
    control.resume()
    now[0] += 5  # a run long under way is not paused by it; the next one is
    control.arm()
    assert not control.paused
    control.reset()
    assert control.paused and control.limit == 0


def test_cycles_are_labelled_in_words_and_the_range_covers_every_slot_shown():
    assert cycle_label(block([1, 2, 3], 2)) == "3 drafts: 2 kept + 1 bonus"
    assert cycle_label(block([], 0)) == "no drafts: 1 bonus"
    assert cycle_label(block([1, 2, 3], 1, verify_len=3)) == "2 of 3 drafts verified: 1 kept + 1 bonus"
    # Block index 3 is the 4th cycle; with every draft kept, the bonus column is at position 14.
    view = SimpleNamespace(blocks=[block([1, 2, 3], 0)] * 3 + [block([1, 2, 3], 3)], prefill=None, name="dflash")
    head = re.search(r"<h4>(.*?)</h4>", cycle_html(view, None, 3, str)).group(1)
    assert head.startswith("Cycle 4 of 4 · positions 10–14 · 3 drafts: 3 kept + 1 bonus → 4 tokens"), head


def test_a_slower_race_says_why_with_its_numbers_and_what_a_one_step_verify_gives():
    cost = CycleCost(block_size=4, tau=2.0, verify=2.0, draft=0.2, other=0.1, rates=(0.6, 0.3, 0.1))
    text = html.unescape(why_html(cost, 0.87))
    assert "kept 2.00 tokens (tau) but cost 2.30 plain steps" in text
    assert "verify of 4 tokens 2.00, the drafter 0.20, the rest 0.10" in text
    # E = 1 + 0.6 + 0.3 + 0.1 = 2.0 tokens for 0.2 + 1 + 0.1 plain steps
    assert "the speedup model gives 1.54× at this run's acceptance" in text
    faster = why_html(cost, 1.3)
    assert "why-slower" not in faster and 'data-v="2.0000"' in faster and 'data-s="1.3000"' in faster
    assert why_html(None, 0.5) == ""


@pytest.fixture()
def app():
    return App([], "", None, recorded=recorded_runs())


def test_a_replay_started_paused_shows_nothing_until_step_then_cycle_one(app):
    viewer = SimpleNamespace(session_hash="class")
    app.lecture.before_run(True, viewer)
    stream = app.playback.replay(SHIPPED[0][0].stem, None, 4.0, viewer)
    frame = {}
    while "Paused" not in str(frame.get("control_status", "")):
        frame = frame_of(next(stream))
    assert frame["control_status"] == texts.PAUSED_BEFORE
    assert "tok-bonus" not in str(frame["dflash_tokens"])
    app.stepping.step(viewer)
    while "after cycle" not in str(frame.get("control_status", "")):
        frame = frame_of(next(stream))
    assert frame["control_status"].startswith("**Paused** after cycle 1: *Step* (→) shows cycle 2")
    assert str(frame["dflash_tokens"]).count("tok-bonus") == 1
    stream.close()


def test_the_cycle_view_steps_back_and_on_within_the_run_counted_from_one(app):
    viewer = SimpleNamespace(session_hash="back")
    last = frame_of(list(app.playback.replay(SHIPPED[0][0].stem, None, 4.0, viewer))[-1])
    n = last["cycle_pick"]["maximum"]
    assert last["cycle_pick"]["value"] == n and f"Cycle {n} of {n} " in last["cycle_view"]
    assert f">#{n} · " in last["dflash_strip"]  # the strip's newest row has the same number
    view, slider, follow = app.lecture.previous_cycle(n, viewer)
    assert f"Cycle {n - 1} of {n} " in view and slider["value"] == n - 1 and follow is False
    view, slider, _ = app.lecture.next_cycle(n, viewer)  # past the last: stays on it
    assert f"Cycle {n} of {n} " in view and slider["value"] == n
    view, slider, _ = app.lecture.previous_cycle(1, viewer)
    assert "Cycle 1 of " in view and slider["value"] == 1
    # Best and worst: the first cycle that committed the most / the fewest tokens.
    lengths = [b.acceptance_length for b in load_trace(str(SHIPPED[0][0])).dflash.blocks]
    for jump, pick in ((app.lecture.best_cycle, max), (app.lecture.worst_cycle, min)):
        view, slider, _ = jump(viewer)
        k = lengths.index(pick(lengths)) + 1
        assert slider["value"] == k and f"Cycle {k} of {n} " in view and f"→ {pick(lengths)} token" in view
    # Another source's tab empties the area; the same source's keeps it.
    kept = app.lecture.switch_source("replay", "replay", viewer)
    assert kept[0] == "replay" and all(isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1
                                       for v in kept[1:])
    shown, *cleared = app.lecture.switch_source("live", "replay", viewer)
    cleared = frame_of(cleared)
    assert shown is None and cleared["dflash_tokens"] == "" and "Run a prompt" in cleared["summary"]
    assert cleared["report"]["value"] is None
    assert app.lecture.previous_cycle(3, viewer) == (gr.skip(), gr.skip(), gr.skip())  # nothing on screen now


def test_step_with_nothing_playing_arms_the_next_run(app):
    viewer = SimpleNamespace(session_hash="idle")
    assert app.lecture.step_when_idle(viewer) == texts.STARTING_PAUSED
    control = app.controls.find("idle")
    control.reset()
    assert control.paused and control.limit == 0


def test_a_lesson_opens_held_at_its_first_stop_and_moves_between_stops(app):
    viewer = SimpleNamespace(session_hash="lesson")
    trace, speed, callout, state = app.lessons.open("one-cycle", viewer)
    assert (trace, state) == ("code-greedy", {"key": "one-cycle", "stop": 0})
    assert "**Lesson: One cycle** · stop 1 of 4 (cycle 1) · recorded by this app on cpu" in callout
    stream = app.playback.replay(trace, None, 4.0, viewer)
    frame = {}
    while "Paused" not in str(frame.get("control_status", "")):
        frame = frame_of(next(stream))
    assert frame["control_status"].startswith("**Paused** after cycle 1:")
    callout, state, *_ = app.lessons.next(state, viewer)
    assert "stop 2 of 4 (cycle 2)" in callout and state["stop"] == 1
    while "after cycle 2" not in str(frame.get("control_status", "")):
        frame = frame_of(next(stream))
    callout, state, view, slider, follow, _ = app.lessons.previous(state, viewer)
    assert "stop 1 of 4" in callout and "Cycle 1 of 2 " in view and slider["value"] == 1 and follow is False
    stream.close()
    # The last stop's figures are the recording's own.
    end = app.lessons.callout("one-cycle", 3)
    report = load_trace(str(SHIPPED[0][0].with_name("code-greedy.json"))).report()
    assert f"tau {report.tau:.2f} tokens per cycle, {report.speedup:.2f}× plain decoding" in end
