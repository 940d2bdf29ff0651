"""Unit tests of the app's pure parts: token rendering, draft strip, charts, race pacing, report."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
from fake_runs import run_events

from app.race.interleave import SideView, race
from app.race.lanes import COLORS
from app.race.report import first_difference, race_report
from app.race.tokens import TokenPieces
from app.view import charts, render
from dflash_core import Block, Prefill, Summary

TEXT = {1: "<b>&amp;", 2: " ok", 3: "\n", 4: "x", 5: "y", 9: "END"}


def text_of(token_id: int) -> str:
    return TEXT.get(token_id, f"t{token_id}")


def block(index, draft, accepted, bonus, committed=None, position=0, passes=0):
    committed = committed if committed is not None else (*draft[:accepted], bonus)
    return Block(index, position, tuple(draft), accepted, bonus, tuple(committed), 0.01, 0.02, 0.03 * (index + 1), passes)


def view(blocks=(), prefill=True, block_size=4, name="dflash"):
    return SideView(
        name,
        Prefill(5, 1, 0.05) if prefill else None,
        tuple(blocks),
        None,
        0.5,
        block_size,
        ((0.05, 1), (0.5, 4)) if prefill else (),
    )


def pieces_for(v: SideView) -> list[str]:
    return [text_of(t) for t in v.output_ids]


def test_tokens_are_escaped_and_colored_by_kind():
    v = view([block(0, [2, 3, 4], accepted=2, bonus=5)])
    marks = render.lane_marks(v)
    assert [m.kind for m in marks] == ["first", "accepted", "accepted", "bonus"]
    assert [m.slot for m in marks] == [None, 1, 2, 3]
    out = render.tokens_html(marks, pieces_for(v), text_of)
    assert "&lt;b&gt;&amp;amp;" in out and "<b>" not in out
    assert out.count("tok tok-accepted") == 2
    assert 'class="tok tok-bonus" data-block="0" data-slot="3"' in out
    # The bonus replaced the rejected draft token 4 ("x"): the hover says so.
    assert "drafter proposed &#x27;x&#x27; here (rejected)" in out
    # One block boundary per block plus the prefill token.
    assert out.count(" tok-start") == 2


def test_empty_and_one_token_runs():
    empty = view([], prefill=False)
    assert "waiting for tokens" in render.tokens_html(render.lane_marks(empty), [], text_of)
    assert render.draft_strip_html(empty, text_of) == ""
    one = view([])
    out = render.tokens_html(render.lane_marks(one), pieces_for(one), text_of)
    assert out.count('class="tok ') == 1 and "tok-first" in out
    for fig in (
        charts.acceptance_figure({"dflash": empty}),
        charts.histogram_figure({"dflash": empty}),
        charts.position_figure({"dflash": empty}),
        charts.speed_figure({"dflash": empty, "plain": empty}),
        charts.acceptance_figure({"dflash": one}),
        charts.acceptance_figure({}),
    ):
        assert isinstance(fig, go.Figure) and not fig.data and fig.layout.annotations


def test_plain_tokens_and_first_difference_outline():
    v = view([block(0, [], 0, 2), block(1, [], 0, 9)], block_size=1, name="plain")
    out = render.tokens_html(render.plain_marks(v), pieces_for(v), text_of, diff_at=1)
    assert out.count("tok-plain") == 3
    assert out.count(f"outline:2px solid {render.DIFF}") == 1
    assert "first position where DFlash and plain decoding differ" in out
    ar = render.tokens_html(render.plain_marks(v), pieces_for(v), text_of, diff_at=1, lane="AR drafter")
    assert "first position where AR drafter and plain decoding differ" in ar
    assert "border-left" not in out  # plain decoding has no blocks worth marking


def test_draft_strip_shows_rejected_drafts():
    v = view([block(0, [2, 1, 4], accepted=1, bonus=5), block(1, [3, 3, 3], accepted=3, bonus=9)])
    strip = render.draft_strip_html(v, text_of)
    assert strip.count("chip-rejected") == 2 and strip.count("chip-accepted") == 4
    assert "style=" not in strip.split("</summary>")[1]  # every chip styled by class (`STRIP_CSS`): a frame's bytes
    assert "&lt;b&gt;&amp;amp;" in strip and "⏎" in strip  # escaped, and newlines made visible
    assert "#1 · 3 drafts: 1 kept + 1 bonus" in strip and "#2 · 3 drafts: 3 kept + 1 bonus" in strip


def test_draft_strip_marks_the_drafts_a_block_schedule_left_unverified():
    from dataclasses import replace

    cut = replace(block(0, [2, 3, 4, 5, 9], accepted=2, bonus=4), verify_len=3)  # 2 of 5 drafts verified, both kept
    rejected = replace(block(1, [3, 3, 3, 3, 3], accepted=0, bonus=9), verify_len=3)  # slot 1 rejected, slots 3-5 cut
    whole = replace(block(2, [2, 2, 2, 2, 2], accepted=5, bonus=9), verify_len=6)
    v = view([cut, rejected, whole], block_size=6, name="scheduled")
    strip = render.draft_strip_html(v, text_of, tips=True)
    # The label names the drafts verified and kept, cycles counted from 1.
    assert "#1 · 2 of 5 drafts verified: 2 kept + 1 bonus" in strip
    assert "#2 · 2 of 5 drafts verified: 0 kept + 1 bonus" in strip and "#3 · 5 drafts: 5 kept + 1 bonus" in strip
    assert strip.count('class="chip chip-unverified"') == 6 and strip.count('class="chip chip-rejected') == 2
    # The draft the target replaced is drawn fully (`chip-cut`), the rejected ones after it faded.
    assert strip.count('class="chip chip-rejected chip-cut"') == 1
    assert strip.count('class="chip chip-accepted"') == 7
    assert "not verified" in strip.split("</summary>")[0]
    # The first cut block's bonus and its unverified drafts say the schedule cut them, not a rejection.
    first = strip.split('data-block="1"')[0]
    assert "All 2 verified drafts were accepted" in first and "Rejected" not in first
    assert "Not verified: the block schedule verified 2 of this cycle&#x27;s 5 drafts" in strip
    # A fixed block's strip has no unverified chips and the old labels.
    fixed = render.draft_strip_html(view([block(0, [2, 1, 4], accepted=1, bonus=5)]), text_of)
    assert "chip-unverified" not in fixed and "#1 · 3 drafts: 1 kept + 1 bonus" in fixed and "not verified" not in fixed
    assert "draft not verified" in render.legend_html()


def test_acceptance_chart_draws_the_scheduled_lanes_verified_length_per_cycle():
    from dataclasses import replace

    blocks = [replace(block(i, [2, 3, 4, 5, 9], accepted=1, bonus=4), verify_len=n) for i, n in enumerate((2, 6, 3))]
    fig = charts.acceptance_figure({"dflash": view([block(0, [2, 3, 4], 3, 5)]),
                                    "scheduled": view(blocks, block_size=6, name="scheduled")})
    verified = [t for t in fig.data if "verified per cycle" in t.name]
    assert len(verified) == 1 and list(verified[0].y) == [2, 6, 3] and "mean 3.7" in verified[0].name
    assert not [t for t in charts.acceptance_figure({"dflash": view([block(0, [2, 3, 4], 3, 5)])}).data
                if "verified" in t.name]


def test_draft_strip_shows_a_lookup_lane_whose_first_cycle_found_no_match():
    v = view([block(0, [], 0, 5), block(1, [2, 3], 2, 9)], name="lookup")
    strip = render.draft_strip_html(v, text_of)
    assert strip.count("chip-accepted") == 2 and "#2 · 2 drafts: 2 kept + 1 bonus" in strip and "#1 · no drafts: 1 bonus" in strip
    assert render.draft_strip_html(view([block(0, [], 0, 5)], name="lookup"), text_of) == ""


def test_summary_has_a_row_per_lane_when_more_than_two_raced():
    def summary(blocks, method, block_size=4, total=1.0):
        ids = (1, *(t for b in blocks for t in b.committed_ids))
        return Summary(ids, 5, block_size, "max_new_tokens", Prefill(5, 1, 0.05), tuple(blocks), total, method)

    d = summary([block(0, [2, 3, 4], 3, 5)], "dflash", total=0.5)
    ar = summary([block(0, [2, 3, 4], 3, 5, passes=3)], "ar", total=0.8)
    lookup = summary([block(0, [2, 3, 9], 2, 7)], "lookup")
    plain = summary([block(i, [], 0, t) for i, t in enumerate((2, 3, 4, 5))], "plain", block_size=1, total=1.0)
    two = race_report(d, plain, 0.0, 4)
    assert "lanes-table" not in render.summary_html(two) and set(two.lanes) == {"dflash", "plain"}
    report = race_report(d, plain, 0.0, 4, lanes={"dflash": d, "ar": ar, "lookup": lookup, "plain": plain})
    html = render.summary_html(report)
    assert html.count("<tr>") == 5  # the header and one row per lane
    assert report.lanes["ar"].draft_passes_per_cycle == 3 and report.lanes["ar"].speedup == pytest.approx(1.25)
    assert report.lanes["lookup"].identical is False and report.lanes["lookup"].first_difference == 3
    assert "✗ differs at token 3" in html and html.count("identical ✓") == 3  # the top cell, DFlash and AR


def test_charts_follow_the_blocks():
    v = view([block(0, [2, 3, 4], 3, 5), block(1, [2, 3, 4], 0, 5), block(2, [2, 3, 4], 1, 5)])
    acc = charts.acceptance_figure({"dflash": v})
    assert list(acc.data[0].y) == [4, 1, 2] and acc.data[1].y[-1] == pytest.approx(7 / 3)
    assert list(charts.histogram_figure({"dflash": v}).data[0].y) == [1, 1, 0, 1]
    assert list(charts.position_figure({"dflash": v}).data[0].y) == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    speed = charts.speed_figure({"dflash": v, "plain": view([], name="plain")})
    assert [trace.name for trace in speed.data] == ["DFlash", "plain decoding"]
    json.loads(acc.to_json())


def test_charts_draw_one_trace_per_lane_in_its_color():
    d = view([block(0, [2, 3, 4], 3, 5), block(1, [2, 3, 4], 0, 5)])
    ar = view([block(0, [2, 3, 4], 1, 5), block(1, [2, 3, 4], 1, 5)], name="ar")
    lanes = {"dflash": d, "ar": ar}
    acc = charts.acceptance_figure(lanes)  # several lanes: no bars, one running tau each
    assert [t.type for t in acc.data] == ["scatter", "scatter"]
    assert [t.name for t in acc.data] == ["DFlash tau = 2.50", "AR drafter tau = 2.00"]
    assert [t.line.color for t in acc.data] == [COLORS["dflash"], COLORS["ar"]]
    hist = charts.histogram_figure(lanes)
    assert [list(t.y) for t in hist.data] == [[1, 0, 0, 1], [0, 2, 0, 0]] and [t.name for t in hist.data] == ["DFlash", "AR drafter"]
    positions = charts.position_figure(lanes)
    assert list(positions.data[1].y) == pytest.approx([1.0, 0.0, 0.0])


def test_legend_names_every_kind():
    legend = render.legend_html()
    for word in ("accepted draft", "bonus", "rejected", "block boundary", "plain"):
        assert word in legend


def test_race_stamps_each_side_with_its_own_clock():
    fake_now = [0.0]
    frames = list(
        race(
            {"dflash": run_events(0.1, 0.2, 4, 5, 4), "plain": run_events(0.1, 0.1, 1, 20, 1)},
            block_sizes={"dflash": 4},
            pace=False,
            frame_s=0.0,
            clock=lambda: fake_now[0],
            sleep=lambda s: None,
        )
    )
    last = frames[-1]
    assert last.done and last.dflash.done and last.plain.done
    # Each side keeps its own compute clock: the race's interleaving adds nothing to either.
    assert last.dflash.summary.total_s == pytest.approx(0.1 + 5 * 0.2)
    assert last.plain.summary.total_s == pytest.approx(0.1 + 20 * 0.1)
    assert last.dflash.blocks[-1].elapsed_s == pytest.approx(1.1)
    # Frames never show one side ahead of the other in compute time.
    for f in frames[:-1]:
        for a, b in ((f.dflash, f.plain), (f.plain, f.dflash)):
            if a.blocks and not b.done:
                assert a.blocks[-1].elapsed_s <= b.elapsed_s + 0.2 + 1e-9
    report = race_report(last.dflash.summary, last.plain.summary, 0.0, 4)
    assert report.tau == 4 and report.speedup == pytest.approx(2.1 / 1.1, abs=1e-3)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_token_pieces_from_ids_handle_split_characters():
    class ByteTokenizer:  # one token per UTF-8 byte, like a byte-level BPE at its worst
        def decode(self, ids, **_):
            return bytes(ids).decode("utf-8", errors="replace")

    ids = list("a€<b>".encode())
    pieces = TokenPieces(ByteTokenizer()).extend(ids)
    assert "".join(pieces) == "a€<b>" and len(pieces) == len(ids)
    assert pieces[1:4] == ["", "", "€"]


def test_frames_wait_for_the_browser_to_draw_the_last_one():
    from types import SimpleNamespace

    from app.view.frames import FramePacer

    now = [0.0]
    pacer = FramePacer(bytes_per_s=100_000, clock=lambda: now[0])
    running, paused, done = (SimpleNamespace(done=d, paused=p) for d, p in ((False, False), (False, True), (True, False)))
    assert pacer.due(running)  # the first frame at once
    pacer.sent(50_000)  # half a second of drawing
    now[0] = 0.49
    assert not pacer.due(running) and pacer.due(paused) and pacer.due(done)
    now[0] = 0.5
    assert pacer.due(running)
    waited = []
    pacer.sent(20_000, started=0.4)
    pacer.wait(sleep=waited.append)
    assert waited == [pytest.approx(0.1)]


def test_a_chart_frame_gives_the_browser_longer_to_draw():
    from types import SimpleNamespace

    from app.view.frames import CHART_DRAW_S, FramePacer

    now = [0.0]
    pacer = FramePacer(bytes_per_s=100_000, clock=lambda: now[0])
    pacer.sent(50_000, charts=True)  # plotly redraws every figure on top of the HTML
    now[0] = 0.5
    assert not pacer.due(SimpleNamespace(done=False, paused=False))
    assert pacer.next == pytest.approx(0.5 + CHART_DRAW_S)


def test_a_running_strip_draws_the_rows_its_box_shows_and_a_finished_one_its_last_40():
    from app.race.interleave import Snapshot
    from app.view.frames import race_frame

    blocks = [block(i, [2, 1, 4], accepted=1, bonus=5, position=4 * i) for i in range(50)]
    lanes = {"dflash": view(blocks), "plain": view([], name="plain", block_size=1)}

    class Tokenizer:
        def decode(self, ids, **_):
            return "".join(map(text_of, ids))

    pieces = {lane: TokenPieces(Tokenizer()) for lane in lanes}

    def strip(snapshot):
        return race_frame(snapshot, pieces, text_of, None, False).panes["dflash"].strip

    running = strip(Snapshot(lanes, 1.0, False))
    assert running.count("strip-head") == render.RUNNING_STRIP_ROWS
    assert "#50 · " in running and f"… {50 - render.RUNNING_STRIP_ROWS} earlier blocks" in running
    paused = strip(Snapshot(lanes, 1.0, False, paused=True))  # still: the box scrolls, hover boxes come
    assert paused.count("strip-head") == render.STRIP_ROWS == 40 and "#11 · " in paused and "#50 · " in paused
