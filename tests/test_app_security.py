"""A shared server that strangers cannot hurt (the first attack): each finding of the review, as a test.

Crafted traces are checked before any work and cost at most a multiple of their size; a visitor
never reads or replays another's trace; a hostile report never reaches the page as markup; a
paused race lets the model go; replays have their own slots and a real-time cap; uploads are
bounded and deleted; errors name the field and never a server path. In-process, on the shipped
traces and the tiny pair; the server-level cases run against a replay-only app on loopback.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import httpx
import pytest
from fake_runs import run_events

from app.guard.limits import Limits, check_request
from app.race.control import Control, Controls
from app.race.interleave import race
from app.race.report import RaceReport
from app.serve.replay import ReplayError, load_trace
from app.ui import App, build_demo
from app.view import render
from app.view.frames import FRAME_FIELDS
from dflash_core import trace as tr
from dflash_core.lossless import Verdict

# What this issue added (PAUSE_EXPIRED, ReplaySlots, launch_options, ...) is imported in the tests
# that use it, so that the others run, and fail for the reasons the review found, on the code before.

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "assets" / "traces" / "math-greedy.json"


@pytest.fixture(scope="module")
def shipped() -> dict:
    return json.loads(SHIPPED.read_text())


def crafted(shipped, edit, tmp_path, name="crafted.json") -> str:
    data = copy.deepcopy(shipped)
    edit(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def within(seconds: float, fn):
    """fn()'s result, or a failure once `seconds` have passed (the work goes on in a daemon thread)."""
    out = {}

    def work():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def final(frames) -> dict:
    *_, last = frames
    return dict(zip(FRAME_FIELDS, last))


def app_of(demo) -> App:
    """The demo's App (the object whose `end_session` the page's unload calls)."""
    return next(f.fn.__self__ for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "end_session")


def d_block(t, i=0):
    return t["runs"]["dflash"]["blocks"][i]


# --- 1. a small upload that sizes work: refused before any work ---------------------------------------
def test_a_huge_block_size_without_a_report_is_refused_at_once(shipped, tmp_path):
    def edit(t):
        t["runs"]["dflash"]["block_size"] = 10**7
        t.pop("report")

    path = crafted(shipped, edit, tmp_path)
    with pytest.raises(gr.Error, match=r"trace.runs.dflash.block_size is 10000000; it must be from 1 to 1024"):
        within(20, lambda: list(App([], "", None).playback.replay(path, None, 4.0)))


SIZING = {  # each field that sizes a replay's work, set past what the file holds
    "accepted": (lambda t: d_block(t).update(accepted=10**6), "blocks[0].accepted is 1000000; a block of 3 verified drafts"),
    "index": (lambda t: d_block(t, 1).update(index=10**9), "blocks[1].index is 1000000000"),
    "position": (lambda t: d_block(t).update(position=10**12), "blocks[0].position is 1000000000000"),
    "drafts": (lambda t: d_block(t)["draft_ids"].extend([1] * 50), "blocks[0].draft_ids holds 53 drafts"),
    "committed": (lambda t: d_block(t)["committed_ids"].extend([1] * 50), "committed_ids must be the accepted"),
    "output": (lambda t: t["runs"]["plain"]["output_ids"].extend([1] * 50), "plain.output_ids must be the prefill"),
    "prompt_len": (lambda t: t["runs"]["plain"].update(prompt_len=10**9), "plain.prompt_len is 1000000000"),
    "plain block size": (lambda t: t["runs"]["plain"].update(block_size=4), "plain.block_size is 4"),
    "top-k rows": (lambda t: d_block(t)["explain"]["target_topk"].extend([[]] * 40), "target_topk has 44 entries"),
    "verdict slots": (lambda t: d_block(t)["explain"]["decision"]["slots"][0].update(slot=99),
                      "decision.slots must name draft slots 1 to 3"),
    "clock backwards": (lambda t: d_block(t, 2).update(elapsed_s=0.0), "blocks[2].elapsed_s is 0.0, earlier"),
    "settings block size": (lambda t: t["settings"].update(block_size=10**9), "settings.block_size is 1000000000"),
    "pieces": (lambda t: t["pieces"]["plain"].extend(["x"] * 10), "pieces.plain has 138 entries for 128"),
}


@pytest.mark.parametrize("field", SIZING)
def test_every_count_that_sizes_work_is_checked_against_the_file(shipped, field):
    edit, message = SIZING[field]
    data = copy.deepcopy(shipped)
    edit(data)
    with pytest.raises(tr.TraceError) as caught:
        tr.validate_trace(json.dumps(data).encode())
    assert message in str(caught.value)


def test_charts_and_the_speedup_model_cost_grows_with_the_blocks_not_their_square():
    from app.race.interleave import SideView
    from app.view import charts
    from app.view.speedup import speedup_figure
    from dflash_core import Summary

    *_, dflash = run_events(0.1, 0.01, 3, 60_000, 4)
    *_, plain = run_events(0.1, 0.005, 1, 60_000, 1)
    view = SideView("dflash", dflash.prefill, dflash.blocks, dflash, dflash.total_s, 4)
    t0 = time.perf_counter()
    lanes = {"dflash": view, "ar": view, "lookup": view}
    within(30, lambda: (charts.acceptance_figure(lanes), charts.histogram_figure(lanes), charts.position_figure(lanes)))
    big = Summary(dflash.output_ids, 3, tr.MAX_BLOCK_SIZE, "max_new_tokens", dflash.prefill, dflash.blocks[:10], 1.0)
    within(30, lambda: speedup_figure({"dflash": big, "ar": big}, plain, {"dflash": 1.5, "ar": 1.2}))
    assert time.perf_counter() - t0 < 10


# --- 2. traces are private to their session ---------------------------------------------------------
@pytest.fixture()
def demo():
    demo = build_demo([], "", None, live=False)
    yield demo
    app_of(demo).traces.close()


def test_trace_files_live_outside_every_folder_gradio_serves_under_unguessable_names(demo, shipped):
    from gradio.utils import get_cache_folder, get_upload_folder

    store = app_of(demo).traces
    served = Path(get_upload_folder())
    assert not store.root.is_relative_to(served) and not store.root.resolve().is_relative_to(get_cache_folder().resolve())
    assert store.root.stat().st_mode & 0o077 == 0  # only the server's own user may read it
    handed = [Path(store.write("alice", shipped)) for _ in range(2)]
    for path in handed:  # the copy handed out: in the served folder, under 128 random bits
        assert path.is_relative_to(served) and path.name == "dflash_trace.json"
        assert len(path.parent.name) == 32 and int(path.parent.name, 16) >= 0
        assert path.with_suffix(".csv").is_file()
    assert handed[0].parent.name != handed[1].parent.name
    private = store.files()
    assert len(private) == 2 and all(p.is_relative_to(store.root) for p in private)
    assert {p.parent.name for p in private}.isdisjoint({p.parent.name for p in handed})
    store.end_session("alice")  # the tab closed: the copies handed out go too
    assert not any(p.exists() for p in handed) and not store.files()


def test_closing_the_page_ends_its_race_before_the_trace_files_its_last_frame_names_go(demo, shipped):
    app = app_of(demo)
    handed = Path(app.traces.write("carol", shipped))
    running, seen = threading.Event(), []

    def last_frame():  # a race that has just sent its last frame, which names `handed`
        with app.live.stops.running("carol") as stop:
            running.set()
            stop.wait(5)
            time.sleep(0.2)  # Gradio reads the files a frame names after the race has yielded it
            seen.append(handed.exists())

    race_thread = threading.Thread(target=last_frame)
    race_thread.start()
    running.wait(5)
    app.end_session(SimpleNamespace(session_hash="carol"))
    race_thread.join(5)
    assert seen == [True] and not handed.exists()


def test_one_session_can_neither_replay_nor_claim_another_sessions_trace(demo, shipped):
    app = app_of(demo)
    alices = app.traces.write("alice", shipped)
    bob, alice = SimpleNamespace(session_hash="bob"), SimpleNamespace(session_hash="alice")
    with pytest.raises(gr.Error, match="belongs to another visitor's session"):
        list(app.playback.replay(None, alices, 4.0, bob))
    with pytest.raises(gr.Error, match="unknown recorded run '/etc/passwd'"):
        list(app.playback.replay("/etc/passwd", None, 4.0, bob))  # a recorded run is named, never a path
    assert "Replaying" in str(next(app.playback.replay(None, alices, 4.0, alice))[0])


# --- 3. a hostile report never reaches the page as markup ----------------------------------------------
HOSTILE = "<img src=x onerror=alert(1)>"


def test_a_report_with_markup_in_a_number_field_is_refused_naming_the_field(shipped, tmp_path):
    path = crafted(shipped, lambda t: t["report"].update(first_difference=HOSTILE), tmp_path)
    with pytest.raises(ReplayError, match="trace.report.first_difference must be int >= 0 or null, got '<img"):
        load_trace(path)
    path = crafted(shipped, lambda t: t["report"]["lossless"].update(kind="<b>bug</b>"), tmp_path)
    with pytest.raises(ReplayError, match="report.lossless.kind must be one of identical, near_tie, diverged"):
        load_trace(path)


def test_the_summary_escapes_every_value_it_shows_even_one_no_check_caught():
    verdict = Verdict("near_tie", position=HOSTILE, top2_margin="<svg onload=alert(2)>", dtype="<script>x</script>")
    fields = dict(
        stopped=False, tau="<b>tau</b>", speedup="<iframe>", identical=False, first_difference=HOSTILE, lossless=verdict,
        dflash_tok_s=1.0, plain_tok_s=1.0, dflash_ttft_s="<u>", plain_ttft_s=0.1, dflash_tokens=1, plain_tokens=1,
        dflash_s=1.0, plain_s=1.0, cycles=1, block_size=4, temperature=0.0, acceptance_histogram=[],
        per_position_acceptance=[],
    )
    for report in (RaceReport(**fields), RaceReport(**{**fields, "lossless": None})):
        page = render.summary_html(report, note=HOSTILE)
        for tag in ("<img", "<svg", "<script", "<b>", "<iframe", "<u>"):
            assert tag not in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_an_error_that_quotes_markup_shows_it_as_text(shipped, tmp_path, tiny_app):
    # Gradio renders an error's message as HTML (scripts stripped, an <img> of any address kept).
    path = crafted(shipped, lambda t: t["report"].update(first_difference=HOSTILE), tmp_path)
    with pytest.raises(gr.Error) as caught:
        list(App([], "", None).playback.replay(path, None, 1.0))
    assert "<img" not in caught.value.message
    assert "got '&lt;img src=x onerror=alert(1)&gt;'" in caught.value.message
    with pytest.raises(gr.Error) as caught:  # a live request's message quotes the visitor's value too
        list(tiny_app.live.compare("hi", HOSTILE, 4, 0.0, 1.0, 0))
    assert caught.value.message == "max_new_tokens must be a number, got '&lt;img src=x onerror=alert(1)&gt;'."


# --- 4. a pause has a deadline, and eviction wakes the race ------------------------------------------
def _paused_race(control):
    control.pause(0)
    return race({"dflash": run_events(0.1, 0.2, 3, 6, 4), "plain": run_events(0.1, 0.1, 1, 18, 1)},
                block_sizes={"dflash": 4}, frame_s=0.0, speed=4.0, control=control)


def test_a_paused_race_is_released_after_the_deadline_and_says_why():
    from app.race.control import PAUSE_EXPIRED

    frames = _paused_race(Control(max_pause_s=0.3))
    assert next(frames).paused
    t0 = time.perf_counter()
    rest = within(10, lambda: list(frames))
    assert rest[-1].stopped and rest[-1].released == PAUSE_EXPIRED and time.perf_counter() - t0 < 5
    assert all(s.idle for s in rest[:-1])  # only keep-alives while it waited


def test_eviction_from_the_controls_table_wakes_the_paused_race():
    controls = Controls(size=2)
    frames = _paused_race(controls.get("pauser"))
    assert next(frames).paused
    ended = {}
    worker = threading.Thread(target=lambda: ended.setdefault("last", list(frames)[-1]), daemon=True)
    worker.start()
    controls.get("b"), controls.get("c")  # the pauser is the oldest: evicted
    worker.join(10)
    assert not worker.is_alive(), "the evicted race is still paused"
    from app.race.control import EVICTED

    assert ended["last"].stopped and ended["last"].released == EVICTED


@pytest.fixture(scope="module")
def tiny_app(tiny_dirs, one_thread):
    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair

    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    return App([spec], spec.id, PairCache("cpu"))


def test_a_live_race_left_paused_frees_the_model_and_says_so(tiny_app):
    tiny_app.controls.max_pause_s = 1  # what --max-pause-s 1 gives
    request = SimpleNamespace(session_hash="pauser")
    frames = tiny_app.live.compare("What is the capital of France?", 24, 4, 0.0, 1.0, 0, None, None, request)
    frame = {}
    while "tok-bonus" not in str(frame.get("dflash_tokens")):
        frame = dict(zip(FRAME_FIELDS, next(frames)))
    tiny_app.stepping.pause(request)
    t0 = time.perf_counter()
    last = final(within(30, lambda: list(frames)))
    assert time.perf_counter() - t0 < 10
    assert "paused for 1 s in all" in last["summary"] and "Ended" in last["control_status"]
    assert last["report"]["stopped"] is True
    pair = tiny_app.cache.get(tiny_app.pairs[tiny_app.default_id])
    assert pair.lock.acquire(timeout=5)  # the model is free for the next visitor
    pair.lock.release()


# --- 5. replays: a real-time cap and slots of their own ------------------------------------------------
def test_a_replay_clock_is_capped_and_the_replay_says_so(shipped, tmp_path):
    def edit(t):
        for run in t["runs"].values():
            run["blocks"][-1]["elapsed_s"] = run["total_s"] = 1e12

    path = crafted(shipped, edit, tmp_path)
    app = App([], "", None)
    app.playback.limits = SimpleNamespace(**{**vars(Limits()), "max_replay_s": 2})  # --max-replay-s 2
    t0 = time.perf_counter()
    last = final(within(30, lambda: list(app.playback.replay(path, None, 4.0))))
    assert time.perf_counter() - t0 < 15
    assert "replay limit (--max-replay-s)" in last["summary"]


def test_replays_have_their_own_slots_and_line_and_say_when_both_are_full(shipped):
    demo = build_demo([], "", None, live=False)
    try:  # Gradio starts every replay at once (not one at a time, its default): the slots bound them
        replay = next(f for f in demo.fns.values() if f.api_name == "replay")
        assert replay.concurrency_limit is None and replay.concurrency_id == "replay"
    finally:
        app_of(demo).traces.close()
    from app.serve.playback import ReplayBusy, ReplaySlots

    slots = ReplaySlots(concurrency=1, queue=1)
    slots.join()
    assert slots.wait(0.1)  # playing
    slots.join()  # waiting
    with pytest.raises(ReplayBusy, match="1 replays are playing and 1 waiting"):
        slots.join()
    assert not slots.wait(0.1)
    slots.leave(playing=True)
    assert slots.wait(0.1)
    app = App([], "", None, Limits(replay_concurrency=1, replay_queue=1))
    playing, waiting = (app.playback.replay(str(SHIPPED), None, 0.25, SimpleNamespace(session_hash=s)) for s in "ab")
    assert "Replaying" in next(playing)[0]
    assert "Waiting for a free replay slot (1 replays are playing)" in next(waiting)[0]
    with pytest.raises(gr.Error, match="The server is busy: 1 replays are playing and 1 waiting"):
        next(app.playback.replay(str(SHIPPED), None, 0.25, SimpleNamespace(session_hash="c")))
    playing.close()  # the slot is given back when its stream ends
    assert "Replaying" in next(waiting)[0]
    waiting.close()


# --- 6. MCP is off on a Space unless turned on --------------------------------------------------------
def test_mcp_is_off_on_a_space_unless_turned_on(monkeypatch):
    import importlib.util

    import app as app_package  # noqa: F401  (the package; app.py is the launcher)

    spec = importlib.util.spec_from_file_location("launcher", REPO / "app.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    launched = {}

    class FakeDemo:
        dflash_app = App([], "", None)  # what launch_options reads: its traces, limits and readers

        def launch(self, **kwargs):
            launched.update(kwargs)
            launched["events"] = ["launched"]

        def block_thread(self):
            launched["events"].append("served")

    class FakeCache:
        def load_in_background(self, spec):
            launched["events"].append(f"loading {spec.id}")

    import app.hosting.space
    import app.pairs.models
    import app.ui

    monkeypatch.setenv("SPACE_ID", "someone/dflash-studio")
    from gradio.utils import get_upload_folder  # main() gives the server a folder of its own: keep this one

    monkeypatch.setenv("GRADIO_TEMP_DIR", get_upload_folder())
    monkeypatch.setattr(app.hosting.space, "install_default_target", lambda: None)
    monkeypatch.setattr(app.pairs.models, "PairCache", lambda *a, **k: FakeCache())
    monkeypatch.setattr(app.ui, "build_demo", lambda *a, **k: FakeDemo())
    monkeypatch.setattr("signal.signal", lambda *a: None)
    import torch

    threads = torch.get_num_threads()  # main() sets them
    try:
        launcher.main([])
        assert launched["mcp_server"] is False
        # Not ZeroGPU: the default pair starts loading once the server answers, before it serves on.
        assert launched["events"] == ["launched", "loading smollm2-135m", "served"]
        monkeypatch.setenv("GRADIO_MCP_SERVER", "True")
        launcher.main([])
        assert launched["mcp_server"] is True
    finally:
        torch.set_num_threads(threads)


# --- 8. clear errors -----------------------------------------------------------------------------------
HUGE = 10**400


@pytest.mark.parametrize("index, name", [(1, "max_new_tokens"), (2, "block_size"), (3, "temperature"), (4, "top_p"),
                                         (5, "seed")])
def test_a_400_digit_number_is_named_in_the_message(index, name):
    args = ["hi", 8, 4, 0.0, 1.0, 0]
    args[index] = HUGE
    with pytest.raises(ValueError) as caught:
        check_request(Limits(), "pair", *args)
    assert str(caught.value).startswith(name) and "401-digit integer" in str(caught.value)


def test_deeply_nested_json_is_a_clear_error():
    with pytest.raises(tr.TraceNotJSONError, match="the trace is nested too deeply to be a trace"):
        tr.validate_trace(b'{"schema": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


BAD_TRACES = {
    "report without its keys": (lambda t: t.update(report={"tau": 1.5}), "trace.report lacks speedup, identical"),
    "temperature hot": (lambda t: t["settings"].update(temperature="hot"),
                        "field trace.settings.temperature must be int or float, got str: 'hot'"),
    "accepted a million": (lambda t: d_block(t).update(accepted=10**6),
                           "trace.runs.dflash.blocks[0].accepted is 1000000; a block of 3 verified drafts accepts 0 to 3"),
    "token key not an id": (lambda t: t["tokens"].update(abc="x"), "trace.tokens key 'abc' is not a token id"),
    "huge token id": (lambda t: t["runs"]["plain"]["output_ids"].append(HUGE), "['a 401-digit integer'] are outside"),
}


@pytest.mark.parametrize("case", BAD_TRACES)
def test_each_bad_trace_gets_its_own_message_naming_the_field(shipped, tmp_path, case):
    edit, message = BAD_TRACES[case]
    path = crafted(shipped, edit, tmp_path)
    with pytest.raises(gr.Error) as caught:
        list(App([], "", None).playback.replay(path, None, 1.0))
    assert message in str(caught.value) and "unexpected" not in str(caught.value)


def test_the_token_limit_message_is_the_limit_not_an_unexpected_error(tiny_app):
    bounded = App(list(tiny_app.pairs.values()), tiny_app.default_id, tiny_app.cache, Limits(max_prompt_tokens=3))
    with pytest.raises(gr.Error) as caught:
        list(bounded.live.compare("a much longer prompt than three tokens can hold, by far", 4, 4, 0.0, 1.0, 0))
    assert str(caught.value).strip("'\"").startswith("The prompt is") and "unexpected" not in str(caught.value)


# --- 9. no server paths, one endpoint name -------------------------------------------------------------
def test_messages_name_a_trace_file_never_the_folder_it_is_in(tmp_path):
    folder = tmp_path / "deep" / "server" / "folder"
    folder.mkdir(parents=True)
    (folder / "bad.json").write_text("{not json")
    for path in (folder / "bad.json", folder / "missing.json"):
        with pytest.raises(ReplayError) as caught:
            load_trace(path)
        assert str(folder) not in str(caught.value) and path.name in str(caught.value)


def test_the_api_info_shows_no_server_path_and_replay_keeps_its_name():
    demo = build_demo([], "", None, replay=str(SHIPPED), live=False)
    try:
        info = json.dumps(demo.get_api_info(all_endpoints=True))
        assert str(REPO) not in info and tempfile.gettempdir() + "/" not in info
        assert sorted(demo.get_api_info(all_endpoints=True)["named_endpoints"]) == ["/replay"]
    finally:
        app_of(demo).traces.close()


# --- 2, 7. the same against a served app: fetches, uploads, shutdown ------------------------------------
@pytest.fixture()
def served():
    from serve import free_port

    from app.ui import launch_options

    demo = build_demo([], "", None, live=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo))
    yield demo
    demo.close()


def test_a_served_app_hands_out_only_unguessable_copies_bounds_uploads_and_cleans_up(served, shipped):
    store = app_of(served).traces
    base = served.local_url.rstrip("/") + "/gradio_api"
    handed = store.write("alice", shipped)
    with httpx.Client(timeout=30) as http:
        assert http.get(f"{base}/file={handed}").status_code == 200  # the session's own link works
        for private in store.files():  # the store itself is served to nobody
            assert http.get(f"{base}/file={private}").status_code == 403
        guessed = Path(handed).parent.parent / "000001" / "dflash_trace.json"  # the old counter names
        assert http.get(f"{base}/file={guessed}").status_code == 403
        too_big = http.post(f"{base}/upload", files={"files": ("big.json", b"x" * (tr.MAX_BYTES + 1))})
        assert too_big.status_code == 413
        # A URL in place of the upload: refused, never fetched (nothing listens on port 9 anyway).
        url = {"path": "http://127.0.0.1:9/trace.json", "meta": {"_type": "gradio.FileData"}}
        event = http.post(f"{base}/call/replay", json={"data": ["math-greedy", url, 4.0]}).json()["event_id"]
        assert "does not download URLs" in http.get(f"{base}/call/replay/{event}").text
    assert served.delete_cache == (600, 3600)
    root = store.root
    served.close()
    assert not root.exists() and not Path(handed).exists()  # deleted at shutdown, the copy too


def test_sigterm_stops_the_app_and_its_trace_files_go(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from serve import free_port

    port = free_port()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("GRADIO_TEMP_DIR", None)
    proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--replay", str(SHIPPED), "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/gradio_api/info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        roots = list(tmp_path.glob("dflash-traces-*"))
        assert len(roots) == 1
        (roots[0] / "left-over").mkdir()  # as a race's folder would be
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not roots[0].exists()
    finally:
        proc.kill()


# --- the second attack: what one replay frame may cost --------------------------------------------------
# Crafted traces come from scripts/load_attacks.py, the ones the load test sends a served app. The
# budgets (app/view/budget.py) and the pacing are imported in the tests that use them.
@pytest.fixture(scope="module")
def crafting():
    import importlib.util

    spec = importlib.util.spec_from_file_location("load_attacks", REPO / "scripts" / "load_attacks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def html_bytes(frame) -> int:
    """The bytes of HTML a frame sends (its text outputs; the charts are paced by their blocks)."""
    return sum(len(value.encode()) for value in frame if isinstance(value, str))


def replayed(data: dict, tmp_path, max_replay_s: int = 2, session: str = "visitor"):
    """(app, [(seconds since the start, frame)]) of a replay of `data` at 4x, capped at `max_replay_s`."""
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(data))
    app = App([], "", None, Limits(max_replay_s=max_replay_s))
    t0 = time.perf_counter()
    frames = within(120, lambda: list(app.playback.replay(str(path), None, 4.0, SimpleNamespace(session_hash=session))))
    return app, frames, time.perf_counter() - t0


def test_every_replay_frame_stays_within_its_byte_budget_at_the_longest_texts_and_the_widest_blocks(
        shipped, tmp_path, crafting):
    from app.view.budget import FRAME_BYTES

    longest = crafting.long_texts(shipped, tr.MAX_TOKEN_CHARS)  # every text at the bound, escaped at most cost
    _, frames, _ = replayed(longest, tmp_path)
    assert max(map(html_bytes, frames)) <= FRAME_BYTES  # was 28.5 MB: the final frame repeated every text
    last = final(frames)
    assert "earlier tokens not drawn" in last["dflash_tokens"] and "earlier tokens not drawn" in last["plain_tokens"]
    widest = crafting.wide_blocks(shipped, tr.MAX_BLOCK_SIZE, 40)  # 1,023 drafts a cycle
    _, frames, _ = replayed(widest, tmp_path)
    assert max(map(html_bytes, frames)) <= FRAME_BYTES  # was 10.7 MB at 20 cycles
    assert "more drafts not drawn" in final(frames)["dflash_strip"]


def test_a_replay_is_paced_by_the_bytes_it_draws(shipped, tmp_path, crafting):
    from app.serve.playback import BYTES_DRAWN_PER_S

    seen = []
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(crafting.long_texts(shipped, tr.MAX_TOKEN_CHARS)))
    app = App([], "", None, Limits(max_replay_s=3))
    for frame in app.playback.replay(str(path), None, 4.0, SimpleNamespace(session_hash="pacer")):
        seen.append((time.perf_counter(), html_bytes(frame)))
    assert len(seen) >= 4
    # A frame of n bytes: the next one n / rate later (measured where the frames arrive, so give
    # or take the difference between two frames' drawing times), and so over the whole replay.
    for (sent, size), (after, _) in itertools.pairwise(seen):
        assert after - sent >= size / BYTES_DRAWN_PER_S - 0.05, (size, after - sent)
    assert seen[-1][0] - seen[0][0] >= sum(size for _, size in seen[:-1]) / BYTES_DRAWN_PER_S - 0.05


def cycle_view_of(answer) -> str:
    """The cycle view in a cycle picker's answer (`stepping.look_at`: the follow checkbox, then the race's outputs)."""
    return answer[1 + FRAME_FIELDS.index("cycle_view")]


def test_the_cycle_picker_answers_within_its_budget_whatever_the_cycle(shipped, tmp_path, crafting):
    from app.view.budget import CYCLE_BYTES
    from app.view.lane_cycles import ar_cycle_html, lookup_cycle_html

    for data in (crafting.wide_blocks(shipped, tr.MAX_BLOCK_SIZE, 20, explained=20),
                 crafting.long_texts(shipped, tr.MAX_TOKEN_CHARS)):
        app, _, _ = replayed(data, tmp_path, session="picker")
        request = SimpleNamespace(session_hash="picker")
        answers = [cycle_view_of(app.stepping.pick_cycle(index, request)) for index in (0, 1, 5, 10**6)]
        answers.append(cycle_view_of(app.stepping.follow_latest(True, request)))
        assert all("Cycle " in a and len(a.encode()) <= CYCLE_BYTES for a in answers)  # was 0.73 MB at block 1024
        # The AR drafter's and prompt lookup's views of the same cycles (the widest lanes they could record).
        viewer = app.controls.find("picker").viewer
        snap = viewer.latest
        for index in (0, 1, 10**6):
            for view in (ar_cycle_html(snap.dflash, snap.plain, snap.dflash, index, viewer.text_of),
                         lookup_cycle_html(snap.dflash, snap.plain, index, viewer.text_of, viewer.prompt_ids)):
                assert "Cycle " in view and len(view.encode()) <= CYCLE_BYTES
    assert "more slots not drawn" in answers[0] or "more slots not drawn" in cycle_view_of(app.stepping.pick_cycle(0, request))


def test_a_long_races_final_frame_keeps_its_hover_boxes_within_budget(shipped, tmp_path, crafting):
    """Item 4: a final frame (which Gradio keeps per session) carried every token's hover box."""
    from app.view.budget import PANE_TIPS_BYTES

    data = crafting.tiled(shipped, 4)  # 509 tokens, about the app's most (512)
    _, frames, _ = replayed(data, tmp_path, max_replay_s=3)
    last = final(frames)
    assert html_bytes(frames[-1]) < 1_600_000  # was 2.0 MB, and it grew with every token
    for lane in ("dflash", "ar", "lookup", "plain"):
        pane, tokens = last[f"{lane}_tokens"], len(data["runs"][lane]["output_ids"])
        assert pane.count('<span class="tok ') == tokens and "not drawn" not in pane  # every token is still drawn
        tips = re.findall(r'<span class="tip">.*?</span>', pane)  # a hover box holds no span of its own
        assert 0 < len(tips) < tokens and sum(len(t.encode()) for t in tips) <= PANE_TIPS_BYTES
        # The newest tokens carry hover boxes; the oldest their one-line title.
        assert '<span class="tip">' in pane.rsplit('<span class="tok ', 1)[1]
        assert 'title="' in pane.split('<span class="tok ', 2)[1]


def test_a_shipped_replay_still_draws_every_token_and_hover_box(tmp_path):
    """What the budgets must not change: a recorded race of the app's size is drawn whole."""
    last = final(within(60, lambda: list(App([], "", None).playback.replay(str(SHIPPED), None, 4.0))))
    for lane in ("dflash", "ar", "lookup", "plain"):
        pane = last[f"{lane}_tokens"]
        assert pane.count('<span class="tok ') == 128 == pane.count('<span class="tip">') and 'title="' not in pane
    strip = last["dflash_strip"]
    assert strip.count('class="strip-head"') == 40 and "not drawn" not in strip
    assert strip.count('<span class="chip ') == strip.count('<span class="tip">')


# --- the second attack: every replay failure is a message------------------------------------------------------
UNCHECKED = {  # each failed inside the replay with no message (the API answered {"error": null})
    "no mask_id": (lambda t: d_block(t)["explain"].pop("mask_id"), "missing field trace.runs.dflash.blocks[0].explain.mask_id"),
    "no positions": (lambda t: d_block(t)["explain"].update(positions=[]), "explain.positions must be the block's positions"),
    "draft_passes 'x'": (lambda t: d_block(t).update(draft_passes="x"), "draft_passes must be int, got str: 'x'"),
    "draft_passes [1]": (lambda t: d_block(t).update(draft_passes=[1]), "draft_passes must be int, got list"),
    "draft_passes 10**4000": (lambda t: d_block(t).update(draft_passes=10**4000),
                              "draft_passes is a 4001-digit integer; it must be from 0 to 3"),
}


@pytest.mark.parametrize("case", UNCHECKED)
def test_a_trace_that_once_failed_silently_gets_a_message_naming_the_field(shipped, tmp_path, case):
    edit, message = UNCHECKED[case]
    path = crafted(shipped, edit, tmp_path)
    with pytest.raises(gr.Error) as caught:
        within(60, lambda: list(App([], "", None).playback.replay(path, None, 4.0)))
    assert message in caught.value.message and "unexpected" not in caught.value.message


@pytest.mark.parametrize("stage", ["loading", "playing"])
def test_any_failure_of_a_replay_becomes_the_escaped_visitor_message(stage, monkeypatch):
    from app.serve import playback

    def fail(*args, **kwargs):
        raise KeyError(f"{HOSTILE} in {REPO}/assets/traces/secret.json")

    monkeypatch.setattr(playback, "load_trace" if stage == "loading" else "race_frame", fail)
    with pytest.raises(gr.Error) as caught:
        within(60, lambda: list(App([], "", None).playback.replay(str(SHIPPED), None, 4.0)))
    message = caught.value.message
    assert message.startswith("math-greedy could not be replayed (KeyError: ") and "secret.json" in message
    assert "<img" not in message and "&lt;img src=x onerror=alert(1)&gt;" in message
    assert str(REPO) not in message and "/assets/" not in message  # a file's name, never its folder
