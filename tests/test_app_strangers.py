"""A shared server strangers cannot hurt, third pass: each finding of the third attack on a live app
as a test over HTTP (loopback only) that failed on the code before.

No file route fetches a URL and no look-up leaves the machine; parallel uploads cannot pass the
hourly budget together; replays of one upload are parsed once, after the visitor's place is
taken; a race is bounded by its lane-tokens and its frames' bytes; the open-stream table is
bounded; a race runs on the pair the page shows. Visitors are told apart by their loopback
source address (127.0.0.2, 127.0.0.3, ...), as the server's per-visitor bounds tell them apart.
"""

from __future__ import annotations

import asyncio
import threading
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
