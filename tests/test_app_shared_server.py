"""A shared server one visitor cannot slow, starve or fill (the second attack): each finding of the
second attack that is about time, places and memory, as a test that failed on the code before.

Pauses and races have budgets no click renews; one visitor's requests are bounded per queue and per
address; the session table, the pause table and the trace store keep other visitors' entries;
no input or route makes the server fetch a URL; uploads are bounded per request and per visitor;
a race nobody reads ends. Server-level cases run against a replay-only app (no model) on loopback,
with visitors told apart by their loopback source address (127.0.0.2, 127.0.0.3, ...). What the
issue added is imported in the tests that use it, so that every test runs, and fails for its own
reason, on the code before.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import httpx
import pytest
from fake_runs import run_events
from serve import free_port

from app.guard.limits import Limits, check_request
from app.guard.traces import TraceStore
from app.race.control import EVICTED, PAUSE_EXPIRED, Control, Controls
from app.race.interleave import race
from app.ui import App, build_demo, launch_options
from app.view.frames import FRAME_FIELDS
from dflash_core.errors import GenerationInputError
from dflash_core.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "assets" / "traces" / "math-greedy.json"


def request_from(session: str, host: str = "") -> SimpleNamespace:
    """What a handler sees of a request: its session and, over HTTP, the client's address."""
    return SimpleNamespace(session_hash=session, client=SimpleNamespace(host=host), headers={})


def frames_of(stream) -> dict:
    return dict(zip(FRAME_FIELDS, next(stream)))


def _long_race(control):
    """A race of recorded events that takes seconds to show at speed 1."""
    return race({"dflash": run_events(0.2, 0.3, 3, 40, 4), "plain": run_events(0.2, 0.2, 1, 120, 1)},
                block_sizes={"dflash": 4}, frame_s=0.0, speed=1.0, control=control, keepalive_s=0.05)


def paused_long_race(**budgets):
    """(control, frames) of a long race paused before its first cycle, with the control's `budgets`."""
    control = Control(**budgets)
    control.reset()
    control.pause(0)
    frames = _long_race(control)
    assert next(frames).paused
    return control, frames


def ended_within(seconds: float, frames) -> list:
    out = []
    worker = threading.Thread(target=lambda: out.extend(frames), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"the race still runs after {seconds} s"
    return out


# --- item 2: the pause budget is spent, not renewed; the wall clock has a budget too ------------------
def test_a_pause_re_sent_every_moment_still_ends_within_the_pause_budget():
    control, frames = paused_long_race(max_pause_s=0.6)
    stop = threading.Event()

    def keep_pausing():  # the attack: Pause again and again, each within the budget
        while not stop.is_set():
            control.pause(control.viewer.shown)
            time.sleep(0.05)

    threading.Thread(target=keep_pausing, daemon=True).start()
    try:
        t0 = time.perf_counter()
        rest = ended_within(10, frames)
        assert rest[-1].stopped and rest[-1].released == PAUSE_EXPIRED
        assert time.perf_counter() - t0 < 3
    finally:
        stop.set()


def test_steps_and_continues_spend_the_same_pause_budget():
    control, frames = paused_long_race(max_pause_s=0.5)
    time.sleep(0.3)  # 0.3 s paused (waiting in `hold` below counts, this sleep does not)
    rest = []
    worker = threading.Thread(target=lambda: rest.extend(frames), daemon=True)
    worker.start()
    time.sleep(0.3)
    control.resume()  # playing again: the 0.3 s held so far stay spent
    time.sleep(0.2)
    control.pause(control.viewer.shown)
    worker.join(5)
    assert not worker.is_alive() and rest[-1].released == PAUSE_EXPIRED
    assert 0.5 <= control.paused_s() < 1.5


def test_a_run_ends_at_its_wall_clock_budget_whether_paused_or_playing():
    from app.race.control import TIME_UP

    for paused in (False, True):
        control = Control(max_run_s=0.8)
        control.reset()
        if paused:
            control.pause(0)
        t0 = time.perf_counter()
        rest = ended_within(10, _long_race(control))
        assert rest[-1].stopped and rest[-1].released == TIME_UP
        assert 0.7 < time.perf_counter() - t0 < 3


def test_a_replay_held_by_pauses_gives_its_slot_back_at_the_budget():
    app = App([], "", None, Limits(max_pause_s=1, replay_concurrency=1, replay_queue=1))
    viewer = request_from("pauser")
    stream = app.playback.replay(str(SHIPPED), None, 0.25, viewer)
    frames_of(stream)
    stop = threading.Event()

    def keep_pausing():
        while not stop.is_set():
            app.stepping.pause(viewer)
            time.sleep(0.1)

    threading.Thread(target=keep_pausing, daemon=True).start()
    try:
        t0 = time.perf_counter()
        last = {}
        for values in stream:
            last = dict(zip(FRAME_FIELDS, values))
            assert time.perf_counter() - t0 < 10, "the replay is still held"
        assert "paused for 1 s in all" in str(last["control_status"])
        assert app.playback.slots.playing == 0
    finally:
        stop.set()


# --- item 3: one visitor cannot fill the queue ------------------------------------------------------
def test_a_visitor_holds_at_most_its_share_of_replay_places_and_others_still_get_theirs():
    app = App([], "", None, Limits(replay_concurrency=1, replay_queue=8, per_visitor=2))
    hog = [app.playback.replay(str(SHIPPED), None, 0.25, request_from(f"h{i}", "10.0.0.6")) for i in range(3)]
    assert "Replaying" in str(next(hog[0])[0])
    assert "Waiting for a free replay slot" in str(next(hog[1])[0])
    with pytest.raises(gr.Error, match="Your address already has 2 replays playing or waiting"):
        next(hog[2])
    other = app.playback.replay(str(SHIPPED), None, 0.25, request_from("v", "10.0.0.7"))
    assert "Waiting for a free replay slot" in str(next(other)[0])  # in line, not refused
    for stream in (*hog[:2], other):
        stream.close()
    assert app.playback.slots.playing == app.playback.slots.waiting == 0


@pytest.fixture(scope="module")
def served_tiny(tiny_dirs):
    from serve import launch_app

    demo, url = launch_app(*tiny_dirs, limits=Limits(per_visitor=2, max_queue=16))
    yield demo, url
    demo.close()


def _join(url: str, demo, source: str, session: str):
    compare = next(i for i, f in demo.fns.items() if f.api_name == "compare")
    data = ["Count from one to a thousand.", 400, 4, 0.0, 1.0, 0, [], demo.dflash_app.default_id, "default", 4]
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as http:
        return http.post(f"{url}gradio_api/queue/join",
                         json={"data": data, "fn_index": compare, "session_hash": session, "trigger_id": None})


def test_one_address_may_keep_only_its_share_of_the_race_queue_waiting(served_tiny):
    demo, url = served_tiny
    answers = [_join(url, demo, "127.0.0.2", f"hog{i}") for i in range(6)]
    codes = [a.status_code for a in answers]
    # One runs, two wait; the other three are refused at once with the reason, whatever session id each sent.
    assert codes.count(200) <= 3 and codes.count(503) >= 3, codes
    assert "Your address already has 2 requests waiting" in answers[-1].text
    assert _join(url, demo, "127.0.0.3", "someone-else").status_code == 200
    demo.dflash_app.live.stop(SimpleNamespace(session_hash=None))


# --- item 4: the sessions Gradio keeps are bounded ---------------------------------------------------
def test_gradio_keeps_the_outputs_of_a_bounded_number_of_sessions():
    demo = build_demo([], "", None, Limits(session_capacity=7), live=False)
    try:
        assert launch_options(demo)["state_session_capacity"] == 7
        demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                    **launch_options(demo))
        assert demo.state_holder.capacity == 7
    finally:
        demo.close()
        demo.dflash_app.traces.close()


# --- items 5 and 6: no URL fetched through any input or route; uploads bounded --------------------------
@pytest.fixture(scope="module")
def served_replays():
    demo = build_demo([], "", None, Limits(upload_mb_per_hour=1), live=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo))
    yield demo, demo.local_url
    demo.close()
    demo.dflash_app.traces.close()


def test_no_input_makes_the_server_fetch_a_url(served_replays, monkeypatch):
    import gradio.processing_utils as pu

    fetched = []

    async def spy(url, *args, **kwargs):
        fetched.append(url)
        raise RuntimeError("the spy fetches nothing")

    monkeypatch.setattr(pu, "async_ssrf_protected_download", spy)
    demo, url = served_replays
    link = {"path": "http://example.com/big.bin", "meta": {"_type": "gradio.FileData"}}
    replay = next(i for i, f in demo.fns.items() if f.api_name == "replay")
    for position in range(3):  # the recorded run's name, the upload, the speed
        data = ["math-greedy", None, 1.0]
        data[position] = link
        session = f"u{position}"
        answer = httpx.post(f"{url}gradio_api/queue/join", json={"data": data, "fn_index": replay,
                                                                 "session_hash": session}, timeout=30)
        with httpx.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}, timeout=30) as events:
            next(line for line in events.iter_lines() if "process_completed" in line or "process_generating" in line)
        assert answer.status_code in (200, 400, 422, 500) and "http://example.com" not in str(fetched)
    assert fetched == []


def test_the_file_route_refuses_a_url(served_replays):
    _, url = served_replays
    for target in ("http://example.com/x.bin", "https%3A//example.com/x.bin"):
        answer = httpx.get(f"{url}gradio_api/file={target}", timeout=30)
        assert answer.status_code == 403 and "fetches no URL" in answer.text


def test_uploads_are_bounded_per_request_and_per_visitor(served_replays):
    demo, url = served_replays
    uploads = Path(demo.dflash_app.traces.served or "/nonexistent")

    def stored() -> list[Path]:
        # This request's files only: other test processes' servers write into the same upload folder.
        return sorted(uploads.rglob("t[0-2].json")) if uploads.is_dir() else []

    before = stored()
    eight_mb = b"{" + b" " * 8_000_000 + b"}"
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.4"), timeout=60) as http:
        many = http.post(f"{url}gradio_api/upload", files=[("files", (f"t{i}.json", eight_mb, "application/json"))
                                                           for i in range(3)])
        assert many.status_code == 413 and "one trace file of at most 20 MB" in many.text
        assert stored() == before  # refused before anything was stored
        small = b'{"x": "' + b"y" * 600_000 + b'"}'
        assert http.post(f"{url}gradio_api/upload", files={"files": ("a.json", small, "application/json")}).status_code == 200
        again = http.post(f"{url}gradio_api/upload", files={"files": ("b.json", small, "application/json")})
        assert again.status_code == 429 and "at most 1 MB per visitor per hour" in again.text
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.5"), timeout=60) as http:
        other = http.post(f"{url}gradio_api/upload", files={"files": ("c.json", small, "application/json")})
        assert other.status_code == 200  # another visitor's budget is their own


# --- item 7: a race nobody reads ends ---------------------------------------------------------------
def test_readers_say_a_session_is_gone_only_after_its_stream_closed_for_the_grace():
    from app.guard.readers import Readers

    now = [0.0]
    readers = Readers(grace_s=3.0, clock=lambda: now[0])
    assert not readers.gone("never-read")  # a handler called directly, never over a stream
    readers.opened("s")
    watch = readers.watch("s")
    now[0] = 10.0
    assert not watch()  # still reading
    readers.closed("s")
    now[0] = 12.0
    assert not watch()
    now[0] = 13.5
    assert watch()
    later = readers.watch("s")  # a new run of the session: its stream may reopen
    assert not later()
    readers.opened("s")
    now[0] = 100.0
    assert not later()


def test_a_replay_nobody_reads_ends_and_frees_its_slot():
    from app.guard.readers import Readers

    readers = Readers(grace_s=0.2)
    app = App([], "", None, Limits(replay_concurrency=1))
    app.playback.readers = readers
    readers.opened("leaver")
    stream = app.playback.replay(str(SHIPPED), None, 0.25, request_from("leaver"))
    frames_of(stream)
    readers.closed("leaver")  # the page went away
    t0 = time.perf_counter()
    ended_within(10, stream)
    assert time.perf_counter() - t0 < 3
    assert app.playback.slots.playing == 0


def test_an_agents_race_is_bounded_by_the_same_budgets():
    controls = Controls(max_pause_s=5, max_run_s=7)
    agent = controls.detached()
    assert (agent.max_pause_s, agent.max_run_s) == (5, 7) and controls.find("") is None


# --- item 9: a temperature too small to divide by -------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-38, 1e-300, 5e-324])
def test_a_vanishing_temperature_is_refused_with_its_reason(temperature):
    with pytest.raises(GenerationInputError, match=r"temperature must be 0 \(greedy\) or at least 0.001"):
        SamplingParams(temperature=temperature)
    with pytest.raises(ValueError, match=r"at least 0.001"):
        check_request(Limits(), "pair", "hi", 8, 4, temperature, 1.0, 0)
    assert SamplingParams(temperature=0.001).temperature == 0.001


# --- item 10: another session's trace by any spelling of its path -------------------------------------------
def test_a_trace_path_spelled_differently_is_still_another_sessions(tmp_path):
    store = TraceStore(tmp_path / "traces")
    alices = store.write("alice", json.loads(SHIPPED.read_text()))
    app = App([], "", None, traces=store)
    for spelling in ("/" + alices, alices.replace("/traces/", "/traces/./"), alices.replace("/traces/", "//traces/")):
        with pytest.raises(gr.Error, match="belongs to another visitor.s session"):
            next(app.playback.replay(None, spelling, 1.0, request_from("bob")))
    store.close()


# --- item 11: made-up session ids cannot push a viewer out of the pause table -------------------------------
def test_calls_with_made_up_sessions_leave_a_viewers_pause_working():
    app = App([], "", None)
    app.controls.size = 8
    victim = request_from("victim")
    stream = app.playback.replay(str(SHIPPED), None, 0.25, victim)
    frames_of(stream)
    for i in range(300):  # queue-free calls, each with a session id of its own
        app.stepping.pause(request_from(f"made-up-{i}"))
        app.stepping.pick_cycle(0, request_from(f"made-up-x{i}"))
    assert "Paused" in app.stepping.pause(victim)
    deadline = time.perf_counter() + 10
    frame = frames_of(stream)
    while "Paused" not in str(frame["control_status"]):
        assert time.perf_counter() < deadline
        frame = frames_of(stream)
    assert "Ended" not in str(frame["control_status"])
    stream.close()


def test_races_of_new_sessions_drop_only_controls_with_nothing_playing():
    controls = Controls(size=2)
    playing = controls.get("playing")
    playing.reset()
    for i in range(5):
        controls.get(f"newcomer-{i}")
    assert controls.find("playing") is playing and playing.released != EVICTED


# --- item 12: one visitor's many races cannot push out another's trace downloads -----------------------------
def test_one_visitors_many_races_keep_other_visitors_traces(tmp_path):
    store = TraceStore(tmp_path / "traces", total=8, per_visitor=4)
    data = json.loads(SHIPPED.read_text())
    victims = [store.write("alice", data, visitor="10.0.0.1"), store.write("bob", data, visitor="10.0.0.2")]
    for i in range(64):  # 64 one-token races, each from a session of its own
        store.write(f"hog-{i}", data, visitor="10.0.0.6")
    assert all(Path(path).is_file() for path in victims)
    assert sum(1 for e in store._all.values() if e.visitor == "10.0.0.6") == 4
    store.close()


# --- item 6, at shutdown: with the MCP server on, uploads still go with the server ----------------------
async def _any_mcp_call(url: str) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()


@pytest.mark.slow
def test_uploads_go_when_a_server_that_answered_mcp_stops(tmp_path, tiny_dirs):
    import asyncio
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("GRADIO_TEMP_DIR", None)
    log = tmp_path / "app.log"
    proc = subprocess.Popen([sys.executable, "-u", str(REPO / "app.py"), "--target", str(tiny_dirs[0]), "--drafter",
                             str(tiny_dirs[1]), "--mcp", "--port", str(port), "--threads", "1", "--no-compile"],
                            cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}gradio_api/info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        # The selected pair loads once the server answers, before any page asks for it.
        while time.time() < deadline and "loaded in" not in log.read_text():
            time.sleep(0.2)
        lines = log.read_text().splitlines()
        serving = next(i for i, line in enumerate(lines) if "Running on local URL" in line)
        loaded = next(i for i, line in enumerate(lines) if "loaded in" in line)
        assert serving < loaded and lines[loaded].startswith(f"DFlash Studio: {tiny_dirs[0].name}")
        asyncio.run(_any_mcp_call(f"{url}gradio_api/mcp/"))
        answer = httpx.post(f"{url}gradio_api/upload", files={"files": ("left-behind.json", b"{}", "application/json")},
                            timeout=30)
        assert answer.status_code == 200 and list(tmp_path.rglob("left-behind.json"))
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert not list(tmp_path.rglob("left-behind.json"))
    finally:
        proc.kill()


def test_a_pair_loaded_in_the_background_is_the_one_a_visitor_gets_and_a_failure_is_logged(tiny_dirs, tmp_path,
                                                                                            one_thread):
    from dataclasses import replace

    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair

    cache, said = PairCache("cpu", warm_up=False), []
    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    thread = cache.load_in_background(spec, log=said.append)
    visitor = cache.get(spec)  # a visitor in the middle of the load waits for it
    thread.join(60)
    assert not thread.is_alive() and cache.get(spec) is visitor
    assert said == [f"DFlash Studio: {spec.label} loaded in {visitor.load_s:.1f} s"]
    broken = replace(cli_pair(str(tiny_dirs[0]), str(tmp_path / "no-drafter")), id="broken")
    cache.load_in_background(broken, log=said.append).join(60)
    assert not cache.is_loaded(broken)
    assert said[1].startswith(f"DFlash Studio: {broken.label} did not load at start-up: ") and "no-drafter" in said[1]


# --- item 14: a second drafter of the same target does not load the target again -------------------------
def test_pairs_of_one_target_share_its_weights(tiny_dirs, tmp_path, one_thread):
    import shutil
    from dataclasses import replace

    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair
    from dflash_core import run

    target_dir, drafter_dir = tiny_dirs
    other_drafter = shutil.copytree(drafter_dir, tmp_path / "another-drafter")
    cache = PairCache("cpu", warm_up=False)
    first, second = (cache.get(replace(cli_pair(str(target_dir), str(d)), id=name))
                     for name, d in (("block-4", drafter_dir), ("block-16", other_drafter)))
    assert first.spec.id != second.spec.id and first.drafter is not second.drafter
    assert first.target.model is second.target.model and first.target is not second.target
    ids = first.encode("Hi")
    outputs = [run(pair.target, ids, pair.drafter, max_new_tokens=8).output_ids for pair in (first, second)]
    assert outputs[0] == outputs[1] == run(first.plain, ids, None, max_new_tokens=8).output_ids
