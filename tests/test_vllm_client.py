"""The vLLM client's events from a server's stream: blocks rebuilt from vLLM's per-step record."""

from __future__ import annotations

import queue

import pytest

from dflash_core.events import Block, Prefill, Summary
from dflash_core.vllm.client import VllmServerError, _events, served_model


def chunks(*items) -> queue.Queue:
    q: queue.Queue = queue.Queue()
    for at, chunk in items:
        q.put((at, chunk))
    return q


def delta(ids, finish=None):
    return {"choices": [{"token_ids": ids, "finish_reason": finish}]}


def test_the_summary_takes_its_blocks_from_vllms_per_step_record():
    # Chunks as a client that fell behind sees them: steps 2 and 3 merged into one chunk.
    stream = chunks(
        (0.5, {"prompt_token_ids": [1, 2, 3], "choices": [{"token_ids": [10]}]}),
        (0.7, delta([11, 12, 13])),
        (0.9, delta([14, 15, 16])),
        (1.0, delta([17], finish="length")),
        (1.0, {"choices": [], "metrics": {"speculative_decoding": {"per_step_accepted": [2, 0, 1, 0]}}}),
        (1.0, None),
    )
    events = list(_events(stream, 0.0, block_size=4))
    assert isinstance(events[0], Prefill) and events[0].token_id == 10 and events[0].prompt_len == 3
    streamed = [e for e in events if isinstance(e, Block)]
    assert [b.committed_ids for b in streamed] == [(11, 12, 13), (14, 15, 16), (17,)]
    summary = events[-1]
    assert isinstance(summary, Summary) and summary.output_ids == tuple(range(10, 18))
    assert [(b.committed_ids, b.accepted) for b in summary.blocks] == [
        ((11, 12, 13), 2), ((14,), 0), ((15, 16), 1), ((17,), 0)]
    assert summary.tau == pytest.approx(7 / 4) and summary.stop_reason == "max_new_tokens"
    # Slot 0 of each block is the token before it; times are those of the chunk that carried it.
    assert [b.position for b in summary.blocks] == [3, 6, 7, 9]
    assert [b.elapsed_s for b in summary.blocks] == [0.7, 0.9, 0.9, 1.0] and summary.total_s == 1.0


def test_without_a_per_step_record_the_streamed_chunks_are_the_blocks():
    stream = chunks((0.1, delta([5])), (0.2, delta([6])), (0.3, delta([7], finish="stop")), (0.3, None))
    summary = list(_events(stream, 0.0, block_size=1))[-1]
    assert [b.committed_ids for b in summary.blocks] == [(6,), (7,)] and summary.tau == 1.0
    assert summary.stop_reason == "stop_token"


def test_a_server_error_mid_stream_is_raised_as_its_message():
    stream = chunks((0.1, delta([5])), (0.2, VllmServerError("the stream from X broke: reset")))
    with pytest.raises(VllmServerError, match="broke: reset"):
        list(_events(stream, 0.0, block_size=4))


def test_no_server_at_the_url_is_named():
    from serve import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(VllmServerError, match=f"no vLLM server answers at {url}.*scripts/serve_vllm.sh"):
        served_model(url)
