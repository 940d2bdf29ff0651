"""A shared server strangers cannot hurt, third pass: each finding of the third attack on a live app
as a test over HTTP (loopback only) that failed on the code before.

No file route fetches a URL and no look-up leaves the machine; parallel uploads cannot pass the
hourly budget together; replays of one upload are parsed once, after the visitor's place is
taken, and those past the visitor's places are refused at the queue's join; a race is bounded by
its lane-tokens and its frames' bytes; the open-stream table is bounded, and one address's flood
of queue requests gets 429 while others are served; a race runs on the pair the page shows; the
docs give every bound's flag and defaults. Visitors are told apart by their loopback
source address (127.0.0.2, 127.0.0.3, ...), as the server's per-visitor bounds tell them apart.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from serve import free_port

from app.guard.limits import Limits
from app.ui import build_demo, launch_options

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "assets" / "traces" / "math-greedy.json"


def client(address: str, timeout: float = 60) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=timeout)


@pytest.fixture(scope="module")
def served(request):
    """A replay-only app on loopback with a 1 MB hourly upload budget per visitor."""
    demo = build_demo([], "", None, Limits(upload_mb_per_hour=1), live=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo))
    yield demo, demo.local_url
    demo.close()
    demo.dflash_app.traces.close()


# --- 1. no file route fetches a URL, and no look-up leaves the machine ---------------------------------
@pytest.fixture()
def public_host(monkeypatch):
    """(a URL on a host Gradio's URL check approves, the paths fetched from it): a listener on
    127.0.0.2 that the check is told is a public address."""
    import safehttpx

    fetched = []

    class Listener(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            fetched.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"fetched for a stranger")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def approved(hostname: str) -> str:
        return "127.0.0.2"

    monkeypatch.setattr(safehttpx, "async_validate_url", approved)
    yield f"http://public.example:{server.server_address[1]}/probe", fetched
    server.shutdown()


@pytest.mark.parametrize("spelling", ["raw", "encoded", "half-encoded", "upper-case", "file="])
def test_no_file_route_fetches_a_url_however_it_is_spelled(served, public_host, spelling):
    _, url = served
    target, fetched = public_host
    host_and_path = target.removeprefix("http://")
    named = {"raw": target, "encoded": target.replace(":", "%3A").replace("/", "%2F"),
             "half-encoded": "http%3A//" + host_and_path, "upper-case": "HTTP%3A%2F%2F" + host_and_path,
             "file=": target.replace(":", "%3A", 1)}[spelling]
    route = "file=" if spelling == "file=" else "file/"
    with client("127.0.0.3") as http:
        answer = http.get(f"{url}gradio_api/{route}{named}")
    assert answer.status_code == 403 and "fetches no URL" in answer.text
    assert fetched == [] and "stranger" not in answer.text


def test_the_url_check_asks_no_public_resolver(served, monkeypatch):
    import safehttpx

    asked = []
    real_get = httpx.AsyncClient.get

    async def spy(self, url, *args, **kwargs):
        asked.append(str(url))
        return await real_get(self, url, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "get", spy)
    with pytest.raises(ValueError, match="failed validation"):
        asyncio.run(safehttpx.async_validate_url("localhost"))  # resolves, but to no public address
    assert asked == []


# --- 2. parallel uploads cannot pass the hourly budget together; the recording route is closed -------
def test_parallel_uploads_of_one_visitor_stay_within_the_hourly_budget(served):
    _, url = served
    body = b'{"x": "' + b"y" * 300_000 + b'"}'  # 0.3 MB: three fit in the 1 MB budget, not four

    def upload(i: int) -> int:
        with client("127.0.0.6") as http:
            files = {"files": (f"p{i}.json", body, "application/json")}
            return http.post(f"{url}gradio_api/upload", files=files).status_code

    with ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(upload, range(10)))
    assert codes.count(200) <= 3 and codes.count(429) >= 7, codes
    with client("127.0.0.7") as http:  # another visitor's budget is their own
        assert http.post(f"{url}gradio_api/upload", files={"files": ("q.json", body, "application/json")}).status_code == 200


def test_the_recording_route_takes_no_upload(served):
    _, url = served
    with client("127.0.0.8") as http:
        answer = http.post(f"{url}gradio_api/process_recording",
                           files={"video": ("v.mp4", b"\0" * 500_000, "video/mp4")})
    assert answer.status_code == 404 and "no recordings" in answer.text


# --- 5. the open-stream table is bounded -----------------------------------------------------------------
def test_made_up_session_ids_neither_grow_the_stream_table_nor_pass_when_long(served):
    demo, url = served
    readers = demo.dflash_app.readers

    def held() -> int:
        return len(readers._open) + len(readers._left)

    before = held()
    with client("127.0.0.9", timeout=30) as http:
        long_ids = [http.get(f"{url}gradio_api/queue/data", params={"session_hash": f"{i:04d}" + "x" * 14_000})
                    for i in range(100)]
        assert {answer.status_code for answer in long_ids} == {400}
        assert "at most 128 characters" in long_ids[0].text and held() == before
        readers.max_left = 30
        try:
            for i in range(80):  # short ones, each new: the table keeps the newest 30
                try:
                    http.get(f"{url}gradio_api/queue/data", params={"session_hash": f"made-up-{i}"})
                except httpx.RemoteProtocolError:  # Gradio ends an unknown session's stream abruptly
                    pass
            assert held() <= 30 and readers.gone(f"made-up-{79}") is False
            assert "made-up-79" in readers._left and "made-up-0" not in readers._left
        finally:
            readers.max_left = 10_000


def test_a_flood_of_queue_requests_from_one_address_gets_429_while_another_address_is_served():
    demo = build_demo([], "", None, Limits(queue_requests_per_min=30), live=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo))
    url = demo.local_url

    def stream(i: int) -> httpx.Response:
        with client("127.0.0.15", timeout=30) as http:
            return http.get(f"{url}gradio_api/queue/data", params={"session_hash": f"{i:04d}" + "x" * 200})

    try:
        with ThreadPoolExecutor(16) as pool:  # a flood over 16 connections at once
            flood = list(pool.map(stream, range(100)))
        codes = [answer.status_code for answer in flood]
        # The bucket's 30, and what refills at 0.5 a second while the flood is sent: the rest get 429.
        assert 30 <= len(codes) - codes.count(429) <= 40 and codes.count(400) >= 30, codes
        refused = next(answer for answer in flood if answer.status_code == 429)
        assert "at most 30 a minute" in refused.text and "--queue-requests-per-min" in refused.text
        assert refused.headers["retry-after"] == "2"
        with client("127.0.0.15", timeout=30) as http:  # one request after another: one refusal a second
            started = time.perf_counter()
            joins = [http.post(f"{url}gradio_api/queue/join", json={"data": [], "fn_index": 0, "session_hash": "j"})
                     for _ in range(4)]
            refusals = [j.status_code for j in joins].count(429)  # every queue route, not only the streams
            # Half of them: what the bucket refills (0.5 a second) while each refusal waits its second.
            assert refusals >= 2 and time.perf_counter() - started >= refusals - 0.1
        replay = _fn(demo, fn=demo.dflash_app.playback.replay)
        started = time.perf_counter()
        assert "process_generating" in _first_answer(url, "127.0.0.16", replay, ["math-greedy", None, 4.0], "other")
        assert time.perf_counter() - started < 10  # another address waits for nothing
    finally:
        demo.close()
        demo.dflash_app.traces.close()


def test_a_flood_of_instant_events_from_one_address_gets_429_while_another_address_is_served():
    """The routes Gradio answers outside the queue (the page's Pause, Step, tab switches) run their
    handler at once: a bucket of their own bounds them per address, apart from the queue's."""
    demo = build_demo([], "", None, Limits(direct_requests_per_min=30), live=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo))
    url, pause = demo.local_url, _fn(demo, fn=demo.dflash_app.stepping.pause)
    ran = []
    pause_handler = demo.fns[pause].fn
    demo.fns[pause].fn = lambda: (ran.append(1), pause_handler())[1]

    def press(address: str) -> httpx.Response:
        with client(address, timeout=30) as http:
            return http.post(f"{url}gradio_api/run/predict", json={"data": [], "fn_index": pause, "session_hash": "s"})

    try:
        with ThreadPoolExecutor(16) as pool:  # a flood over 16 connections at once
            flood = list(pool.map(press, ["127.0.0.17"] * 100))
        codes = [answer.status_code for answer in flood]
        # The bucket's 30, and what refills at 0.5 a second meanwhile: only those reach the handler.
        assert 30 <= codes.count(200) == len(ran) <= 40 and codes.count(429) == 100 - codes.count(200), codes
        refused = next(answer for answer in flood if answer.status_code == 429)
        assert "at most 30 a minute outside its queue" in refused.text and "--direct-requests-per-min" in refused.text
        # The queue's bucket is another: this address can still join it.
        assert "process_generating" in _first_answer(url, "127.0.0.17", _fn(demo, fn=demo.dflash_app.playback.replay),
                                                     ["math-greedy", None, 4.0], "queued")
        started = time.perf_counter()
        assert press("127.0.0.18").status_code == 200 and time.perf_counter() - started < 5  # another address waits for nothing
    finally:
        demo.close()
        demo.dflash_app.traces.close()


def test_the_request_rate_refills_at_its_rate_per_visitor_and_keeps_a_bounded_table():
    from app.guard.request_rate import RequestRate

    now = [0.0]
    rate = RequestRate(per_min=60, clock=lambda: now[0], max_visitors=3)
    assert [rate.allow("a") for _ in range(61)] == [True] * 60 + [False]
    assert rate.allow("b")  # a bucket per visitor
    now[0] += 2.5  # one a second comes back: two whole requests
    assert [rate.allow("a") for _ in range(3)] == [True, True, False]
    for visitor in ("c", "d", "e"):
        rate.allow(visitor)
    assert len(rate) == 3 and rate.retry_after_s() == 1


# --- 6. a race runs on the pair the page shows, though the session's state was dropped -------------------
def _fn(demo, *, elem_id: str | None = None, fn=None, api_name: str | None = None) -> int:
    """The function index of the first event with a handler that the component `elem_id` fires, of
    the handler `fn`, or of the event named `api_name`."""
    ids = {i for i, block in demo.blocks.items() if getattr(block, "elem_id", None) == elem_id}
    return next(i for i, f in demo.fns.items()
                if (elem_id is not None and f.fn is not None and any(target[0] in ids for target in f.targets)) or
                (fn is not None and f.fn == fn) or (api_name is not None and f.api_name == api_name))


def _run_queued(http: httpx.Client, url: str, fn_index: int, data: list, session: str) -> str:
    """Join the queue as the page does and read the session's stream until the event completes."""
    joined = http.post(f"{url}gradio_api/queue/join",
                       json={"data": data, "fn_index": fn_index, "session_hash": session, "trigger_id": None})
    assert joined.status_code == 200, joined.text
    seen = []
    with http.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}) as events:
        for line in events.iter_lines():
            seen.append(line)
            if "process_completed" in line:
                break
    return "\n".join(seen)


def test_a_race_runs_on_the_pair_the_page_shows_after_made_up_sessions_drop_the_visitors_state(tiny_dirs):
    from dataclasses import replace

    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair

    first = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    second = replace(first, id="cli-b", label="the block-4 pair, again")
    demo = build_demo([first, second], first.id, PairCache("cpu"), Limits(session_capacity=3))
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo))
    app, url = demo.dflash_app, demo.local_url
    raced = []
    race_stream = app.live.race_stream
    app.live.race_stream = lambda req, *args, **kwargs: (raced.append(req.pair_id), race_stream(req, *args, **kwargs))[1]
    try:
        with client("127.0.0.2", timeout=120) as visitor:
            _run_queued(visitor, url, _fn(demo, fn=app.loading.select_pair), ["cli-b"], "visitor")
            with client("127.0.0.3") as stranger:  # the Pause button's function, in 20 made-up sessions
                for i in range(20):
                    stranger.post(f"{url}gradio_api/run/predict", json={
                        "data": [], "fn_index": _fn(demo, elem_id="pause"), "session_hash": f"made-up-{i}"})
            assert "visitor" not in demo.state_holder.session_data  # Gradio dropped the visitor's state
            # What the page sends: its inputs, the pair its selector shows, the thinking default.
            data = ["What is 2 + 2?", 4, 4, 0.0, 1.0, 0, [], "cli-b", "default", 4]
            _run_queued(visitor, url, _fn(demo, api_name="compare_from_page"), data, "visitor")
        assert raced == ["cli-b"]
    finally:
        demo.close()
        app.traces.close()


# --- 4. a race is bounded by its lane-tokens and by the bytes of its frames ------------------------------
@pytest.fixture(scope="module")
def served_live(tiny_dirs):
    """The tiny pair served live, a race streaming at most 1 MB."""
    from serve import launch_app

    demo, url = launch_app(*tiny_dirs, limits=Limits(max_race_mb=1))
    yield demo, url
    demo.close()
    demo.dflash_app.traces.close()


def test_a_race_of_every_lane_at_the_most_tokens_is_refused_by_its_lane_tokens(served_live):
    demo, url = served_live
    every_lane = ["scheduled", "tree", "dflash2", "fusion", "ar", "lookup"]
    data = ["Tell me a long story.", 512, 4, 0.0, 1.0, 0, every_lane, None, "default", 4]
    with client("127.0.0.2", timeout=120) as http:
        stream = _run_queued(http, url, _fn(demo, fn=demo.dflash_app.live.compare), data, "lanes")
    assert "8 lanes x 512 new tokens is 4096 lane-tokens; this server races at most 2048 (--max-lane-tokens)" in stream


def test_a_race_stops_at_its_frames_byte_budget_and_says_so(served_live):
    demo, url = served_live
    # Four lanes of 440 tokens (the tiny target holds 512 positions): the frames are paced to what a browser draws (about 300 KB/s), so a
    # race must last a few seconds to reach 1 MB, which two lanes of 400 tokens on a quiet machine did not.
    data = ["Count from one to a thousand.", 440, 4, 0.0, 1.0, 0, ["scheduled", "lookup"], None, "default", 4]
    with client("127.0.0.2", timeout=300) as http:
        stream = _run_queued(http, url, _fn(demo, fn=demo.dflash_app.live.compare), data, "bytes")
    assert "reached 1 MB, the most one race may stream on this server (--max-race-mb)" in stream
    assert len(stream.encode()) < 5_000_000  # the budget, then the last frames of four lanes (hover boxes too)


# --- 3. one upload replayed by many requests at once: places first, then one parse -----------------------
def _first_answer(url: str, address: str, fn_index: int, data: list, session: str) -> str:
    """Join the queue from `address` and read the session's stream up to the event's first answer."""
    with client(address) as http:
        joined = http.post(f"{url}gradio_api/queue/join",
                           json={"data": data, "fn_index": fn_index, "session_hash": session, "trigger_id": None})
        if joined.status_code != 200:
            return joined.text
        with http.stream("GET", f"{url}gradio_api/queue/data", params={"session_hash": session}) as events:
            for line in events.iter_lines():
                if "process_generating" in line or "process_completed" in line:
                    return line
    return ""


def test_parallel_replays_of_one_upload_take_places_before_it_is_parsed_and_parse_it_once(served, monkeypatch):
    from app.serve import playback

    demo, url = served
    parsed = []
    load_trace = playback.load_trace
    monkeypatch.setattr(playback, "load_trace", lambda path: (parsed.append(path), load_trace(path))[1])
    with client("127.0.0.10") as http:
        answer = http.post(f"{url}gradio_api/upload", files={"files": ("mine.json", SHIPPED.read_bytes(), "application/json")})
        assert answer.status_code == 200, answer.text
    upload = {"path": answer.json()[0], "meta": {"_type": "gradio.FileData"}}
    replay = _fn(demo, fn=demo.dflash_app.playback.replay)
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda i: _first_answer(url, "127.0.0.10", replay, [None, upload, 4.0], f"replayer-{i}"),
                                range(12)))
    refused = [a for a in answers if "Your address already has" in a]
    assert len(refused) >= 12 - Limits().per_visitor, answers  # refused before any file was read
    assert len(parsed) == 1  # the places given share one parse


def test_replays_past_a_visitors_places_are_refused_at_the_queue_and_never_reach_the_handler(served, monkeypatch):
    """A replay runs at once (its line is the handler's), so the queue counts a visitor's replays
    playing as well as waiting: the joins past the places get 503, and the handler never runs for them."""
    demo, url = served
    app = demo.dflash_app
    entered = []
    join = app.playback.slots.join
    monkeypatch.setattr(app.playback.slots, "join", lambda visitor="": (entered.append(visitor), join(visitor))[1])
    padded = SHIPPED.read_bytes() + b" " * 600_000  # within the fixture's 1 MB hour
    with client("127.0.0.14") as http:
        answer = http.post(f"{url}gradio_api/upload", files={"files": ("big.json", padded, "application/json")})
        assert answer.status_code == 200, answer.text
    upload = {"path": answer.json()[0], "meta": {"_type": "gradio.FileData"}}
    replay = _fn(demo, fn=app.playback.replay)

    def join_only(i: int) -> httpx.Response:
        with client("127.0.0.14") as http:
            return http.post(f"{url}gradio_api/queue/join", json={
                "data": [None, upload, 0.25], "fn_index": replay, "session_hash": f"storm-{i}", "trigger_id": None})

    with ThreadPoolExecutor(12) as pool:
        joins = list(pool.map(join_only, range(12)))
    time.sleep(1.0)  # the admitted ones have reached the handler
    codes = [j.status_code for j in joins]
    assert codes.count(200) <= Limits().per_visitor and codes.count(503) >= 12 - Limits().per_visitor, codes
    assert "Your address already has" in next(j.text for j in joins if j.status_code == 503)
    assert len(entered) <= Limits().per_visitor, entered


# --- 8. behind a trusted reverse proxy, each visitor has bounds of their own -------------------------------
def test_a_trusted_proxys_forwarded_address_is_the_visitor_and_anyone_elses_is_ignored():
    demo = build_demo([], "", None, Limits(upload_mb_per_hour=1, trusted_proxy="127.0.0.11"), live=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options(demo))
    body = {"files": ("t.json", b'{"x": "' + b"y" * 600_000 + b'"}', "application/json")}

    def upload(address: str, forwarded: str) -> int:
        with client(address) as http:
            return http.post(f"{demo.local_url}gradio_api/upload", files=body,
                             headers={"X-Forwarded-For": forwarded}).status_code

    try:
        # Through the proxy: two visitors, a budget each.
        assert [upload("127.0.0.11", "203.0.113.1") for _ in range(2)] == [200, 429]
        assert upload("127.0.0.11", "203.0.113.2") == 200
        # A client that is not the proxy cannot pick an address to spend: its own is counted.
        assert [upload("127.0.0.12", f"198.51.100.{i}") for i in range(2)] == [200, 429]
    finally:
        demo.close()
        demo.dflash_app.traces.close()


# --- 9. a queued function runs only through the queue, where the per-visitor bounds apply -----------------
def test_a_queued_function_is_not_run_by_a_direct_call_and_the_controls_still_are(served):
    demo, url = served
    replay = _fn(demo, fn=demo.dflash_app.playback.replay)
    with client("127.0.0.13") as http:
        for route in ("run/replay", "run/predict"):
            answer = http.post(f"{url}gradio_api/{route}",
                               json={"data": ["math-greedy", None, 4.0], "fn_index": replay, "session_hash": "direct"})
            assert answer.status_code == 404 and "join the queue" in answer.text
        pause = http.post(f"{url}gradio_api/run/predict",
                          json={"data": [], "fn_index": _fn(demo, elem_id="pause"), "session_hash": "direct"})
        assert pause.status_code == 200  # the page's controls skip the queue on purpose
    assert "process_generating" in _first_answer(url, "127.0.0.13", replay, ["math-greedy", None, 4.0], "queued")


# --- every visitor bound is documented with its flag and its defaults ------------------------------------
def test_docs_state_every_visitor_bound_with_its_flag_and_both_defaults():
    import re
    from dataclasses import fields

    from app.guard.limits import SPACE_LIMITS

    table = (REPO / "docs" / "app.md").read_text(encoding="utf-8")
    for bound in fields(Limits):
        flag = "--" + bound.name.replace("_", "-")
        row = re.search(r"^\| `" + re.escape(flag) + r"` \| ([^|]+) \| ([^|]+) \|", table, re.M)
        assert row is not None, f"docs/app.md has no row for {flag}"
        shown = [getattr(limits, bound.name) or "none" for limits in (Limits(), SPACE_LIMITS)]
        assert [cell.strip() for cell in row.groups()] == [str(value) for value in shown], flag

