"""The pair registry and the app's answers for pairs that cannot run here (no models are loaded)."""

from __future__ import annotations

import gradio as gr
import pytest

from app.pairs.models import PairCache, default_threads
from app.pairs.registry import PairSpec, availability, cli_pair, load_pairs
from app.ui import App


def test_pairs_file_lists_the_offline_default_and_the_hub_pairs():
    pairs, default_id = load_pairs()
    by_id = {p.id: p for p in pairs}
    assert default_id in by_id and by_id[default_id].target == "default:smollm2"
    assert by_id["qwen3-8b"].drafter == "z-lab/Qwen3-8B-DFlash-b16" and by_id["qwen3-8b"].is_hub
    assert by_id["qwen3-4b"].drafter == "z-lab/Qwen3-4B-DFlash-b16"
    assert not by_id[default_id].is_hub


def test_pairs_file_lists_todays_released_pairs_with_their_template_and_memory():
    by_id = {p.id: p for p in load_pairs()[0]}
    today = {
        "qwen3.5-4b": ("Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", {"enable_thinking": True}),
        "qwen3.5-9b": ("Qwen/Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash", {"enable_thinking": True}),
        "qwen3.6-35b-a3b": ("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", {"enable_thinking": True}),
        "gpt-oss-20b": ("openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash", {}),
        "qwen3.8-27b-dflash2": ("Qwen/Qwen3.8-27B", "z-lab/Qwen3.8-27B-DFlash2", {}),
        "qwen3-8b": ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", {"enable_thinking": False}),
    }
    for pair_id, (target, drafter, args) in today.items():
        spec = by_id[pair_id]
        assert (spec.target, spec.drafter, spec.chat_template_args) == (target, drafter, args)
        assert spec.needs_gpu and spec.dtype == "bfloat16" and spec.source
    for spec in by_id.values():  # every GPU pair says how much memory it takes, in its label too
        if spec.needs_gpu:
            assert spec.memory_gb and f"about {spec.memory_gb:g} GB" in spec.label


def test_hub_pairs_explain_that_they_need_a_gpu():
    pairs, _ = load_pairs()
    qwen = next(p for p in pairs if p.id == "qwen3-4b")
    assert "needs a CUDA GPU" in availability(qwen, "cpu")


def test_missing_drafter_says_how_to_train_it(tmp_path):
    spec = PairSpec("x", "x", "default:smollm2", str(tmp_path / "nope"), train_hint="python -m dflash_core.training.train")
    reason = availability(spec, "cpu")
    assert "not there yet" in reason and "python -m dflash_core.training.train" in reason


def test_unavailable_pair_shows_a_status_and_refuses_to_race(tmp_path):
    pairs, _ = load_pairs()
    app = App(pairs, "qwen3-8b", PairCache("cpu"))
    status = list(app.loading.load_selected("qwen3-8b"))
    assert len(status) == 1 and "Unavailable" in status[0][0] and "GPU" in status[0][0]
    assert "Replay a recorded run" in status[0][0]  # where no model runs, the page points to the replays
    with pytest.raises(gr.Error, match="needs a CUDA GPU"):
        list(app.live.compare("hello", 8, 4, 0.0, 1.0, 0, pair_id="qwen3-8b"))


def test_mismatched_pair_is_a_clear_error(tiny_dirs, tmp_path):
    from tiny import build_target

    other = build_target(tmp_path / "other", hidden=48)  # hidden size differs from the drafter's
    spec = cli_pair(str(other), str(tiny_dirs[1]))
    app = App([spec], spec.id, PairCache("cpu"))
    assert "Could not load" in list(app.loading.load_selected(spec.id))[-1][0]
    with pytest.raises(gr.Error, match="hidden_size"):
        list(app.live.compare("hello", 8, 4, 0.0, 1.0, 0))


def test_missing_target_files_are_a_clear_error(tiny_dirs, tmp_path):
    spec = cli_pair(str(tmp_path / "no-such-target"), str(tiny_dirs[1]))
    app = App([spec], spec.id, PairCache("cpu"))
    with pytest.raises(gr.Error, match="not found"):
        list(app.live.compare("hello", 8, 4, 0.0, 1.0, 0))


def test_thread_default_leaves_a_core_to_a_local_browser():
    assert default_threads("127.0.0.1", 2) == 1  # the browser repaints on the same two cores
    assert default_threads("localhost", 8) == 7
    assert default_threads("127.0.0.1", 1) is None  # nothing to leave
    assert default_threads("0.0.0.0", 2) is None  # viewers elsewhere (a Space): every core decodes


def test_the_offline_pair_names_the_drafters_bench_methods_races():
    """pairs.json and `bench --methods` name the same folder for each drafter lane of the offline pair:
    a renamed drafter is renamed in both (DEFAULT_DRAFTERS beside the pair's entry)."""
    from app.race.lanes import DRAFTER_LANES
    from dflash_core.bench.methods import DEFAULT_DRAFTERS

    pairs, default_id = load_pairs()
    offline = next(p for p in pairs if p.id == default_id)
    assert offline.lane_drafters() == DEFAULT_DRAFTERS and set(DEFAULT_DRAFTERS) == set(DRAFTER_LANES)


def test_a_vllm_pair_refuses_a_block_size_its_server_does_not_serve_before_asking_it():
    from app.pairs.registry import vllm_pair

    spec = vllm_pair("http://127.0.0.1:9/v1", None, 4)  # nothing listens there: the refusal comes first
    app = App([spec], spec.id, PairCache("cpu"))
    with pytest.raises(gr.Error, match=r"This vLLM pair's server drafts blocks of 4 \(vLLM fixes the block per "
                                       r"server\), so it cannot race block size 8: set the block size to 4"):
        list(app.live.compare("hello", 4, 8, 0.0, 1.0, 0))


def test_a_block_size_past_the_drafters_trained_one_is_refused_by_the_engines_check(tiny_dirs):
    spec = cli_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))
    app = App([spec], spec.id, PairCache("cpu"))
    trained = app.loading.cache.get(spec).trained_block_size
    with pytest.raises(gr.Error, match=rf"block_size {trained + 1} must be between 1 and the drafter's trained block "
                                       rf"size {trained}"):
        list(app.live.compare("hello", 4, trained + 1, 0.0, 1.0, 0))
