"""The lanes that race a drafter a pair names beside its DFlash one: DFlash2 and input fusion.

On the tiny pair with a random DFlash2 drafter, through the app's handlers: both lanes decode what
plain decoding does at temperature 0, the trace records (and a replay reads back) the DFlash2
selector's walk, and "Inside a cycle" lays out the lane the viewer picks, the walk highlighted. The
input-fusion lane races a random tiny input-fusion drafter; a drafter of another kind or target named
for either lane is a clear error.
"""

from __future__ import annotations

import html
import re

import pytest
from tiny import build_dflash2_drafter, build_drafter, build_fusion_drafter, build_qwen3_target

from app.pairs.models import PairCache
from app.pairs.registry import cli_pair
from app.ui import App
from app.view.frames import FRAME_FIELDS
from dflash_core.trace import validate_trace

PROMPT = "What is the capital of France? Paris is the capital of France. What is"
BLOCK = 4


@pytest.fixture(scope="module")
def dflash2_dir(tiny_dirs, tmp_path_factory):
    return build_dflash2_drafter(tmp_path_factory.mktemp("lanes") / "dflash2", tiny_dirs[0])


@pytest.fixture(scope="module")
def fusion_dir(tiny_dirs, tmp_path_factory):
    return build_fusion_drafter(tmp_path_factory.mktemp("lanes") / "fusion", tiny_dirs[0])


@pytest.fixture(scope="module")
def app(tiny_dirs, dflash2_dir, fusion_dir, one_thread):
    target_dir, drafter_dir = tiny_dirs
    spec = cli_pair(str(target_dir), str(drafter_dir), dflash2_drafter=str(dflash2_dir), fusion_drafter=str(fusion_dir))
    return App([spec], spec.id, PairCache("cpu"))


def picked(answer) -> tuple[str, object]:
    """A cycle picker's cycle view and slider update (`stepping.look_at`: the follow checkbox, then
    the race's outputs)."""
    outputs = dict(zip(FRAME_FIELDS, answer[1:]))
    return outputs["cycle_view"], outputs["cycle_pick"]


def race(app, lanes, temperature=0.0) -> dict:
    *_, last = app.live.compare(PROMPT, 24, BLOCK, temperature, 1.0, 0, lanes)
    return dict(zip(FRAME_FIELDS, last))


@pytest.fixture(scope="module")
def raced(app):
    return race(app, ["dflash2", "fusion"])


def test_dflash2_and_fusion_lanes_race_losslessly_and_record_the_walk(raced):
    report = raced["report"]["lanes"]
    assert list(report) == ["dflash", "dflash2", "fusion", "plain"]
    for name in ("dflash2", "fusion"):
        assert report[name]["identical"] is True and report[name]["lossless"] == "identical", name
        assert report[name]["draft_passes_per_cycle"] == 1 and raced[f"{name}_tokens"].count('class="tok ') == 24
    assert html.escape("DFlash2 (block 4: 1 pass per cycle, then a path through each slot's candidates)") in raced["dflash2_stats"]
    assert "Input fusion (block 4: 1 pass per cycle, target features at the input only)" in raced["fusion_stats"]
    trace = validate_trace(raced["trace_file"])
    runs = trace["runs"]
    assert {lane: run["method"] for lane, run in runs.items()} == {
        "dflash": "dflash", "dflash2": "dflash2", "fusion": "fusion", "plain": "plain"}
    assert trace["pair"]["dflash2_drafter"].endswith("dflash2") and trace["pair"]["fusion_drafter"].endswith("fusion")
    assert "ar_drafter" not in trace["pair"]
    assert all(run["output_ids"] == runs["plain"]["output_ids"] for run in runs.values())
    for block in runs["dflash2"]["blocks"]:
        path = block["explain"]["path"]
        assert [row[i] for row, i in zip(path["candidates"], path["chosen"])] == block["draft_ids"]
    assert all("path" not in b["explain"] for b in runs["fusion"]["blocks"])
    assert any(i != 0 for b in runs["dflash2"]["blocks"] for i in b["explain"]["path"]["chosen"]), (
        "the random selector never left the head's first candidate: the view's highlight would not be tested")


def test_the_cycle_view_lays_out_the_picked_lane_with_the_walk_highlighted(app, raced):
    view, slider = picked(app.stepping.pick_lane("dflash2"))
    trace = validate_trace(raced["trace_file"])
    blocks = trace["runs"]["dflash2"]["blocks"]
    last = blocks[-1]
    assert f"DFlash2 lane · Cycle {len(blocks)} of {len(blocks)}" in view  # cycles count from 1
    assert slider["maximum"] == len(blocks) and slider["value"] == len(blocks)
    assert "3 · the selector's path: each slot's candidates" in view
    assert view.count('<tr class="walk">') == len(last["draft_ids"]) == view.count("◀ walked")
    # The highlighted row of each slot is the walked candidate: its rank and the draft's text.
    walked = re.findall(r'<tr class="walk"><td class="rank">#(\d+)</td><td>(.*?)</td>', view)
    assert [int(rank) - 1 for rank, _ in walked] == last["explain"]["path"]["chosen"]
    assert [text for _, text in walked] == [trace["tokens"][str(t)] for t in last["draft_ids"]]
    left = sum(i != 0 for i in last["explain"]["path"]["chosen"])
    assert f"the walk left the head's first choice in <b>{left}</b> of {len(last['draft_ids'])} slots" in view
    assert "✓ accepted" in view or "✗ rejected" in view  # the target's verdict per slot, as for DFlash
    # Picking a cycle keeps the lane; the fusion lane's features enter at its input; DFlash has no walk.
    first, _ = picked(app.stepping.pick_cycle(1))
    assert f"DFlash2 lane · Cycle 1 of {len(blocks)}" in first
    fusion, _ = picked(app.stepping.pick_lane("fusion"))
    assert "input fusion lane · Cycle" in fusion and "fed <b>once</b>, at the drafter's input" in fusion
    assert '<tr class="walk">' not in fusion
    # After a race without the lane picked the view says so; picking DFlash lays out DFlash's cycles.
    race(app, [])
    assert "The DFlash2 lane is not in this race" in picked(app.stepping.pick_lane("dflash2"))[0]
    dflash, _ = picked(app.stepping.pick_lane("dflash"))
    assert dflash.count("<h4>Cycle ") == 1 and "injected into every drafter layer" in dflash


def test_a_replay_reads_the_walk_back(raced):
    from app.serve.replay import load_trace

    recording = load_trace(raced["trace_file"])
    trace = validate_trace(raced["trace_file"])
    for block, recorded in zip(recording.runs["dflash2"].blocks, trace["runs"]["dflash2"]["blocks"]):
        assert list(block.explain.path.chosen) == recorded["explain"]["path"]["chosen"]


def test_a_lane_whose_drafter_is_not_there_is_not_offered_and_says_why(tiny_dirs, tmp_path, one_thread):
    target_dir, drafter_dir = tiny_dirs
    spec = cli_pair(str(target_dir), str(drafter_dir), dflash2_drafter=str(tmp_path / "not-trained-yet"))
    app = App([spec], spec.id, PairCache("cpu"))
    *_, (status, _) = app.loading.load_status(spec)
    assert "ready" in status and (f"The DFlash2 lane is not offered: its DFlash2 drafter is not there yet: "
                                  f"{tmp_path / 'not-trained-yet'} has no config.json.") in status
    assert app.cache.get(spec).lanes == ("dflash", "scheduled", "tree", "lookup", "plain")
    with pytest.raises(Exception, match="cannot race the DFlash2 lane: its DFlash2 drafter is not there yet"):
        list(app.live.compare("hi", 4, BLOCK, 0.0, 1.0, 0, ["dflash2"]))
    assert race(app, ["lookup"])["report"]["lanes"]["lookup"]["identical"] is True  # the pair races on


def test_a_lane_drafter_of_another_target_or_kind_is_a_clear_error(tiny_dirs, dflash2_dir, tmp_path, one_thread):
    from dflash_core.errors import PairMismatchError

    target_dir, drafter_dir = tiny_dirs
    other = build_drafter(tmp_path / "other", build_qwen3_target(tmp_path / "qwen3"))
    for kwargs, message in (
        ({"dflash2_drafter": str(other)}, f"the DFlash2 drafter {other} does not fit the target: drafter vocab_size 64"),
        ({"dflash2_drafter": str(drafter_dir)},
         f"the DFlash2 drafter {drafter_dir} is a DFlash drafter; the dflash2 method races DFlash2 drafters"),
        ({"fusion_drafter": str(dflash2_dir)}, "is a DFlash2 drafter; the fusion method races input-fusion drafters"),
        ({"fusion_drafter": str(drafter_dir)},
         f"the input-fusion drafter {drafter_dir} is a DFlash drafter; the fusion method races input-fusion drafters"),
    ):
        spec = cli_pair(str(target_dir), str(drafter_dir), **kwargs)
        with pytest.raises(PairMismatchError, match=re.escape(message)):
            PairCache("cpu", warm_up=False).get(spec)
        *_, (status, _) = App([spec], spec.id, PairCache("cpu", warm_up=False)).loading.load_status(spec)
        assert message in status


def test_a_live_race_pinned_names_its_pair_settings_and_prompt(app):
    raced = race(app, ["dflash2"])
    pins, panel, column = app.pinning.pin("live", {}, None)
    label = html.escape(next(iter(app.pairs.values())).label)
    prompt = html.escape(PROMPT[:57])  # a long prompt is cut at 60 characters
    assert f"Pinned race</b> · {label} · block {BLOCK}, T=0, at most 24 tokens · “{prompt}…”" in panel
    assert set(pins) == {"live"} and column["visible"] is True
    for lane, name in (("dflash", "DFlash"), ("dflash2", "DFlash2"), ("plain", "plain decoding")):
        assert f">{name}</td><td>{raced['report']['lanes'][lane]['tok_s']:.1f}</td>" in panel
