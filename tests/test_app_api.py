"""The app served on a tiny random pair, driven through its public `compare` API with gradio_client."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

gradio_client = pytest.importorskip("gradio_client")

from serve import free_port, launch_app  # noqa: E402

from app.pairs.models import PairCache  # noqa: E402
from app.pairs.registry import cli_pair  # noqa: E402
from app.ui import build_demo  # noqa: E402
from app.view.frames import API_FIELDS  # noqa: E402
from dflash_core.trace import validate_trace  # noqa: E402


@pytest.fixture(scope="module")
def app_url(tiny_dirs, one_thread):
    demo, url = launch_app(*tiny_dirs)
    yield url
    demo.close()


@pytest.fixture(scope="module")
def client(app_url):
    return gradio_client.Client(app_url, verbose=False)


def test_compare_endpoint_is_named_with_the_documented_parameters(client):
    info = client.view_api(return_format="dict", print_info=False)
    params = [p["parameter_name"] for p in info["named_endpoints"]["/compare"]["parameters"]]
    assert params == ["prompt", "max_new_tokens", "block_size", "temperature", "top_p", "seed", "lanes", "thinking", "tree_budget"]


def test_compare_streams_updates_and_ends_with_a_lossless_summary(client):
    job = client.submit("What is the capital of France?", 24, 4, 0.0, 1.0, 0, api_name="/compare")
    result = job.result(timeout=60)
    updates = job.outputs()
    assert len(updates) >= 3, "the race should stream intermediate frames"
    # Intermediate frames: tokens growing in the panes before the summary exists.
    tokens = API_FIELDS.index("dflash_tokens")
    counts = [u[tokens].count('class="tok ') for u in updates[:-1] if isinstance(u[tokens], str)]
    assert counts[0] == 0 and max(counts) >= 1 and counts == sorted(counts)
    summary = result[-2]
    assert summary["identical"] is True and summary["first_difference"] is None
    assert summary["tau"] >= 1.0 and summary["speedup"] > 0
    assert summary["dflash_tok_s"] > 0 and summary["plain_tok_s"] > 0
    assert summary["dflash_tokens"] == summary["plain_tokens"] <= 24
    # Token panes carry colored spans; the trace file is the engine's trace of both sides.
    assert len(result) == len(API_FIELDS)
    named = dict(zip(API_FIELDS, result))
    assert 'class="tok tok-' in named["dflash_tokens"] and "tok-plain" in named["plain_tokens"]
    trace_path = result[-1]
    trace = validate_trace(trace_path)
    assert trace["runs"]["dflash"]["output_ids"] == trace["runs"]["plain"]["output_ids"]
    assert all("explain" in b for b in trace["runs"]["dflash"]["blocks"] + trace["runs"]["plain"]["blocks"])
    assert trace["report"]["tau"] == summary["tau"]
    # Beside it, the per-block CSV: a header and one row per block of each side.
    rows = Path(result[-3]).read_text().splitlines()
    assert rows[0].startswith("lane,index,position,accepted")
    assert len(rows) == 1 + len(trace["runs"]["dflash"]["blocks"]) + len(trace["runs"]["plain"]["blocks"])


def test_sampling_reports_no_lossless_check(client):
    result = client.predict("Tell me a story.", 12, 4, 0.8, 0.9, 3, api_name="/compare")
    assert result[-2]["identical"] is None and result[-2]["tau"] >= 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (("   ", 16, 4, 0.0, 1.0, 0), "prompt is empty"),
        (("x" * 20_000, 16, 4, 0.0, 1.0, 0), "limit"),
        # Past the drafter's trained size (8) but inside the slider: the engine's message.
        (("hi", 16, 12, 0.0, 1.0, 0), "block_size 12"),
        # Outside a slider's range, or not a number at all: the app's checks name the bounds.
        (("hi", 16, 4, -1.0, 1.0, 0), "temperature must be in [0, 100], got -1.0"),
        (("hi", 0, 4, 0.0, 1.0, 0), "max_new_tokens must be between 1 and 512, got 0"),
        (("hi", "ten", 4, 0.0, 1.0, 0), "max_new_tokens must be a number, got 'ten'"),
        (("hi", 500, 4, 0.0, 1.0, 0), "exceeds the target's context"),
    ],
)
def test_bad_inputs_give_clear_errors_and_the_app_keeps_serving(client, args, message):
    with pytest.raises(Exception) as excinfo:
        client.predict(*args, api_name="/compare")
    assert message in str(excinfo.value)
    ok = client.predict("hi", 4, 2, 0.0, 1.0, 0, api_name="/compare")
    assert ok[-2]["identical"] is True


@pytest.fixture(scope="module")
def two_pair_client(tiny_dirs, one_thread, tmp_path_factory):
    """The app offering two tiny pairs that differ in block size (8, the default, and 4)."""
    from tiny import build_drafter

    target_dir, drafter_dir = tiny_dirs
    b4 = build_drafter(tmp_path_factory.mktemp("b4") / "drafter", target_dir, block_size=4)
    pairs = [cli_pair(str(target_dir), str(drafter_dir)),
             replace(cli_pair(str(target_dir), str(b4)), id="tiny-b4", label="tiny pair, block 4")]
    demo = build_demo(pairs, pairs[0].id, PairCache("cpu"))
    demo.queue().launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield gradio_client.Client(demo.local_url, verbose=False)
    demo.close()


def test_pair_selector_switches_the_pair_this_session_races(two_pair_client):
    client = two_pair_client

    def race(block_size):
        result = client.predict("What is 2+2?", 12, block_size, 0.0, 1.0, 0, api_name="/compare")
        return json.loads(Path(result[-1]).read_text())["pair"], result[-2]

    status, slider = client.predict("tiny-b4", api_name="/select_pair")
    assert "tiny pair, block 4" in status and "trained with block size 4" in status
    assert slider["value"] == slider["maximum"] == 4
    pair, summary = race(4)
    assert pair["id"] == "tiny-b4" and summary["identical"] is True and summary["block_size"] == 4
    with pytest.raises(Exception, match="trained block size 4"):  # the drafter's own bound
        client.predict("What is 2+2?", 12, 8, 0.0, 1.0, 0, api_name="/compare")
    status, slider = client.predict("cli", api_name="/select_pair")
    assert "trained with block size 8" in status and slider["value"] == 8
    pair, summary = race(8)
    assert pair["id"] == "cli" and summary["identical"] is True


def test_compare_takes_the_thinking_switch_by_name_and_a_template_without_it_refuses(client):
    with pytest.raises(Exception, match=r"its chat template has no thinking switch \(enable_thinking\), so a race on it "
                                        "cannot turn thinking on"):
        client.predict("Hi", 4, 4, 0.0, 1.0, 0, [], "on", api_name="/compare")
    with pytest.raises(Exception, match="thinking must be one of default, on, off, got 'sometimes'"):
        client.predict("Hi", 4, 4, 0.0, 1.0, 0, [], "sometimes", api_name="/compare")
    result = client.predict("Hi", 4, 4, 0.0, 1.0, 0, [], "default", api_name="/compare")
    assert dict(zip(API_FIELDS, result))["report"]["identical"] is True
