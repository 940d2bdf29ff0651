"""The app's bounds without a server: request checks, the token limit, Stop in the race, trace files."""

from __future__ import annotations

import math

import pytest

from app.guard.limits import Limits, check_prompt_tokens, check_request
from app.guard.traces import TraceStore
from app.race.interleave import race
from app.race.report import race_report
from app.race.stopping import StopRequests
from dflash_core import Block, Prefill, Summary

LIMITS = Limits(max_new_tokens=64, max_prompt_chars=100)
GOOD = ("hi", 8, 4, 0.0, 1.0, 0)


def test_a_good_request_comes_back_typed():
    req = check_request(LIMITS, "pair", "hi", 8.0, "4", 0, 1, 7.0)
    assert (req.max_new_tokens, req.block_size, req.sampling.seed) == (8, 4, 7)
    assert check_request(LIMITS, "pair", "hi", 8, 4, 0.7, 0.9, None).sampling.seed is None


@pytest.mark.parametrize(
    "index, value, message",
    [
        (0, None, "must be text"),
        (0, 12, "must be text"),
        (0, " \n\t", "empty"),
        (0, "x" * 101, "101 characters; the limit is 100"),
        (0, "a\ud800b", r"surrogate\) at position 1"),
        (1, 0, "between 1 and 64"),
        (1, 65, "between 1 and 64"),
        (1, 2.5, "whole number"),
        (1, math.nan, "finite"),
        (1, math.inf, "finite"),
        (1, "ten", "must be a number"),
        (1, [8], "must be a number"),
        (1, True, "must be a number"),
        (2, 0, "at least 1"),
        (3, -0.5, "temperature"),
        (3, math.nan, "finite"),
        (4, 0.0, "top_p"),
        (4, 1.5, "top_p"),
        (5, -1, "between 0 and"),
        (5, 2**64, "between 0 and"),
        (5, -math.inf, "finite"),
    ],
)
def test_bad_values_are_named_in_the_message(index, value, message):
    args = list(GOOD)
    args[index] = value
    with pytest.raises(ValueError, match=message):
        check_request(LIMITS, "pair", *args)


def test_limits_reject_nonsense_bounds():
    with pytest.raises(ValueError, match="max_queue"):
        Limits(max_queue=0)


def test_token_limit_message_names_the_prompt_the_flag_and_the_context():
    limits = Limits(max_prompt_tokens=50)
    check_prompt_tokens(50, limits, 512)
    with pytest.raises(ValueError) as over_flag:
        check_prompt_tokens(51, limits, 512)
    assert "51 tokens" in str(over_flag.value) and "at most 50" in str(over_flag.value)
    assert "512 positions" in str(over_flag.value)
    with pytest.raises(ValueError, match="context holds 40 positions"):
        check_prompt_tokens(45, limits, 40)


def _counting_events(block_size, n_blocks, pulled):
    """An engine run that counts how many events were computed (pulled from it)."""

    def gen():
        pulled.append("prefill")
        yield Prefill(3, 7, 0.01)
        out, blocks = [7], []
        for i in range(n_blocks):
            pulled.append(i)
            ids = tuple(range(block_size))
            b = Block(i, 3 + len(out) - 1, tuple(range(block_size - 1)), block_size - 1, 0, ids, 0.005, 0.005, 0.01 * (i + 2))
            out.extend(ids)
            blocks.append(b)
            yield b
        yield Summary(tuple(out), 3, block_size, "max_new_tokens", Prefill(3, 7, 0.01), tuple(blocks), 0.01 * (n_blocks + 1))

    return gen()


def test_stop_ends_the_race_before_the_next_cycle_and_keeps_what_was_shown():
    d_pulled, p_pulled = [], []
    asked = []
    frames = []
    snapshots = race(
        {"dflash": _counting_events(4, 50, d_pulled), "plain": _counting_events(1, 200, p_pulled)},
        block_sizes={"dflash": 4},
        pace=False,
        frame_s=0.0,
        stop=lambda: bool(asked),
    )
    for snap in snapshots:
        frames.append(snap)
        if len(frames) == 5:
            computed = len(d_pulled) + len(p_pulled)
            asked.append(True)
    last = frames[-1]
    assert last.stopped and last.done and len(frames) == 6
    assert len(d_pulled) + len(p_pulled) == computed, "no engine step after Stop"
    # What the last frame before Stop showed is still shown, nothing more.
    assert last.dflash.output_ids == frames[-2].dflash.output_ids and last.plain.output_ids == frames[-2].plain.output_ids
    d, p = last.dflash.as_summary("stopped"), last.plain.as_summary("stopped")
    assert d.stop_reason == "stopped" and len(d.output_ids) > len(p.output_ids)
    report = race_report(d, p, 0.0, 4, stopped=True)
    assert report.stopped and report.identical is None, "no lossless verdict on outputs of different lengths"
    same = race_report(d, d, 0.0, 4, stopped=True)
    assert same.identical is True


def test_stop_requests_reach_only_a_running_race_and_leave_nothing_behind():
    stops = StopRequests()
    assert stops.request("s1") is False
    with stops.running("s1") as flag:
        assert not flag.is_set() and stops.request("s2") is False
        assert stops.request("s1") is True and flag.is_set()
    assert len(stops) == 0


def test_trace_files_are_bounded_per_session_and_in_total_and_go_with_their_session(tmp_path):
    forgotten = []
    store = TraceStore(tmp_path / "traces", per_session=3, total=5, on_delete=forgotten.append)
    paths = [store.write("a", {"runs": {}, "i": i}) for i in range(20)]
    assert [p.name for p in store.files()] == ["dflash_trace.json"] * 3
    assert sorted(map(str, store.files())) == sorted(paths[-3:])
    for session in "bcd":
        store.write(session, {"runs": {}, "s": session})
    assert len(store.files()) == 5 and len(forgotten) == 23 - 5
    store.end_session("a")
    assert len(store.files()) == 3
    store.close()
    assert not (tmp_path / "traces").exists()
