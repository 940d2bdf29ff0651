"""The serving view: the concurrency sweep on a vLLM pair's servers (fakes in this
process), drawn after each level; its bounds and their messages; in the race queue; the how-to where
the app has no vLLM pair."""

from __future__ import annotations

import html
import time
from types import SimpleNamespace

import gradio as gr
import pytest
from fake_vllm import FakeVllm

from app.guard.limits import Limits
from app.guard.readers import Readers
from app.pairs.registry import cli_pair, vllm_pair
from app.serve.serving import Serving
from app.view import texts


@pytest.fixture
def fakes():
    dflash, plain = FakeVllm(k=3, accepted=1), FakeVllm()
    yield dflash, plain
    dflash.close(), plain.close()


def serving_on(fakes, limits=None, readers=None) -> Serving:
    dflash, plain = fakes
    spec = vllm_pair(dflash.url, plain.url, 4)
    return Serving({"cli": cli_pair("t", "d"), spec.id: spec}, limits or Limits(), readers)


def test_the_sweep_is_drawn_after_each_level(fakes):
    serving = serving_on(fakes)
    assert f"to the DFlash server ({fakes[0].url}) and *c* to the plain one ({fakes[1].url})" in serving.intro()
    frames = list(serving.sweep([4, "1", 2], 9, "cli"))  # a local pair selected: the app's vLLM pair runs
    assert len(frames) == 4
    statuses = [status for _, _, status in frames]
    assert statuses[0].endswith("level 1 running…") and "K = 3" in statuses[0] and "9 new tokens" in statuses[0]
    assert statuses[1].endswith("level 2 running…") and statuses[2].endswith("level 4 running…")
    assert statuses[3] == texts.SERVING_PAYS or statuses[3].startswith("Done. From concurrency")
    for shown, (figure, table, _) in enumerate(frames):
        assert table.count("<tr>") == 1 + shown  # the head and one row per level finished
        dflash_tok_s = figure.data[0]
        assert list(dflash_tok_s.x or ()) == [1, 2, 4][:shown] and dflash_tok_s.name.startswith("DFlash (labels: speedup")
    figure, table, _ = frames[-1]
    assert "<td>2.00</td><td>16/16</td>" in table  # level 4: acceptance length, outputs equal to plain's
    assert fakes[0].served == fakes[1].served == 1 + 4 * (1 + 2 + 4)


@pytest.mark.parametrize("levels,tokens,message", [
    ([16], 8, "concurrency level 16 is out of range: levels are 1 to 8"),
    ([0, 1], 8, "concurrency level 0 is out of range: levels are 1 to 8"),
    ([1, 2, 3, 4, 5], 8, "5 concurrency levels given; a sweep runs at most 4"),
    (["<img src=x>"], 8, "a concurrency level must be a whole number, got '&lt;img src=x&gt;'"),
    ([], 8, "no concurrency level given"),
    ([1], 65, "max_new_tokens must be between 1 and 64, got 65"),
    ([1], "a lot", "max_new_tokens must be a whole number, got 'a lot'"),
])
def test_requests_out_of_bounds_are_refused_before_anything_is_sent(fakes, levels, tokens, message):
    with pytest.raises(gr.Error) as caught:
        list(serving_on(fakes).sweep(levels, tokens))
    assert caught.value.message.startswith(message)
    assert fakes[0].served == fakes[1].served == 0


def test_the_app_limits_bound_the_tokens_and_the_time(fakes):
    with pytest.raises(gr.Error, match="max_new_tokens must be between 1 and 16, got 17"):
        list(serving_on(fakes, Limits(max_new_tokens=16)).sweep([1], 17))
    fakes[0].delay_s = fakes[1].delay_s = 0.1  # 0.8 s a request: the 1 s budget ends inside level 1
    started = time.perf_counter()
    frames = list(serving_on(fakes, Limits(max_race_s=1)).sweep([1, 2, 4], 8))
    assert time.perf_counter() - started < 10
    table = frames[-1][1]
    assert table.count(html.escape("not run: the sweep's time budget (1 s) was spent")) >= 2
    assert fakes[0].served + fakes[1].served <= 4  # the warm-ups, then no request starts past the budget


def test_the_sweep_stops_sending_once_nobody_reads_the_page(fakes):
    readers = Readers(grace_s=0)
    readers.opened("gone"), readers.closed("gone")
    frames = list(serving_on(fakes, readers=readers).sweep([1, 2], 8, None, SimpleNamespace(session_hash="gone")))
    assert frames[-1][1].count("not run: stopped") == 2 and frames[-1][2] == texts.SERVING_NONE
    assert fakes[0].served == fakes[1].served == 1  # the warm-ups only


def test_servers_that_do_not_answer_are_named_in_the_status(fakes):
    spec = vllm_pair("http://127.0.0.1:9", None, 4)
    [(_, _, status)] = list(Serving({spec.id: spec}, Limits()).sweep([1], 8))
    assert status.startswith("⚠ **The sweep stopped:** no vLLM server answers at http://127.0.0.1:9")
    swapped = vllm_pair(fakes[1].url, fakes[0].url, 4)
    [(_, _, status)] = list(Serving({swapped.id: swapped}, Limits()).sweep([1], 8))
    assert f"{fakes[1].url} reports no speculative-decoding counters" in status


def test_without_a_vllm_pair_the_view_says_how_to_start_one():
    serving = Serving({"cli": cli_pair("t", "d")}, Limits())
    assert serving.intro() == texts.SERVING_NO_VLLM and "bash scripts/serve_vllm.sh" in texts.SERVING_NO_VLLM
    with pytest.raises(gr.Error) as caught:
        list(serving.sweep([1], 8))
    assert caught.value.message == html.escape(texts.SERVING_NO_VLLM, quote=False)


def test_the_sweep_runs_in_the_race_queue_and_only_where_pairs_race_live():
    from app.pairs.models import PairCache
    from app.ui import build_demo

    spec = vllm_pair("http://127.0.0.1:9", None, 4)
    demo = build_demo([spec], spec.id, PairCache("cpu"), Limits(concurrency=2))
    fns = {f.api_name: f for f in demo.fns.values()}
    assert fns["serving_sweep"].concurrency_id == fns["compare"].concurrency_id == "race"
    assert fns["serving_sweep"].concurrency_limit == fns["compare"].concurrency_limit == 2
    replay_only = build_demo([], "", live=False)
    assert "serving_sweep" not in {f.api_name for f in replay_only.fns.values()}
