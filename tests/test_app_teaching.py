"""The teaching views on hand-made cycles: hover boxes (escaped, with top-k and the verdict), the
"inside a cycle" view, and the speedup model against hand-computed values."""

from __future__ import annotations

import re

import pytest

from app.race.interleave import SideView
from app.view import render, tips
from app.view.cycle_view import cycle_html
from app.view.speedup import Costs, effective_acceptance, expected_tokens, extend_rates, iid_rates, run_costs, speedup
from dflash_core import Block, Prefill, Summary
from dflash_core.events import CycleExplanation

TEXT = {1: "<img src=x onerror=alert(1)>", 2: " ok", 3: "\n", 4: "x", 5: "y", 6: "&amp;", 7: "z"}


def text_of(token_id: int) -> str:
    return TEXT.get(token_id, f"t{token_id}")


def explain(rule="greedy"):
    """A cycle of block size 4: drafts 2, 4, 5; the target keeps 2, rejects 4 and puts 6 (bonus)."""
    slots = [
        {"slot": 1, "draft": 2, "target": 2, "p": None, "q": None, "ratio": None, "u": None, "accepted": True},
        {"slot": 2, "draft": 4, "target": 6, "p": None, "q": None, "ratio": None, "u": None, "accepted": False},
    ]
    if rule == "rejection":
        slots[0].update(p=0.8, q=0.5, ratio=1.6, u=0.91234, target=None)
        slots[1].update(p=0.1, q=0.4, ratio=0.25, u=0.7)
    return CycleExplanation.from_dict({
        "slot0_id": 1, "mask_id": 99, "positions": [10, 11, 12, 13],
        "injected": {"positions": 2, "target_layers": [1, 3]},
        "draft_topk": [[[2, 0.7], [1, 0.2]], [[4, 0.5], [6, 0.3]], [[5, 0.9], [7, 0.1]]],
        "target_topk": [[[2, 0.91], [4, 0.05]], [[6, 0.6], [4, 0.2], [1, 0.1]], [[7, 0.5]], [[5, 0.4]]],
        "decision": {"rule": rule, "slots": slots, "resampled": rule == "rejection"},
        "cache": {"target_before": 10, "target_after": 12, "drafter_before": 8, "drafter_after": 10},
        "time": {"draft_s": 0.01, "verify_s": 0.03, "other_s": 0.002},
    })


def plain_explain(step, token):
    """Plain decoding's explanation of `step`, which emitted `token`: the target's top-2, nothing drafted."""
    return CycleExplanation.from_dict({
        "slot0_id": 1, "mask_id": None, "positions": [10 + step], "injected": {"positions": 0, "target_layers": []},
        "draft_topk": [], "target_topk": [[[token, 0.75], [1, 0.2]]],
        "decision": {"rule": "greedy", "slots": [], "resampled": False},
        "cache": {"target_before": 10 + step, "target_after": 11 + step, "drafter_before": 0, "drafter_after": 0},
        "time": {"draft_s": 0.0, "verify_s": 0.02, "other_s": 0.0},
    })


def dflash_view(rule="greedy"):
    block = Block(0, 10, (2, 4, 5), 1, 6, (2, 6), 0.01, 0.03, 0.092, explain=explain(rule))
    return SideView("dflash", Prefill(10, 1, 0.05), (block,), None, 0.092, 4, ())


def plain_view():
    blocks = tuple(
        Block(i, 10 + i, (), 0, t, (t,), 0.0, 0.02, 0.05 + 0.02 * (i + 1),
              explain=plain_explain(i, t))
        for i, t in enumerate((2, 6))
    )
    return SideView("plain", Prefill(10, 1, 0.05), blocks, None, 0.09, 1, ())


def test_hover_boxes_show_block_slot_topk_and_why_all_escaped():
    view = dflash_view()
    tips = render.lane_tips(view, text_of)
    out = render.tokens_html(render.lane_marks(view), [text_of(t) for t in view.output_ids], text_of, None, tips)
    assert "<img" not in out and "&lt;img src=x onerror=alert(1)&gt;" in out
    accepted, bonus = tips[1], tips[2]
    assert "cycle 1 · slot 1" in accepted and "drafter top-2" in accepted and "target top-2" in accepted
    assert "70.0%" in accepted and "91.0%" in accepted and "Accepted: the draft" in accepted
    assert "cycle 1 · slot 2" in bonus and "bonus token" in bonus and "60.0%" in bonus
    assert "Rejected: the target chose" in bonus
    # A tooltip replaces the title attribute (no double hover).
    assert 'title="' not in out.split('class="tok tok-bonus"')[1].split(">")[0]
    strip = render.draft_strip_html(view, text_of, tips=True)
    rejected, discarded = strip.split('class="chip chip-rejected')[1:3]
    assert "slot 2" in rejected and "Rejected:" in rejected and "50.0%" in rejected
    assert "slot 3" in discarded and "Discarded unverified" in discarded
    plain = render.tokens_html(render.plain_marks(plain_view()), ["a", "b", "c"], text_of, None,
                               render.plain_tips(plain_view(), text_of))
    assert "target top-k" in plain and "75.0%" in plain


def test_a_cycle_without_drafts_says_the_target_decoded_alone():
    # A block schedule's paused cycle: no drafts, slot 0 verified, the target's token is the bonus.
    paused = Block(1, 13, (), 0, 7, (7,), 0.0, 0.02, 0.12, verify_len=1)
    assert tips.why(paused, 1, text_of) == (
        "No drafts this cycle (block size 1, or a block schedule pausing a drafter that was not paying): "
        "the target decoded 'z' alone, as plain decoding does."
    )
    assert tips.why(dflash_view().blocks[0], 3, text_of).startswith("Discarded unverified")


def test_sampled_verdict_shows_the_uniform_draw_and_ratio():
    tips = render.lane_tips(dflash_view("rejection"), text_of)
    assert "u = 0.912 ≤ p/q = 1.600" in tips[1]
    assert "u = 0.700 &gt; p/q = 0.250" in tips[2] and "residual" in tips[2]


def test_inside_a_cycle_lays_the_cycle_out_in_order():
    out = cycle_html(dflash_view(), plain_view(), 0, text_of)
    order = ["noisy block", "injected into every drafter layer", "single pass", "accepted prefix", "caches kept",
             "where the time went"]
    positions = [out.index(part) for part in order]
    assert positions == sorted(positions)
    assert out.count("[MASK]") == 3 and "mask_id 99" in out
    assert "2 new context position(s)" in out and "target layers [1, 3]" in out
    assert "✓ accepted" in out and "✗ rejected" in out and "— discarded" in out
    assert "target KV cache 10 → 12" in out and "drafter cache 8 → 10" in out
    # Time split against one plain step (20 ms), and the autoregressive drafter's 3 passes.
    assert "one plain decoding step" in out and "20.0 ms" in out and "42.0 ms" in out
    assert "would need <b>3</b> passes" in out and "2.10 plain steps" in out
    assert "<img" not in out
    assert "No DFlash cycle yet" in cycle_html(None, None, None, text_of)


def test_expected_tokens_and_speedup_by_hand():
    # a = 0.5, B = 4: E = 1 + .5 + .25 + .125 = 1.875 = (1 - .5^4) / (1 - .5)
    assert expected_tokens(iid_rates(0.5, 3)) == pytest.approx(1.875)
    costs = Costs(draft=0.2, verify=1.0, other=0.0, plain=1.0)
    assert speedup(iid_rates(0.5, 3), costs) == pytest.approx(1.875 / 1.2)  # one drafter pass
    assert speedup(iid_rates(0.5, 3), costs, autoregressive=True) == pytest.approx(1.875 / 1.6)  # three
    # Leviathan et al.: (1 - a^(g+1)) / ((1 - a)(g c + 1)) with g = 3, c = 0.2
    assert speedup(iid_rates(0.5, 3), costs, autoregressive=True) == pytest.approx((1 - 0.5**4) / (0.5 * 1.6))
    assert speedup([], costs) == 1.0  # B = 1 drafts nothing
    # Measured per-slot rates, then the last conditional rate carried on: .8, .4 -> .2, .1
    assert extend_rates([0.8, 0.4], 4) == pytest.approx([0.8, 0.4, 0.2, 0.1])
    assert effective_acceptance(1.875, 4) == pytest.approx(0.5, abs=1e-6)


def test_run_costs_are_the_measured_means():
    d = Summary((1, 2, 6), 10, 4, "max_new_tokens", Prefill(10, 1, 0.05),
                (Block(0, 10, (2, 4, 5), 1, 6, (2, 6), 0.01, 0.03, 0.092),), 0.092)
    p = Summary((1, 2, 6), 10, 1, "max_new_tokens", Prefill(10, 1, 0.05), plain_view().blocks, 0.09)
    costs = run_costs(d, p)
    assert costs.draft == pytest.approx(0.01) and costs.verify == pytest.approx(0.03)
    assert costs.other == pytest.approx(0.002) and costs.plain == pytest.approx(0.02)
    # The model at the run's own block size gives back the run's decode speedup: 2 tokens in 42 ms
    # against 2 tokens in 40 ms of plain steps.
    assert speedup(d.per_position_acceptance, costs) == pytest.approx((2 / 0.042) / (2 / 0.04))


def _ar_lane():
    """An AR lane of two cycles: 3 passes each, 30 ms of drafting (10 ms a pass), 30 ms verify."""
    blocks = (Block(0, 10, (2, 4, 5), 1, 6, (2, 6), 0.03, 0.03, 0.11, 3),
              Block(1, 12, (2, 4, 5), 3, 7, (2, 4, 5, 7), 0.03, 0.03, 0.17, 3))
    return Summary((1, 2, 6, 2, 4, 5, 7), 10, 4, "max_new_tokens", Prefill(10, 1, 0.05), blocks, 0.17, "ar")


def test_an_ar_lane_costs_per_pass_and_gets_its_own_measured_curve():
    from app.race.lanes import COLORS
    from app.view.speedup import speedup_figure

    ar, p = _ar_lane(), Summary((1, 2, 6), 10, 1, "max_new_tokens", Prefill(10, 1, 0.05), plain_view().blocks, 0.09)
    costs = run_costs(ar, p, per_pass=True)
    assert costs.draft == pytest.approx(0.01) and costs.verify == pytest.approx(0.03)
    d = Summary((1, 2, 6), 10, 4, "max_new_tokens", Prefill(10, 1, 0.05),
                (Block(0, 10, (2, 4, 5), 1, 6, (2, 6), 0.01, 0.03, 0.092, 1),), 0.092, "dflash")
    raced = speedup_figure({"dflash": d, "ar": ar}, p, {"dflash": 1.1, "ar": 0.8})
    names = {t.name for t in raced.data if t.showlegend}
    assert names == {"DFlash (1 drafter pass)", "AR drafter (B-1 passes)", "this run (measured)"}
    stars = [t for t in raced.data if t.marker.symbol == "star" and t.xaxis == "x"]
    assert [(t.y[0], t.marker.color) for t in stars] == [(1.1, COLORS["dflash"]), (0.8, COLORS["ar"])]
    # Without an AR lane, the AR curve is DFlash's own pass cost times B-1, and has no measured point.
    alone = speedup_figure({"dflash": d}, p, {"dflash": 1.1})
    assert "AR drafter (B-1 passes, estimated from DFlash's pass)" in {t.name for t in alone.data if t.showlegend}
    assert len([t for t in alone.data if t.marker.symbol == "star"]) == 2  # DFlash's, on both panels


def test_inside_a_cycle_shows_the_ar_lanes_measured_passes_when_it_races():
    from app.race.interleave import SideView

    ar = _ar_lane()
    view = SideView("ar", ar.prefill, ar.blocks, ar, ar.total_s, 4)
    out = cycle_html(dflash_view(), plain_view(), 0, text_of, view)
    assert "AR drafter, 3 passes (measured, mean of 2 cycles)" in out and "(estimate)" not in out
    assert "took <b>3</b> passes per cycle, 30.0 ms of drafting against DFlash's 10.0 ms here" in out


def test_inside_a_dflash2_cycle_shows_each_slots_candidates_and_the_path_walked():
    """Drafts 2, 4, 5 walked through candidates [2 1 7], [6 4 3] and eight in slot 3, where the walk
    took the eighth: past the six drawn, so it is drawn after an ellipsis."""
    data = explain().to_dict()
    data["path"] = {"candidates": [[2, 1, 7], [6, 4, 3], [7, 1, 3, 10, 11, 12, 13, 5]],
                    "probs": [[0.5, 0.3, 0.2], [0.25, 0.7, 0.05], [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.35]],
                    "chosen": [0, 1, 7]}
    block = Block(0, 10, (2, 4, 5), 1, 6, (2, 6), 0.01, 0.03, 0.092, explain=CycleExplanation.from_dict(data))
    view = SideView("dflash2", Prefill(10, 1, 0.05), (block,), None, 0.092, 4, ())
    out = cycle_html(view, plain_view(), 0, text_of, lane="dflash2")
    assert "DFlash2 lane · Cycle 1 of 1" in out and "its selector walks one path through them" in out
    assert "3 · the selector's path: each slot's candidates" in out and "drafter's one pass: top-3" not in out
    walked = re.findall(r'<tr class="walk"><td class="rank">#(\d+)</td><td>(.*?)</td><td>\s*([\d.]+)%', out)
    assert walked == [("1", " ok", "50.0"), ("2", "x", "70.0"), ("8", "y", "35.0")]
    assert out.count("◀ walked") == 3 and "<td>…</td>" in out and "… 1 more not drawn" in out  # #7 of slot 3
    assert "&lt;img src=x onerror=alert(1)&gt;" in out and "<img" not in out  # candidate 1's text, escaped
    assert "the walk left the head's first choice in <b>2</b> of 3 slots" in out
    assert "✓ accepted" in out and "✗ rejected" in out  # the target's verdict per slot, as for DFlash


def test_inside_a_scheduled_cycle_shows_what_the_schedule_drafted_weighed_and_verified():
    """Drafts 2, 4, 5 drafted in one pass, the first two verified (verify of 3): the drafter's
    probabilities 70, 50 and 90% give the chances kept up to each slot, 70, 35 and 31.5%; the target
    keeps 2, rejects 4 and puts 6. The next cycle the schedule paused the drafter: a plain step."""
    from app.race.interleave import Snapshot
    from app.view.lane_cycles import lane_cycle_html

    recorded = explain().to_dict()
    recorded.update(positions=[10, 11, 12], target_topk=recorded["target_topk"][:3])  # a verify of 3
    cut = Block(0, 10, (2, 4, 5), 1, 6, (2, 6), 0.01, 0.03, 0.092, verify_len=3,
                explain=CycleExplanation.from_dict(recorded))
    paused = Block(1, 12, (), 0, 7, (7,), 0.0, 0.02, 0.115, verify_len=1)
    view = SideView("scheduled", Prefill(10, 1, 0.05), (cut, paused), None, 0.115, 4, ())
    snap = Snapshot({"scheduled": view, "plain": plain_view()}, 0.2, True)
    shown = lane_cycle_html(snap, "scheduled", 0, text_of)
    words = " ".join(re.sub(r"<[^>]+>", " ", re.sub(r"<style>.*?</style>", "", shown, flags=re.S)).split())
    assert ("DFlash, scheduled block lane · Cycle 1 of 2 · positions 10–12 · 2 of 3 drafts verified: 1 kept + 1 bonus "
            "→ 2 tokens") in words
    assert "3 drafts in one pass, 2 verified" in words
    assert ("slot 1 slot 2 slot 3 draft ok x y drafter's probability 70.0% 50.0% 90.0% "
            "chance kept up to here 70.0% 35.0% 31.5%") in words
    assert "the schedule ✓ verified ✓ verified not verified" in words
    grid = shown.split("the target's verdict on each draft")[1]
    assert "slot 1" in grid and "slot 2" in grid and "slot 3" not in grid  # the unverified draft has no verdict
    assert "✓ accepted" in grid and "✗ rejected" in grid
    rest = lane_cycle_html(snap, "scheduled", 1, text_of)
    assert "Cycle 2 of 2" in rest and "no drafts: 1 bonus" in rest and "paused the drafter" in rest
    assert "decoded <span class=\"tk\" style=\"background:#ffd98a\">z</span> alone" in rest
