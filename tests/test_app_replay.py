"""Replay with no model: a race recorded by the app and replayed from its trace file looks the same.

Runs the app's own handlers in-process (no server): a live race on the tiny pair writes its trace,
and the replay of that file must give the same final text, token colours, draft strip and summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest

from app.pairs.models import PairCache
from app.pairs.registry import cli_pair
from app.serve.replay import ReplayError, load_trace
from app.ui import App
from app.view.frames import FRAME_FIELDS

REPO = Path(__file__).resolve().parents[1]


def final_frame(frames) -> dict:
    *_, last = frames
    return dict(zip(FRAME_FIELDS, last))


@pytest.fixture(scope="module")
def app(tiny_dirs):
    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    return App([spec], spec.id, PairCache("cpu"))


@pytest.fixture(scope="module", params=[0.0, 0.8], ids=["greedy", "sampled"])
def live(app, request):
    frames = list(app.live.compare("What is the capital of France?", 24, 4, request.param, 0.9, 3))
    return final_frame(frames)


def test_replay_reproduces_the_live_race(app, live):
    replayed = final_frame(app.playback.replay(live["trace_file"], None, 4.0))
    for name in ("dflash_tokens", "plain_tokens", "dflash_strip", "report"):
        assert replayed[name] == live[name], name
    # Same summary numbers (the note under them says it is a replay).
    assert replayed["summary"].split("</div></div></div>")[0] == live["summary"].split("</div></div></div>")[0]
    assert 'class="tok tok-' in replayed["dflash_tokens"] and "tok-plain" in replayed["plain_tokens"]


def test_trace_carries_the_schema_and_token_texts(live):
    data = json.loads(Path(live["trace_file"]).read_text())
    assert data["schema"] == "dflash-trace/2"
    recording = load_trace(live["trace_file"])
    ids = set(recording.dflash.output_ids) | {t for b in recording.dflash.blocks for t in b.draft_ids}
    assert ids <= set(recording.tokens)
    assert recording.report().to_dict() == data["report"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not JSON"),
        ('{"schema": "dflash-trace/99"}', 'this version reads "dflash-trace/2" and "dflash-trace/1"'),
        ("[1, 2]", "not an object"),
        ('{"schema": "dflash-trace/2", "runs": {}}', "missing field trace.settings"),
    ],
)
def test_bad_trace_files_give_a_clear_error(app, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(gr.Error) as excinfo:
        list(app.playback.replay(str(path), None, 1.0))
    assert message in str(excinfo.value)


def test_a_trace_of_one_side_is_not_a_race(app, live, tmp_path):
    data = json.loads(Path(live["trace_file"]).read_text())
    del data["runs"]["plain"]
    path = tmp_path / "one-side.json"
    path.write_text(json.dumps(data))
    with pytest.raises(gr.Error, match="holds no plain run"):
        list(app.playback.replay(str(path), None, 1.0))


def test_replay_speed_and_missing_file_are_checked(app, live, tmp_path):
    with pytest.raises(gr.Error, match="between 0.1x and 4x"):
        list(app.playback.replay(live["trace_file"], None, 8.0))
    with pytest.raises(gr.Error, match="not found"):
        list(app.playback.replay(str(tmp_path / "none.json"), None, 1.0))
    with pytest.raises(ReplayError, match="no trace chosen"):
        load_trace(None)


def test_every_shipped_trace_replays_and_the_landing_page_offers_them():
    from app.serve.replay import shipped_traces
    from app.ui import _trace_choices, recorded_runs

    shipped = shipped_traces()
    if not shipped:
        pytest.skip("no traces under assets/traces")
    categories = {label.split(",")[0] for _, label in shipped}
    assert {"math", "code", "chat", "story"} <= categories
    from app.race.interleave import SideView
    from app.view import render
    from app.view.cycle_view import cycle_html

    for path, _ in shipped:
        recording = load_trace(path)
        assert recording.dflash.blocks and recording.plain.blocks
        assert all(b.explain is not None for b in recording.dflash.blocks)  # every view has its data
        d, p = (SideView(side, run.prefill, run.blocks, run, run.total_s, run.block_size)
                for side, run in (("dflash", recording.dflash), ("plain", recording.plain)))
        tips = render.lane_tips(d, recording.text_of)
        assert len(tips) == len(recording.dflash.output_ids) and all("target top-5" in t for t in tips[1:])
        for i in range(len(d.blocks)):  # every cycle's view renders from the recorded explanation
            assert "Not recorded" not in cycle_html(d, p, i, recording.text_of)
    # Offered by name (what the API's schema lists), mapped back to the files on the server only.
    assert [name for _, name in _trace_choices()] == [p.stem for p, _ in shipped]
    assert list(recorded_runs().values()) == [str(p) for p, _ in shipped]


def test_a_shipped_replay_ends_on_its_recorded_summary():
    from app.serve.replay import shipped_traces

    shipped = shipped_traces()
    if not shipped:
        pytest.skip("no traces under assets/traces")
    path = shipped[0][0]
    app = App([], "", None)
    last = final_frame(app.playback.replay(str(path), None, 4.0))
    recorded = json.loads(path.read_text())
    assert last["report"] == recorded["report"]
    assert last["dflash_tokens"].count('class="tok ') == len(recorded["runs"]["dflash"]["output_ids"])
    assert "Cycle " in last["cycle_view"] and "Finished" in last["control_status"]


def test_a_replay_only_app_never_imports_torch():
    code = (
        "import sys; from app.ui import build_demo; "
        f"build_demo([], '', None, replay={str(REPO / 'assets' / 'traces' / 'math-greedy.json')!r}, live=False); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_live_race_pauses_steps_one_cycle_and_stays_lossless(app):
    from types import SimpleNamespace

    request = SimpleNamespace(session_hash="live-step")
    frames = app.live.compare("What is the capital of France?", 24, 4, 0.0, 1.0, 0, None, None, request)

    def bonus_count(frame):
        html = frame.get("dflash_tokens")
        return html.count("tok-bonus") if isinstance(html, str) else -1

    frame = {}
    while bonus_count(frame) < 1:
        frame = dict(zip(FRAME_FIELDS, next(frames)))
    app.stepping.pause(request)
    while "Paused" not in str(frame["control_status"]):
        frame = dict(zip(FRAME_FIELDS, next(frames)))
    paused = bonus_count(frame)
    assert "cycle 1 · slot" in frame["dflash_tokens"]  # paused frames carry the hover boxes
    panes = [name for name in FRAME_FIELDS if name.endswith(("_stats", "_tokens", "_strip"))]
    seen = {}
    for k in (1, 2):
        assert app.stepping.step(request)[0] == gr.update()  # the race's next frame says where it paused
        frame = dict(zip(FRAME_FIELDS, next(frames)))
        while "Paused" not in str(frame["control_status"]):
            frame = dict(zip(FRAME_FIELDS, next(frames)))
        assert bonus_count(frame) == paused + k  # one DFlash cycle per Step
        seen[k] = {name: frame[name] for name in panes if isinstance(frame[name], str)}
    # Back one cycle in the paused race: both lanes' panes as the race showed them paused there.
    follow, *back = app.lecture.previous_cycle(paused + 2, request)
    back = dict(zip(FRAME_FIELDS, back))
    assert follow is False and back["control_status"].startswith(f"**Back at cycle {paused + 1}** of {paused + 2}:")
    assert all(back[name] == html for name, html in seen[1].items()) and seen[1]["plain_tokens"] != seen[2]["plain_tokens"]
    app.stepping.resume(request)
    *_, last = frames
    report = dict(zip(FRAME_FIELDS, last))["report"]
    assert report["identical"] is True and report["dflash_tokens"] == report["plain_tokens"]


def test_the_app_starts_on_a_machine_whose_gradio_upload_folder_does_not_exist_yet(tmp_path, monkeypatch):
    from app.ui import build_demo

    uploads = tmp_path / "fresh" / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    demo = build_demo([], "", None, live=False)
    # The folder exists (the trace copies handed out go there); the trace files themselves do not.
    assert uploads.is_dir() and not list(uploads.iterdir())
    assert not demo.dflash_app.traces.root.is_relative_to(uploads)
