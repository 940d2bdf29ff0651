"""What a class needs: a run that starts paused before cycle 1, cycles counted from 1 everywhere,
cycles labelled in words, the cycle view and the panes stepped back and on, the outputs of an earlier
run cleared, a finished race slower than plain decoding explained with its own numbers, and a
finished race pinned beside the next one.

Runs the app's handlers in-process on a shipped recorded race (no model, no server).
"""

from __future__ import annotations

import html
import json
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from app.race.control import ARM_S, Control
from app.race.lanes import LABELS
from app.serve.pinning import Pinning
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
    assert cycle_label(block([1, 2, 3], 0, verify_len=1)) == "3 drafts, none verified: 1 bonus"
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


def looked(values) -> tuple[object, dict]:
    """A cycle picker's answer (`stepping.look_at`): the follow checkbox, the race's outputs."""
    follow, *rest = values
    return follow, frame_of(rest)


def test_the_cycle_view_steps_back_and_on_within_the_run_counted_from_one(app):
    viewer = SimpleNamespace(session_hash="back")
    last = frame_of(list(app.playback.replay(SHIPPED[0][0].stem, None, 4.0, viewer))[-1])
    n = last["cycle_pick"]["maximum"]
    assert last["cycle_pick"]["value"] == n and f"Cycle {n} of {n} " in last["cycle_view"]
    assert f">#{n} · " in last["dflash_strip"]  # the strip's newest row has the same number
    follow, shown = looked(app.lecture.previous_cycle(n, viewer))
    assert f"Cycle {n - 1} of {n} " in shown["cycle_view"] and shown["cycle_pick"]["value"] == n - 1 and follow is False
    # The run has ended: the panes went back too, and the status says where they are.
    assert shown["control_status"].startswith(f"**Back at cycle {n - 1}** of {n}, the race finished")
    assert f">#{n - 1} · " in shown["dflash_strip"] and f">#{n} · " not in shown["dflash_strip"]
    assert shown["dflash_tokens"].count("tok-bonus") == n - 1
    follow, shown = looked(app.lecture.next_cycle(n - 1, viewer))  # the last cycle: the finished race
    assert f"Cycle {n} of {n} " in shown["cycle_view"] and shown["cycle_pick"]["value"] == n and follow is True
    assert shown["control_status"] == texts.FINISHED and shown["dflash_tokens"] == last["dflash_tokens"]
    _, shown = looked(app.lecture.next_cycle(n, viewer))  # past the last: stays on it
    assert f"Cycle {n} of {n} " in shown["cycle_view"] and shown["cycle_pick"]["value"] == n
    _, shown = looked(app.lecture.previous_cycle(1, viewer))
    assert "Cycle 1 of " in shown["cycle_view"] and shown["cycle_pick"]["value"] == 1
    # Best and worst: the first cycle that committed the most / the fewest tokens.
    lengths = [b.acceptance_length for b in load_trace(str(SHIPPED[0][0])).dflash.blocks]
    for jump, pick in ((app.lecture.best_cycle, max), (app.lecture.worst_cycle, min)):
        _, shown = looked(jump(viewer))
        k = lengths.index(pick(lengths)) + 1
        assert shown["cycle_pick"]["value"] == k and f"Cycle {k} of {n} " in shown["cycle_view"]
        assert f"→ {pick(lengths)} token" in shown["cycle_view"]
    # Another source's tab empties the area; the same source's keeps it.
    kept = app.lecture.switch_source("replay", "replay", viewer)
    assert kept[0] == "replay" and all(isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1
                                       for v in kept[1:])
    shown, *cleared = app.lecture.switch_source("live", "replay", viewer)
    cleared = frame_of(cleared)
    assert shown is None and cleared["dflash_tokens"] == "" and "Run a prompt" in cleared["summary"]
    assert cleared["report"]["value"] is None
    assert all(value == gr.skip() for value in app.lecture.previous_cycle(3, viewer))  # nothing on screen now


def test_a_paused_replay_stepped_back_shows_every_pane_as_it_was_at_that_cycle(app):
    """Paused after cycle 3, then back to 2 and 1 and on again: each lane's stats, tokens and draft
    strip equal what the replay showed when it was paused at that cycle, and every number agrees."""
    viewer = SimpleNamespace(session_hash="panes")
    app.lecture.before_run(True, viewer)
    stream = app.playback.replay(SHIPPED[0][0].stem, None, 4.0, viewer)
    paused_at, frame = {}, {}
    while frame.get("control_status") != texts.PAUSED_BEFORE:
        frame = frame_of(next(stream))
    parts = [name for name in FRAME_FIELDS if name.endswith(("_stats", "_tokens", "_strip"))]
    for k in (1, 2, 3):
        app.stepping.step(viewer)
        while f"after cycle {k}:" not in str(frame.get("control_status", "")):
            frame = frame_of(next(stream))
        paused_at[k] = {name: frame[name] for name in parts if isinstance(frame[name], str)}
    lanes = {name.rsplit("_", 1)[0] for name in paused_at[1]}
    assert {"dflash", "plain"} <= lanes
    assert all(paused_at[1][f"{lane}_tokens"] != paused_at[3][f"{lane}_tokens"] for lane in ("dflash", "plain"))
    for k, move in ((2, app.lecture.previous_cycle), (1, app.lecture.previous_cycle), (2, app.lecture.next_cycle)):
        follow, shown = looked(move(k - (1 if move == app.lecture.next_cycle else -1), viewer))
        assert follow is False and shown["cycle_pick"]["value"] == k and f"Cycle {k} of 3 " in shown["cycle_view"]
        assert shown["control_status"].startswith(f"**Back at cycle {k}** of 3: every pane shows the race after it")
        for name, html_then in paused_at[k].items():
            assert shown[name] == html_then, (k, name)
    follow, shown = looked(app.lecture.next_cycle(2, viewer))  # where the replay paused
    assert follow is True and shown["control_status"] == texts.PAUSED.format(cycle=3, next=4)
    assert all(shown[name] == html_then for name, html_then in paused_at[3].items())
    app.lecture.previous_cycle(3, viewer)
    assert app.stepping.step(viewer)[1] is True  # Step from a cycle stepped back: the views follow the run again
    while "after cycle 4:" not in str(frame.get("control_status", "")):
        frame = frame_of(next(stream))
    assert frame["dflash_tokens"].count("tok-bonus") == 4 and "Cycle 4 of 4 " in frame["cycle_view"]
    stream.close()


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
    callout, state, _, *answer = app.lessons.previous(state, viewer)
    follow, shown = looked(answer)
    assert "stop 1 of 4" in callout and "Cycle 1 of 2 " in shown["cycle_view"] and follow is False
    assert shown["cycle_pick"]["value"] == 1 and shown["dflash_tokens"].count("tok-bonus") == 1
    stream.close()
    # The last stop's figures are the recording's own.
    end = app.lessons.callout("one-cycle", 3)
    report = load_trace(str(SHIPPED[0][0].with_name("code-greedy.json"))).report()
    assert f"tau {report.tau:.2f} tokens per cycle, {report.speedup:.2f}× plain decoding" in end


def test_a_pinned_race_stays_beside_the_next_one_until_unpinned(app):
    """Block 4, pinned, then block 16: the pin holds the block-4 race's settings, every lane's tok/s,
    tau and speedup and its DFlash text, whatever races next; each racing tab has its own pin."""
    viewer = SimpleNamespace(session_hash="pin")
    assert app.pinning.pin("replay", {}, viewer) == (gr.skip(),) * 3  # nothing finished yet: nothing pinned
    b4 = frame_of(list(app.playback.replay("code-greedy", None, 4.0, viewer))[-1])
    pins, panel, column = app.pinning.pin("replay", {}, viewer)
    assert set(pins) == {"replay"} and column["visible"] is True and pins["replay"] == panel
    text = html.unescape(re.sub(r"<[^>]+>", " ", panel))
    report = load_trace(str(SHIPPED[0][0].with_name("code-greedy.json"))).report()
    assert "recording code-greedy · block 4, T=0 · “Write a Python function `is_prime(n)`" in text
    for name, lane in report.lanes.items():  # every lane's numbers, as the summary has them
        assert re.search(rf"{re.escape(LABELS[name])}\s+{lane.tok_s:.1f}\s+{lane.tau:.2f}\s+{lane.speedup:.2f}×"
                         if name != "plain" else rf"plain decoding\s+{lane.tok_s:.1f}\s+1\s+", text), name
    pane_text = re.sub(r'<span class="tip">.*?</span></span>|<[^>]+>', "", b4["dflash_tokens"])
    assert html.unescape(re.sub(r"<[^>]+>", "", panel.split("DFlash’s text:</div>")[1])) == html.unescape(pane_text)
    assert panel.count('class="tok tok-bonus') == b4["dflash_tokens"].count('class="tok tok-bonus') >= report.cycles - 1
    # Block 16 races next: the pin is page state, which no frame of it touches; the panes are block 16's.
    b16 = frame_of(list(app.playback.replay("code-greedy-b16", None, 4.0, viewer))[-1])
    assert "block 16" in b16["dflash_stats"] and b16["dflash_tokens"] != b4["dflash_tokens"]
    assert Pinning.show("replay", pins) == (panel, column) and Pinning.show("live", pins)[0] == ""
    pins, panel, column = app.pinning.unpin("replay", pins)
    assert pins == {} and panel == "" and column["visible"] is False


def test_inside_a_cycle_says_what_each_lane_kind_did(app):
    """The AR drafter's cycle is its passes, one per draft, each reading the draft before; prompt
    lookup's names where in the context it found the n-gram it copied, and what it copied."""
    viewer = SimpleNamespace(session_hash="kinds")
    list(app.playback.replay("code-greedy", None, 4.0, viewer))
    trace = json.loads(SHIPPED[0][0].with_name("code-greedy.json").read_text())
    tokens, prompt_ids = trace["tokens"], trace["settings"]["prompt_ids"]
    text = lambda i: tokens.get(str(i), f"<{i}>")  # noqa: E731
    plain = lambda view: " ".join(html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<style>.*?</style>", "", view,  # noqa: E731
                                                                            flags=re.S))).split())

    _, dflash = looked(app.stepping.pick_lane("dflash", viewer))
    assert "the block-diffusion drafter proposed all 3 slots in 1 pass" in plain(dflash["cycle_view"]).lower()

    ar = trace["runs"]["ar"]["blocks"]
    _, shown = looked(app.stepping.pick_lane("ar", viewer))
    k = next(i for i, b in enumerate(ar) if b["accepted"] < len(b["draft_ids"])) + 1  # a cycle with a rejected draft
    _, shown = looked(app.stepping.pick_cycle(k, viewer))
    view, block = shown["cycle_view"], ar[k - 1]
    assert f"AR drafter lane · Cycle {k} of {len(ar)} " in plain(view)
    assert "3 forward passes of its own, one per draft" in view and view.count("<th>pass ") == 3
    reads = re.search(r"<tr><th>reads</th>(.*?)</tr>", view).group(1)
    read_texts = [html.unescape(t) for t in re.findall(r'<span class="tk"[^>]*>(.*?)</span>', reads)]
    wanted = [text(block["explain"]["slot0_id"]), *(text(t) for t in block["draft_ids"][:-1])]
    assert read_texts == [t.replace("\n", "⏎") for t in wanted]  # each pass reads the draft before it
    proposes = view.split("<th>proposes: its top-3</th>")[1].split("2 · target features")[0]
    assert proposes.count('class="pick"') == 3  # each pass's own draft marked in its top-3
    assert "✗ rejected" in view and "passes took" in view

    lookup = trace["runs"]["lookup"]["blocks"]
    _, shown = looked(app.stepping.pick_lane("lookup", viewer))
    copied = next(i for i, b in enumerate(lookup) if b["draft_ids"])
    _, shown = looked(app.stepping.pick_cycle(copied + 1, viewer))
    said = plain(shown["cycle_view"])
    assert f"prompt lookup lane · Cycle {copied + 1} of {len(lookup)} " in said
    where = re.search(r"ends with the (\d)-gram .*?Its latest earlier occurrence followed by tokens to copy is "
                      r"in (the prompt|the text generated so far), at positions? (\d+)", said)
    n, start = int(where.group(1)), int(where.group(3))
    block = lookup[copied]
    context = [*prompt_ids, trace["runs"]["lookup"]["prefill"]["token_id"],
               *(t for b in lookup[:copied] for t in b["committed_ids"])]
    assert context[start:start + n] == context[-n:]  # the n-gram the context ends with, found earlier
    assert context[start + n:start + n + len(block["draft_ids"])] == block["draft_ids"]  # and what followed it
    assert (where.group(2) == "the prompt") == (start + n <= len(prompt_ids))
    assert f"The drafts are the {len(block['draft_ids'])} tokens that followed it there" in said
    assert "100.0%" not in re.search(r"3 · copied from the context(.*?)4 · target", said, flags=re.S).group(1)
    _, shown = looked(app.stepping.pick_cycle(next(i for i, b in enumerate(lookup) if not b["draft_ids"]) + 1, viewer))
    assert "there is nothing to copy: the cycle verifies the bonus alone" in plain(shown["cycle_view"])
