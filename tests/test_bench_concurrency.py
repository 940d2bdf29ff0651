"""Throughput across concurrency (`python -m dflash_core.bench --peer vllm --concurrency ...`) against
fake vLLM servers in this process: every level reported, that many requests at once, vLLM's
acceptance length from the counters, outputs compared, the bounds and their messages."""

from __future__ import annotations

import json
import threading

import pytest
from fake_vllm import FakeVllm

from dflash_core.vllm.client import served_model, spec_counters
from dflash_core.vllm.sweep import (
    Bounds,
    Settings,
    SweepError,
    check_servers,
    check_settings,
    parse_levels,
    stops_paying,
    sweep,
    uneven_levels,
)

PROMPTS = ["one", "two", "three"]


@pytest.fixture
def servers():
    dflash, plain = FakeVllm(k=3, accepted=1, delay_s=0.01), FakeVllm(delay_s=0.01)
    yield dflash, plain
    dflash.close(), plain.close()


def test_the_sweep_reports_every_level_with_that_many_requests_at_once(servers):
    fake_dflash, fake_plain = servers
    dflash, plain, k = check_servers(fake_dflash.url, fake_plain.url)
    assert k == 3
    levels, seen = [], []
    for level in sweep(dflash, plain, Settings((1, 2, 4), max_new_tokens=9, rounds=2), PROMPTS):
        levels.append(level)
        seen.append((fake_dflash.most_at_once, fake_plain.most_at_once))
        for fake in servers:  # the next level's requests wait for each other: all of them at once
            fake.gather = threading.Barrier({1: 2, 2: 4}.get(level.level, 1))
    assert [lv.level for lv in levels] == [1, 2, 4]
    # the most requests each server had at once, after each level (the warm-up sends one)
    assert seen == [(1, 1), (2, 2), (4, 4)]
    for lv in levels:
        for run in (lv.plain, lv.dflash):
            assert run.requests == run.finished == 2 * lv.level and run.output_tokens == 9 * 2 * lv.level
            assert run.tok_s == pytest.approx(run.output_tokens / run.seconds)
            assert 0 < run.mean_latency_s <= run.p90_latency_s <= run.seconds
        # 8 tokens after the first in steps of 1 accepted draft + the bonus: 1 + 4 / 4
        assert lv.dflash.acceptance_length == 2.0 and lv.plain.acceptance_length is None
        assert lv.identical == (2 * lv.level, 2 * lv.level) and lv.note is None
        assert lv.speedup == pytest.approx(lv.dflash.tok_s / lv.plain.tok_s)
    assert fake_dflash.served == fake_plain.served == 1 + 2 * (1 + 2 + 4)
    data = levels[-1].to_dict()
    assert data["level"] == 4 and data["identical"] == data["compared"] == 8 and "outputs" not in data["dflash"]


@pytest.mark.parametrize("together", [True, False])
def test_both_servers_are_asked_at_once_or_one_after_the_other(together):
    fake_dflash, fake_plain = FakeVllm(k=3, delay_s=0.1), FakeVllm(delay_s=0.1)
    try:
        dflash, plain, _ = check_servers(fake_dflash.url, fake_plain.url)
        [level] = sweep(dflash, plain, Settings((1,), max_new_tokens=5, rounds=1, together=together), PROMPTS)
    finally:
        fake_dflash.close(), fake_plain.close()
    assert level.identical == (1, 1)
    (d_start, d_end), (p_start, p_end) = fake_dflash.spans[-1], fake_plain.spans[-1]  # the level's requests
    overlap = min(d_end, p_end) - max(d_start, p_start)
    assert overlap > 0.25 if together else (overlap < 0 and d_end < p_start)


def test_outputs_that_differ_from_plain_are_counted():
    fake_dflash, fake_plain = FakeVllm(k=3, corrupt={"two"}), FakeVllm()
    try:
        dflash, plain, _ = check_servers(fake_dflash.url, fake_plain.url)
        [level] = sweep(dflash, plain, Settings((3,), max_new_tokens=5, rounds=2), PROMPTS)
    finally:
        fake_dflash.close(), fake_plain.close()
    assert level.identical == (4, 6)  # requests 1 and 4 sent "two"


def test_the_time_budget_cuts_the_level_under_way_and_reports_the_rest_unrun(servers):
    fake_dflash, fake_plain = servers
    dflash, plain, _ = check_servers(fake_dflash.url, fake_plain.url)

    def clock():  # one second per request served: the warm-ups end at 2 s, the budget at 4.5 s
        return fake_dflash.served + fake_plain.served

    settings = Settings((1, 2, 4), max_new_tokens=3, rounds=4, max_seconds=4.5, together=False)
    levels = list(sweep(dflash, plain, settings, PROMPTS, clock=clock))
    assert [lv.level for lv in levels] == [1, 2, 4]
    first = levels[0]
    assert first.note == "cut at the time budget: requests finished dflash 3/4, plain 0/4"
    assert (first.dflash.finished, first.dflash.mean_latency_s, first.plain.finished) == (3, 1, 0)
    assert first.plain.mean_latency_s is None and first.plain.tok_s == 0 and first.identical == (0, 0)
    assert [lv.note for lv in levels[1:]] == ["not run: the sweep's time budget (4.5 s) was spent"] * 2
    assert levels[1].plain is None and levels[1].speedup is None and levels[1].identical == (0, 0)
    assert fake_dflash.served + fake_plain.served == 5


def test_a_stop_reports_the_remaining_levels_unrun(servers):
    fake_dflash, fake_plain = servers
    dflash, plain, _ = check_servers(fake_dflash.url, fake_plain.url)
    levels = []
    for level in sweep(dflash, plain, Settings((1, 2, 4), max_new_tokens=3, rounds=1), PROMPTS,
                       stop=lambda: len(levels) >= 1):
        levels.append(level)  # noqa: PERF402 - the stop reads the list while the sweep runs
    assert levels[0].note is None and levels[0].identical == (1, 1)
    assert [lv.note for lv in levels[1:]] == ["not run: stopped"] * 2


@pytest.mark.parametrize("levels,message", [
    ("0", "concurrency level 0 is out of range: levels are 1 to 64"),
    ("1,-2", "concurrency level -2 is out of range: levels are 1 to 64"),
    ("1,65", "concurrency level 65 is out of range: levels are 1 to 64"),
    ("1,2.5", "a concurrency level must be a whole number, got '2.5'"),
    ("1,four", "a concurrency level must be a whole number, got 'four'"),
    ("9" * 40, "a concurrency level must be a whole number, got '9999"),
    ("", "no concurrency level given: pass levels such as 1,2,4,8"),
    ("4,2,4", "concurrency level 4 is given twice"),
    ("1,2,3,4,5,6,7,8,9", "9 concurrency levels given; a sweep runs at most 8"),
    ([1, True], "a concurrency level must be a whole number, got 'True'"),
])
def test_bad_levels_are_named(levels, message):
    with pytest.raises(SweepError) as caught:
        parse_levels(levels)
    assert str(caught.value).startswith(message)


def test_levels_are_sorted_and_other_bounds_named():
    assert parse_levels("32, 1,4") == (1, 4, 32) and parse_levels([2, 1.0, "8"]) == (1, 2, 8)
    assert check_settings("1,2", 64, 2, 900) == Settings((1, 2), 64, 2, 900.0, together=True)
    small = Bounds(max_level=8, max_levels=3, max_requests=16, max_new_tokens=32, max_seconds=60)
    for args, message in [
        (("1,16", 8, 1, 10), "concurrency level 16 is out of range: levels are 1 to 8"),
        (("1,8", 8, 3, 10), "level 8 x 3 rounds is 24 requests per server; a level sends at most 16"),
        (("1", 33, 1, 10), "max_new_tokens must be between 1 and 32, got 33"),
        (("1", 8, 0, 10), "rounds must be at least 1, got 0"),
        (("1", 8, 1, 61), "the time budget must be more than 0 and at most 60 s, got 61"),
        (("1", 8, 1, float("nan")), "the time budget must be more than 0 and at most 60 s, got nan"),
    ]:
        with pytest.raises(SweepError, match=message.replace(".", r"\.")):
            check_settings(*args, bounds=small)


def test_the_counters_are_read_from_metrics_and_a_plain_server_has_none(servers):
    fake_dflash, fake_plain = servers
    fake_dflash.drafts, fake_dflash.draft_tokens, fake_dflash.accepted_total = 23, 69, 24
    counters = spec_counters(served_model(fake_dflash.url))
    assert (counters.drafts, counters.draft_tokens, counters.accepted, counters.positions) == (23, 69, 24, 3)
    assert spec_counters(served_model(fake_plain.url)) is None


def test_servers_that_are_not_a_pair_are_refused(servers):
    fake_dflash, fake_plain = servers
    with pytest.raises(SweepError, match=f"{fake_plain.url} reports no speculative-decoding counters"):
        check_servers(fake_plain.url, fake_plain.url)
    with pytest.raises(SweepError, match=f"{fake_dflash.url} speculates too"):
        check_servers(fake_dflash.url, fake_dflash.url)
    other = FakeVllm(model="other")
    try:
        with pytest.raises(SweepError, match="the two servers serve different models: tiny at .*, other at"):
            check_servers(fake_dflash.url, other.url)
    finally:
        other.close()


def test_stops_paying_is_the_level_from_which_dflash_stays_slower():
    from dflash_core.vllm.sweep import Level, ServerRun

    def level(n, plain, dflash):
        def run(tok_s):
            return ServerRun(1, 1, 1.0, int(tok_s), tok_s, 1.0, 1.0, None)
        return Level(n, run(plain), run(dflash))

    assert stops_paying([level(1, 10, 12), level(2, 10, 9), level(4, 10, 11), level(8, 10, 8), level(16, 10, 7)]) == 8
    assert stops_paying([level(1, 10, 12), level(2, 10, 11)]) is None


def test_the_command_line_writes_the_table_and_json(servers, tmp_path, capsys):
    from dflash_core.bench.__main__ import main

    fake_dflash, fake_plain = servers
    out = tmp_path / "sweep.json"
    assert main(["--peer", "vllm", "--concurrency", "2,1", "--vllm-url", fake_dflash.url, "--vllm-plain-url",
                 fake_plain.url, "--max-new-tokens", "9", "--rounds", "1", "--num-prompts", "3",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| concurrency | requests | plain tok/s | DFlash tok/s | speedup |" in printed
    assert "| 2 | 2 |" in printed and "| 2.00 | 2/2 |" in printed
    data = json.loads(out.read_text())
    assert json.loads(printed.strip().splitlines()[-1]) == data
    assert [lv["level"] for lv in data["levels"]] == [1, 2]
    assert data["num_speculative_tokens"] == 3 and data["prompts"] == 3 and data["rounds"] == 1
    assert data["levels"][0]["dflash"]["acceptance_length"] == 2.0 and data["max_new_tokens"] == 9
    assert "note: at levels 1,2, 1 requests per client send the 3 prompts unequally often" in printed
    assert data["uneven_prompt_mix"] == [1, 2]


def test_levels_whose_requests_send_another_mix_of_prompts_are_named():
    assert uneven_levels(Settings((1, 2, 4, 8, 16, 32), rounds=4), 4) == []
    assert uneven_levels(Settings((1, 2, 4, 8), rounds=2), 8) == [1, 2]
    assert uneven_levels(Settings((3, 6), rounds=1), 3) == []


@pytest.mark.parametrize("argv,message", [
    (["--peer", "vllm", "--concurrency", "0"], "concurrency level 0 is out of range"),
    (["--peer", "vllm", "--concurrency", "1,x"], "a concurrency level must be a whole number, got 'x'"),
    (["--concurrency", "1"], "--concurrency sweeps two vLLM servers: give it with --peer vllm alone"),
    (["--peer", "vllm", "--peer", "reference", "--concurrency", "1"], "with --peer vllm alone"),
])
def test_the_command_line_names_bad_arguments(argv, message, capsys):
    from dflash_core.bench.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_the_command_line_names_a_server_that_does_not_answer(capsys):
    import socket

    from dflash_core.bench.__main__ import main

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert main(["--peer", "vllm", "--concurrency", "1", "--vllm-url", url]) == 1
    assert f"error: no vLLM server answers at {url}" in capsys.readouterr().err
