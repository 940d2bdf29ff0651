"""A real browser (Debian's chromium through Python playwright) runs a race in the app.

Skips only when chromium or playwright is missing; CI installs both (no browser download).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from pathlib import Path

import pytest
from browser import chromium_path, run_race_in_browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

if chromium_path() is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed (pip install playwright)")

from serve import launch_app


@pytest.fixture(scope="module")
def app_url(tiny_dirs, request, tmp_path_factory):
    request.getfixturevalue("one_thread")
    from tiny import build_drafter

    ar_dir = build_drafter(tmp_path_factory.mktemp("ar") / "ar", tiny_dirs[0], block_size=4,
                           architectures=["DFlashARDraftModel"])
    demo, url = launch_app(*tiny_dirs, ar_drafter_dir=ar_dir)
    yield url
    demo.close()


@pytest.mark.slow
def test_browser_runs_a_race_and_shows_colored_tokens_and_charts(app_url):
    shot = ARTIFACTS / "app-race.png"
    seen = run_race_in_browser(app_url, "What is the capital of France?", shot, max_new_tokens=24, timeout_s=60)
    assert seen["target_tokens"] >= 1 and seen["plain_tokens"] >= 1
    assert seen["token_background"] not in ("rgba(0, 0, 0, 0)", "transparent")  # the token really is colored
    assert seen["plots"] >= 4 and seen["bars"] >= 1
    assert "identical" in seen["summary"] and '"tau"' in seen["report"]
    assert shot.stat().st_size > 10_000
    assert seen["lanes_visible"] == ["dflash", "plain"]  # the added lanes' panes stay hidden
    # Each pane opens on its newest token (a column-reverse box) and a text shorter than the box starts at its top.
    assert seen["first_token_below_top"].keys() >= {"dflash", "plain"}
    assert all(px <= 16 for px in seen["first_token_below_top"].values()), seen["first_token_below_top"]


@pytest.mark.slow
def test_browser_races_five_lanes_each_in_its_own_pane(app_url):
    shot = ARTIFACTS / "app-five-lanes.png"
    seen = run_race_in_browser(app_url, "What is the capital of France?", shot, max_new_tokens=24, timeout_s=90,
                               lanes=("scheduled", "ar", "lookup"))
    assert seen["lanes_visible"] == ["dflash", "scheduled", "ar", "lookup", "plain"]
    assert seen["lane_tokens"] == dict.fromkeys(seen["lanes_visible"], 24)
    assert all(lane in seen["summary"] for lane in ("DFlash, scheduled block", "AR drafter", "prompt lookup"))
    assert '"lanes"' in seen["report"]


@pytest.fixture(scope="module")
def long_race_url(request, tmp_path_factory):
    """An app on a tiny pair whose target holds a 512-token race (the app's longest)."""
    request.getfixturevalue("one_thread")
    from tiny import build_drafter, build_target

    root = tmp_path_factory.mktemp("long")
    target = build_target(root / "target", max_positions=1024)
    demo, url = launch_app(target, build_drafter(root / "drafter", target))
    yield url
    demo.close()


@pytest.mark.slow
@pytest.mark.alone  # beside the suite's two-rank training tests the page's own time varies 0.4-1.5 s
def test_browser_stop_answers_within_a_second_during_a_512_token_race(long_race_url):
    from browser import stop_during_long_race

    seen = stop_during_long_race(long_race_url, max_new_tokens=512)
    assert "Stopped:" in seen["summary"], seen  # it stopped, not finished before the click landed
    assert seen["tokens_after"] < 512, seen
    # Timed in the page, from the click event to the summary saying "Stopped" (playwright's own
    # polling of a busy page adds up to half a second that a visitor does not wait).
    assert 0 < seen["page_s"] < 1.0, seen
    # The finished strip's 40 rows scroll; it opens on the newest, as the pane does once it scrolls.
    assert seen["newest"]["strip"] == {"scrolls": True, "in_view": True}, seen
    assert seen["newest"]["pane"]["in_view"], seen


STEP_REPLY_DELAY_S = 2.0
# The replayed run's clocks are stretched this much: on a busy 2-core CPU chromium fell 10 s behind
# the stream while painting its frames, and the replay must not end before Pause lands.
SLOWER = 10


def _stretched(value, factor: float):
    """A trace with every recorded duration `factor` times as long (its rates divided by it)."""
    if isinstance(value, dict):
        return {k: (v / factor if k.endswith(("per_s", "tok_s")) else v * factor)
                if k.endswith("_s") and isinstance(v, (int, float)) and not isinstance(v, bool)
                else _stretched(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [_stretched(v, factor) for v in value]
    return value


def _reply_late(handler, delay_s: float):
    """`handler` acting at once but answering `delay_s` later, as a busy CPU delays a reply."""

    @functools.wraps(handler)  # Gradio reads the signature to pass the gr.Request
    def late(*args, **kwargs):
        result = handler(*args, **kwargs)
        time.sleep(delay_s)
        return result

    return late


@pytest.fixture(scope="module")
def replay_url(tiny_dirs, request, tmp_path_factory):
    """An app with no model: the shipped traces offered on its landing page, else (a repository
    without them) one recorded here on the tiny pair, preselected (never the default target's weights).

    Its Step button answers late, after the frame of the stepped cycle, as on a busy CPU: the next
    click must count even while the previous one's reply is still on its way.
    """
    from serve import free_port

    from app.serve.replay import shipped_traces
    from app.serve.stepping import Stepping
    from app.ui import build_demo

    shipped = shipped_traces()
    path = shipped[0][0] if shipped else record_tiny_trace(tiny_dirs, request)
    slow = tmp_path_factory.mktemp("slow") / path.name
    slow.write_text(json.dumps(_stretched(json.loads(path.read_text()), SLOWER)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Stepping, "step", _reply_late(Stepping.step, STEP_REPLY_DELAY_S))
        patch.setattr("app.ui.shipped_traces", lambda: [(slow, f"{path.stem}, {SLOWER}x slower")])
        # No replay on page load: the test starts one itself (a page-load replay is what --replay adds).
        demo = build_demo([], "", None, replay=None, live=False)
        demo.queue().launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
        yield demo.local_url
        demo.close()


def record_tiny_trace(tiny_dirs, request) -> Path:
    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair
    from app.ui import App
    from app.view.frames import FRAME_FIELDS

    request.getfixturevalue("one_thread")
    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    *_, last = App([spec], spec.id, PairCache("cpu")).live.compare("What is the capital of France?", 48, 4, 0.0, 1.0, 0)
    return Path(dict(zip(FRAME_FIELDS, last))["trace_file"])


def test_browser_replays_pauses_steps_and_explains_a_rejected_draft(replay_url):
    from browser import replay_in_browser

    seen = replay_in_browser(replay_url, ARTIFACTS, steps=3)
    paused = seen["paused_at"]
    assert seen["still_paused_at"] == paused  # nothing moves while paused
    assert seen["after_steps"] == [paused + 1, paused + 2, paused + 3]  # one DFlash cycle per Step
    # The cycle view follows the current cycle: the last one stepped to (cycles count from 1).
    assert seen["cycle_title"].startswith(f"Cycle {paused + 3} of {paused + 3} ")
    for part in ("noisy block", "injected into every drafter layer", "single pass", "where the time went", "one plain decoding step"):
        assert part in seen["cycle_text"]
    # The hover box of a rejected draft: block and slot, both top-k lists, and why.
    tip = seen["tip_text"]
    assert "cycle " in tip and "slot " in tip and "rejected draft token" in tip
    assert "drafter top-5" in tip and "target top-5" in tip and "Rejected:" in tip
    assert seen["tip_rows"] >= 6 and "%" in tip
    assert seen["tip_inside_window"]  # placed in the window, not clipped by the scrolling strip
    assert "Playing" in seen["control_status"]
    for name in ("replay-paused.png", "inside-a-cycle.png", "hover-rejected.png"):
        assert (ARTIFACTS / name).stat().st_size > 5_000


@pytest.mark.slow
def test_browser_steps_a_paused_replay_from_cycle_one_with_the_keyboard(replay_url):
    from browser import step_replay_with_keys

    before, *forward, back2, back1, on2, on3, on4, playing = step_replay_with_keys(replay_url)
    assert before["status"].startswith("Paused before cycle 1") and before["bonus"] == 0 and not before["strip"]
    for k, seen in enumerate([*forward, on4], start=1):  # every place numbers the cycle on screen the same way
        assert seen["status"].startswith(f"Paused after cycle {k}: Step (→) shows cycle {k + 1}")
        assert seen["bonus"] == k and seen["strip"].startswith(f"#{k} · ")
        assert seen["title"].startswith(f"Cycle {k} of {k} ") and seen["picker"] == str(k)
        assert " drafts: " in seen["title"] and " kept + 1 bonus" in seen["title"]
    # Back to cycles 2 and 1 and on again: the panes of both lanes show the race as it was paused at
    # that cycle, and the status, the strip, the cycle view and the picker number it the same.
    for k, seen in ((2, back2), (1, back1), (2, on2), (3, on3)):
        then = forward[k - 1]
        assert seen["dflash_text"] == then["dflash_text"] and seen["plain_text"] == then["plain_text"]
        assert seen["bonus"] == k and seen["strip"].startswith(f"#{k} · ") and seen["picker"] == str(k)
        assert seen["title"].startswith(f"Cycle {k} of 3 ")
        assert seen["status"].startswith(f"Back at cycle {k} of 3: every pane shows the race after it" if k < 3
                                         else "Paused after cycle 3: Step (→) shows cycle 4")
    assert forward[0]["plain_text"] != forward[2]["plain_text"]  # the plain pane moved with the cycles
    assert playing["bonus"] >= 4 and "Paused" not in playing["status"]


@pytest.mark.slow
def test_browser_what_if_model_redraws_from_its_sliders_without_the_server(replay_url):
    from browser import move_whatif

    seen = move_whatif(replay_url)
    curves = [[float(x) for x in seen[key].split(",")] for key in ("start", "wi-a", "wi-v", "gpu")]
    assert all(len(c) == 16 and c[0] == 1.0 for c in curves)  # B = 1: no drafting, plain speed
    start, more_accepted, dearer_verify, gpu = curves
    assert more_accepted[15] > start[15]  # a = 0.8 against 0.5 at B = 16
    assert dearer_verify[15] < more_accepted[15] and max(dearer_verify) > dearer_verify[15]  # a peak, then down
    assert gpu[15] > 4 and seen["sliders"] == {"wi-a": "0.86", "wi-v": "1", "wi-c": "0.15"}
    assert f"{gpu[15]:.2f}×" in seen["readout"]
    assert seen["requests"] == []  # drawn in the page


@pytest.mark.slow
def test_browser_step_when_idle_starts_paused_and_the_page_switches_work(replay_url):
    from browser import step_when_idle_and_switches

    seen = step_when_idle_and_switches(replay_url)
    assert seen["idle_step"] == ("Paused before cycle 1: Step (→) shows cycle 1, Continue (space) plays.", 0)
    assert seen["step"][0].startswith("Paused after cycle 1:") and seen["step"][1] == 1
    assert seen["token_px"] >= 20 and "154, 103, 0" in seen["bar"]  # a bonus token's bar: #9a6700
    assert seen["area_under_howto"] is False


@pytest.mark.slow
def test_browser_each_tab_shows_only_its_own_outputs(app_url):
    from browser import tabs_own_outputs

    from app.serve.examples import EXAMPLES

    seen = tabs_own_outputs(app_url)
    assert seen["prompt"] == EXAMPLES[0][0]  # the page opens ready to race: Race ▶ is the first click
    assert seen["replayed_tokens"] > 0 and seen["area_under_howto"] is False
    assert seen["kept_under_replay"] == seen["replayed_tokens"]  # back on its own tab, the replay is kept
    assert seen["live_tokens"] == 0 and "Run a prompt" in seen["live_summary"] and seen["live_status"] == ""
    # A pin belongs to its tab: shown under Replay (even after its run was cleared), never under Live race.
    assert seen["pin_under_replay"] and not seen["pin_under_live"] and seen["pin_back_under_replay"]


@pytest.mark.slow
def test_browser_pins_a_finished_race_and_races_again_beside_it(lessons_url):
    from browser import pin_and_race_again

    seen = pin_and_race_again(lessons_url, ARTIFACTS / "pinned.png")
    assert seen["pin_before"] is False  # Pin shows once a run has ended
    pinned = seen["pinned"]
    assert pinned.startswith("Pinned race · recording code-greedy · block 4, T=0 · “Write a Python function")
    # The pinned race's numbers are its own summary's, its text its own DFlash pane's.
    speedup = re.search(r"speedup\s+([0-9.]+)×", seen["first_summary"]).group(1)
    tau = re.search(r"tau \(mean acceptance length\)\s+([0-9.]+)", seen["first_summary"]).group(1)
    assert re.search(rf"DFlash\s+[0-9.]+\s+{tau}\s+{speedup}×", pinned), pinned
    for lane in ("AR drafter", "prompt lookup", "plain decoding"):
        assert lane in pinned
    assert seen["pinned_text"] == seen["first_text"]
    # Beside it, the block-16 race of the same prompt: the same text (temperature 0), cut into other cycles.
    assert "DFlash (block 16" in seen["dflash_stats"] and seen["dflash_text"] == seen["first_text"]
    assert seen["cycles"][0] != seen["cycles"][1] and min(seen["cycles"]) > 0
    assert seen["side_by_side"] and seen["pinned_after_unpin"] is False


@pytest.mark.slow
def test_browser_each_lesson_opens_from_one_click(lessons_url):
    from browser import open_lessons

    from app.serve.lessons import END, LESSONS

    seen = open_lessons(lessons_url, tuple(lesson.key for lesson in LESSONS))
    for lesson in LESSONS:
        got, first = seen[lesson.key], lesson.stops[0].cycle
        assert got["callout"].startswith(f"Lesson: {lesson.title} · stop 1 of {len(lesson.stops)}")
        assert "recorded by this app on cpu" in got["callout"]
        if first == END:
            assert got["status"].startswith("Finished")
        else:  # held at its first stop, numbered the same in the status and the panes
            assert got["status"].startswith(f"Paused after cycle {first}:") and got["bonus"] == first


@pytest.fixture(scope="module")
def lessons_url():
    """An app with no model offering the shipped recordings (the lessons need them), each lesson
    replayed at the fastest speed the app allows: the lessons that stop at the end play a whole
    recording, and the flow, not the pace, is under test."""
    from serve import free_port

    from app.serve import lessons
    from app.serve.playback import MAX_SPEED
    from app.serve.replay import shipped_traces
    from app.ui import build_demo

    if not shipped_traces():
        pytest.skip("no shipped traces")
    with pytest.MonkeyPatch.context() as patch:
        for key, lesson in lessons.BY_KEY.items():
            patch.setitem(lessons.BY_KEY, key, dataclasses.replace(lesson, speed=MAX_SPEED))
        patch.setattr("app.ui.shipped_traces", shipped_traces)  # `replay_url` may have put one slow trace there
        demo = build_demo([], "", None, replay=None, live=False)
        demo.queue().launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
        yield demo.local_url
        demo.close()
