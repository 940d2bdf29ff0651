"""The four-lane race through the app's API: DFlash, the AR drafter, prompt lookup and plain decoding
on the tiny pair, raced over HTTP through `compare` with gradio_client.

Each lane's pane, its summary row and its run in the trace come from the same race; at temperature 0
every lane's output equals plain decoding's, and the AR lane reports its B-1 drafter passes per cycle.
"""

from __future__ import annotations

import pytest

gradio_client = pytest.importorskip("gradio_client")

from serve import launch_app  # noqa: E402
from tiny import build_drafter  # noqa: E402

from app.view.frames import API_FIELDS  # noqa: E402
from dflash_core import decoding  # noqa: E402
from dflash_core.schedule import CostProfile  # noqa: E402
from dflash_core.trace import validate_trace  # noqa: E402

PROMPT = "What is the capital of France? Paris is the capital of France. What is"
BLOCK = 4
TRAINED = 8  # the tiny drafter's trained block (tests/tiny.py): the scheduled lane's longest


@pytest.fixture(scope="module")
def client(tiny_dirs, tmp_path_factory, one_thread):
    target_dir, drafter_dir = tiny_dirs
    ar_dir = build_drafter(tmp_path_factory.mktemp("ar") / "ar", target_dir, block_size=BLOCK,
                           architectures=["DFlashARDraftModel"])
    demo, url = launch_app(target_dir, drafter_dir, ar_drafter_dir=ar_dir)
    yield gradio_client.Client(url, verbose=False)
    demo.close()


def race(client, lanes, temperature=0.0):
    job = client.submit(PROMPT, 24, BLOCK, temperature, 1.0, 0, lanes, api_name="/compare")
    result = job.result(timeout=120)
    return dict(zip(API_FIELDS, result)), job.outputs()


def test_four_lanes_race_losslessly_and_each_fills_its_pane_its_row_and_its_run(client):
    out, updates = race(client, ["ar", "lookup"])
    report = out["report"]
    assert list(report["lanes"]) == ["dflash", "ar", "lookup", "plain"]
    for name, lane in report["lanes"].items():
        assert lane["tokens"] == 24 and lane["tok_s"] > 0, name
        if name != "plain":
            assert lane["identical"] is True and lane["lossless"] == "identical", name
    assert report["lanes"]["dflash"]["draft_passes_per_cycle"] == 1
    assert report["lanes"]["ar"]["draft_passes_per_cycle"] == BLOCK - 1  # one causal pass per draft
    assert report["lanes"]["lookup"]["draft_passes_per_cycle"] == 0  # no model
    assert report["lanes"]["ar"]["method"] == "ar" and report["lanes"]["lookup"]["method"] == "lookup"
    # Every lane has its pane, drawn while the race ran, and a row in the summary.
    for name in ("dflash", "ar", "lookup", "plain"):
        assert out[f"{name}_tokens"].count('class="tok ') == 24, name
        assert any(isinstance(u[API_FIELDS.index(f"{name}_tokens")], str) and "tok " in u[API_FIELDS.index(f"{name}_tokens")]
                   for u in updates[:-1]), name
    assert out["summary"].count("<tr>") == 5 and "AR drafter" in out["summary"] and "prompt lookup" in out["summary"]
    assert "Prompt lookup (block 4, no model)" in out["lookup_stats"] and "3 passes per cycle" in out["ar_stats"]
    # The trace holds every lane's run, each named by its method, and replays with no model.
    trace = validate_trace(out["trace_file"])
    assert list(trace["runs"]) == ["dflash", "ar", "lookup", "plain"]
    assert {lane: run["method"] for lane, run in trace["runs"].items()} == {
        "dflash": "dflash", "ar": "ar", "lookup": "lookup", "plain": "plain"}
    plain = trace["runs"]["plain"]["output_ids"]
    assert all(run["output_ids"] == plain for run in trace["runs"].values())
    assert all(b["draft_passes"] == BLOCK - 1 for b in trace["runs"]["ar"]["blocks"])


def test_the_visitor_picks_the_lanes_and_a_bad_pick_is_named(client):
    out, _ = race(client, ["lookup"], temperature=0.8)
    assert list(out["report"]["lanes"]) == ["dflash", "lookup", "plain"]
    assert out["report"]["lanes"]["lookup"]["identical"] is None  # sampling: not checked
    two, _ = race(client, [])
    assert list(two["report"]["lanes"]) == ["dflash", "plain"] and "lanes-table" not in two["summary"]
    with pytest.raises(Exception, match="Unknown lane 'medusa': the lanes a race can add are scheduled, tree, dflash2, fusion, ar, lookup"):
        client.predict(PROMPT, 8, BLOCK, 0.0, 1.0, 0, ["medusa"], api_name="/compare")
    # The app keeps serving after the refusal.
    ok, _ = race(client, ["ar"])
    assert ok["report"]["lanes"]["ar"]["identical"] is True


def test_a_pair_without_an_ar_drafter_says_which_pairs_have_one(tiny_dirs, one_thread):
    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair
    from app.ui import App

    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    app = App([spec], spec.id, PairCache("cpu"))
    with pytest.raises(Exception, match="cannot race the AR drafter lane: the pair names no autoregressive drafter"):
        list(app.live.compare("hi", 4, BLOCK, 0.0, 1.0, 0, ["ar"]))


def test_the_scheduled_lane_races_losslessly_and_its_trace_records_each_verified_length(client, monkeypatch):
    # A verify that costs more with every token, as on a CPU: the costs this machine measures at the
    # moment (the tiny target's are nearly flat, and noisy under load) would decide the cuts otherwise.
    steep = CostProfile(tuple(1 + 0.3 * k for k in range(TRAINED)))
    monkeypatch.setattr(decoding, "measured_costs", lambda target, longest: steep)
    out, _ = race(client, ["scheduled"])
    report = out["report"]["lanes"]
    assert list(report) == ["dflash", "scheduled", "plain"]
    assert report["scheduled"]["identical"] is True and report["scheduled"]["lossless"] == "identical"
    # The slider's block is the fixed lane's; the schedule chooses up to the drafter's trained size.
    assert report["scheduled"]["block_size"] == TRAINED and report["dflash"]["block_size"] == BLOCK
    assert out["scheduled_tokens"].count('class="tok ') == 24
    assert "DFlash, scheduled block (1 to 8, chosen each cycle; no pass while the drafter is paused)" in out["scheduled_stats"]
    trace = validate_trace(out["trace_file"])
    run = trace["runs"]["scheduled"]
    assert run["block_schedule"] == "auto" and trace["runs"]["dflash"]["block_schedule"] == "fixed"
    assert run["output_ids"] == trace["runs"]["plain"]["output_ids"]
    lengths = [b["verify_len"] for b in run["blocks"]]
    # The schedule also chooses how many to draft (schedule.draft_length): at most the trained block's.
    drafted = [len(b["draft_ids"]) for b in run["blocks"]]
    assert all(1 <= n <= d + 1 <= TRAINED for n, d in zip(lengths, drafted)) and drafted[0] == TRAINED - 1
    assert run["mean_verify_len"] == pytest.approx(sum(lengths) / len(lengths))
    # The strip labels each block by its verified length and outlines the drafts past it.
    unverified = sum(d + 1 - n for n, d in zip(lengths, drafted))
    assert unverified > 0  # a random drafter's drafts are rarely worth a verify: the schedule cut some
    assert out["scheduled_strip"].count('class="chip chip-unverified"') == unverified
    first, verified = run["blocks"][0], lengths[0] - 1
    label = (f"{verified} of {drafted[0]} drafts verified" if verified < drafted[0] else f"{drafted[0]} drafts")
    label = f"{label}: {first['accepted']} kept + 1 bonus" if verified else f"{drafted[0]} drafts, none verified: 1 bonus"
    assert f"#1 · {label}" in out["scheduled_strip"]


def test_a_scheduled_race_replays_from_its_trace_as_it_was_shown(tiny_dirs, one_thread):
    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair
    from app.serve.replay import load_trace
    from app.ui import App
    from app.view.frames import FRAME_FIELDS

    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    app = App([spec], spec.id, PairCache("cpu"))
    *_, live = app.live.compare(PROMPT, 16, BLOCK, 0.0, 1.0, 0, ["scheduled"])
    live = dict(zip(FRAME_FIELDS, live))
    recording = load_trace(live["trace_file"])
    assert recording.runs["scheduled"].block_schedule == "auto"
    assert all(b.verify_len is not None for b in recording.runs["scheduled"].blocks)
    *_, replayed = app.playback.replay(live["trace_file"], None, 4.0)
    replayed = dict(zip(FRAME_FIELDS, replayed))
    for name in ("scheduled_tokens", "scheduled_strip", "dflash_strip", "report"):
        assert replayed[name] == live[name], name


def test_the_shipped_traces_from_before_the_scheduled_lane_still_replay():
    from pathlib import Path

    from app.serve.replay import load_trace

    files = sorted(Path(__file__).resolve().parents[1].glob("assets/traces/*-*.json"))
    assert files
    for path in files:
        recording = load_trace(path)
        assert "scheduled" not in recording.runs and recording.runs["dflash"].block_schedule == "fixed", path.name


def test_a_drafter_that_drafts_slot_by_slot_races_the_scheduled_lane_at_temperature_0_only(tiny_dirs, tmp_path, one_thread):
    from tiny import build_dflash2_drafter

    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair
    from app.ui import App
    from app.view.frames import FRAME_FIELDS

    spec = cli_pair(str(tiny_dirs[0]), str(build_dflash2_drafter(tmp_path / "dflash2", tiny_dirs[0])))
    app = App([spec], spec.id, PairCache("cpu"))
    with pytest.raises(Exception, match=r"drafter \(dflash2\) conditions each draft on the ones before it, so the "
                                        "scheduled block lane races it at temperature 0 only"):
        list(app.live.compare(PROMPT, 8, BLOCK, 0.8, 1.0, 0, ["scheduled"]))
    *_, last = app.live.compare(PROMPT, 8, BLOCK, 0.0, 1.0, 0, ["scheduled"])
    assert dict(zip(FRAME_FIELDS, last))["report"]["lanes"]["scheduled"]["identical"] is True


def test_a_stopped_race_names_each_lanes_method_and_schedule_in_its_trace(tiny_dirs, one_thread):
    from types import SimpleNamespace

    from app.pairs.models import PairCache
    from app.pairs.registry import cli_pair
    from app.ui import App
    from app.view.frames import FRAME_FIELDS

    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    app = App([spec], spec.id, PairCache("cpu"))
    visitor = SimpleNamespace(session_hash="stopper")  # all a handler reads of gr.Request
    frames = app.live.compare("Tell me a long story.", 400, BLOCK, 0.0, 1.0, 0, ["scheduled", "lookup"], request=visitor)
    for values in frames:  # every lane has tokens on screen (a lane with none leaves no trace to write)
        shown = [values[FRAME_FIELDS.index(f"{lane}_tokens")] for lane in ("dflash", "scheduled", "lookup", "plain")]
        if all(isinstance(html, str) and html.count('class="tok ') >= 3 for html in shown):
            break
    assert app.live.stops.request("stopper") is True
    *_, last = frames
    last = dict(zip(FRAME_FIELDS, last))
    assert last["report"]["stopped"] is True, last["report"]
    trace = validate_trace(last["trace_file"])
    assert {lane: (run["method"], run["block_schedule"]) for lane, run in trace["runs"].items()} == {
        "dflash": ("dflash", "fixed"), "scheduled": ("dflash", "auto"), "lookup": ("lookup", "fixed"),
        "plain": ("plain", "fixed")}
