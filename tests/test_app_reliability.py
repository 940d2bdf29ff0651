"""The app's bounds at work on the tiny pair: Stop, the queue bound, the token limit, trace files."""

from __future__ import annotations

import time

import pytest

gradio_client = pytest.importorskip("gradio_client")

from gradio_client.exceptions import AppError  # noqa: E402
from serve import launch_app  # noqa: E402

from app.guard.limits import Limits  # noqa: E402
from app.pairs.models import PairCache  # noqa: E402
from app.pairs.registry import cli_pair  # noqa: E402
from app.ui import App  # noqa: E402
from app.view.frames import FRAME_FIELDS  # noqa: E402


class Visitor:
    """Stands in for gr.Request: all a handler reads from it is the session."""

    def __init__(self, session_hash: str):
        self.session_hash = session_hash


def app_of(demo) -> App:
    return next(f.fn for f in demo.fns.values() if f.name == "compare").__self__


@pytest.fixture(scope="module")
def tiny_spec(tiny_dirs):
    return cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))


def test_stop_ends_the_race_within_one_cycle_and_the_next_starts_at_once(tiny_spec):
    cache = PairCache("cpu")
    app = App([tiny_spec], tiny_spec.id, cache)
    pair = cache.get(tiny_spec)
    computed = []
    step = pair.drafter.forward

    def counted(*args, **kwargs):  # one drafter pass per DFlash cycle
        computed.append(1)
        return step(*args, **kwargs)

    pair.drafter.forward = counted
    try:
        frames = app.live.compare("Tell me a long story.", 400, 4, 0.0, 1.0, 0, request=Visitor("s1"))
        for values in frames:
            if values[FRAME_FIELDS.index("dflash_tokens")].count('class="tok ') >= 3:  # tokens on screen: the race is running
                break
        cycles_at_stop = len(computed)
        assert app.live.stops.request("s1") is True
        last = list(frames)
    finally:
        pair.drafter.forward = step
    # A stopped race ends with its text, then (once the browser can have drawn it) its hover boxes and charts.
    assert len(last) == 2, "the race ends with two final frames"
    summary_html, report = last[0][0], last[-1][-2]
    assert report["stopped"] is True and "Stopped" in summary_html
    assert report["dflash_tokens"] < 400 and len(computed) - cycles_at_stop <= 1
    assert not pair.lock.locked() and len(app.live.stops) == 0
    t0 = time.perf_counter()
    nxt = list(app.live.compare("hi", 4, 4, 0.0, 1.0, 0, request=Visitor("s1")))
    assert nxt[-1][-2]["stopped"] is False and nxt[-1][-2]["identical"] is True
    assert time.perf_counter() - t0 < 30


@pytest.fixture(scope="module")
def bounded(tiny_dirs, one_thread):
    cache = PairCache("cpu")
    demo, url = launch_app(*tiny_dirs, limits=Limits(max_queue=1, max_prompt_tokens=30), cache=cache)
    yield demo, url, cache
    demo.close()


def test_beyond_the_queue_bound_a_visitor_is_told_the_server_is_busy(bounded, tiny_spec):
    demo, url, cache = bounded
    pair = cache.get(next(s for s in app_of(demo).pairs.values() if s.target == tiny_spec.target))
    clients = [gradio_client.Client(url, verbose=False) for _ in range(3)]
    with pair.lock:  # the running race waits here, holding the one slot
        running = clients[0].submit("hi", 4, 4, 0.0, 1.0, 0, api_name="/compare")
        deadline = time.time() + 30
        while running.status().code.name not in ("PROCESSING", "ITERATING"):
            assert time.time() < deadline
            time.sleep(0.05)
        waiting = clients[1].submit("hi", 4, 4, 0.0, 1.0, 0, api_name="/compare")
        time.sleep(0.5)
        with pytest.raises(Exception, match="Queue is full"):
            clients[2].predict("hi", 4, 4, 0.0, 1.0, 0, api_name="/compare")
    assert running.result(timeout=60)[-2]["identical"] is True
    assert waiting.result(timeout=60)[-2]["identical"] is True


def test_token_limit_names_the_prompt_the_limit_and_the_context(bounded):
    _, url, _ = bounded
    client = gradio_client.Client(url, verbose=False)
    with pytest.raises(AppError) as excinfo:
        client.predict("The quick brown fox jumps over the lazy dog. " * 6, 4, 4, 0.0, 1.0, 0, api_name="/compare")
    message = str(excinfo.value)
    assert "tokens after the chat template" in message and "at most 30" in message and "512 positions" in message
    assert client.predict("hi", 4, 4, 0.0, 1.0, 0, api_name="/compare")[-2]["identical"] is True


def test_trace_files_do_not_accumulate_over_20_races(bounded):
    demo, url, _ = bounded
    store = app_of(demo).traces
    before = set(store.files())  # earlier tests' sessions (they may end, and their files go, meanwhile)
    clients = [gradio_client.Client(url, verbose=False) for _ in range(2)]
    for i in range(20):
        clients[i % 2].predict(f"race {i}", 2, 4, 0.0, 1.0, 0, api_name="/compare")
        assert len(set(store.files()) - before) <= 2 * store.per_session
    assert len(set(store.files()) - before) == 2 * store.per_session
    before = len(before)
    # Gradio serves them from where they are: no copies pile up in its cache either.
    served = demo.blocks[next(k for k, b in demo.blocks.items() if getattr(b, "elem_id", None) == "trace")]
    assert len(served.temp_files) <= before + 2 * store.per_session
