"""Loading you can watch: Hub download progress on the status line, pairs freed when the GPU is
full, and every load or race failure as a clear message."""

from __future__ import annotations

import shutil

import gradio as gr
import pytest
import torch
from test_memory_need import FakeApi, not_found

import app.serve.loading as loading
import dflash_core
from app.pairs.models import PairCache
from app.pairs.registry import PairSpec
from app.serve.failures import failure_message
from app.ui import App
from dflash_core.errors import user_message
from dflash_core.models.hub import progress_tqdm

GB = 2**30


def spec_for(target, drafter, pair_id="p", label="tiny pair"):
    return PairSpec(id=pair_id, label=label, target=str(target), drafter=str(drafter))


def hub_sizes(**entries):
    """A fake `HfApi` for the size query: the two fake repos at `entries` (defaults: 3 and 1 GB of bf16)."""
    table = {"fake-org/target": ({"BF16": 3 * GB // 2}, {}), "fake-org/drafter": ({"BF16": GB // 2}, {})}
    table.update({f"fake-org/{name}": value for name, value in entries.items()})
    return FakeApi(table)


@pytest.fixture
def fake_hub(monkeypatch, tiny_dirs, tmp_path):
    """snapshot_download that reports 3 files and 3 GB through `tqdm_class`, then returns a tiny model;
    `HfApi` (the size query before download) answers from `hub_sizes()`."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", hub_sizes)

    local = {"fake-org/target": tiny_dirs[0], "fake-org/drafter": tiny_dirs[1]}
    calls = []

    def snapshot_download(repo_id, allow_patterns=None, tqdm_class=None, **kwargs):
        calls.append((repo_id, tuple(allow_patterns)))
        files = tqdm_class(total=3, desc="Fetching 3 files")
        data = tqdm_class(total=0, unit="B", unit_scale=True, desc="Downloading bytes")
        data.total = 3 * GB  # huggingface_hub grows the total as files start
        for _ in range(3):
            data.update(GB)
            files.update(1)
        dest = tmp_path / repo_id.replace("/", "--")
        if not dest.exists():
            shutil.copytree(local[repo_id], dest)
        return str(dest)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(loading, "PROGRESS_EVERY_S", 0.0)
    return calls


def test_download_progress_reaches_the_status_line(fake_hub):
    spec = spec_for("fake-org/target", "fake-org/drafter")
    app = App([spec], spec.id, PairCache("cpu"))
    lines = [status for status, _ in app.loading.load_selected(spec.id)]
    assert lines[0] == "Loading **tiny pair** on cpu (first time only)…"
    assert "downloading fake-org/target: 1.00 of 3.00 GB, 1 of 3 files" in " ".join(lines)
    assert "downloading fake-org/drafter: 3.00 of 3.00 GB, 3 of 3 files" in " ".join(lines)
    assert lines[-1].startswith("✓ **tiny pair** ready on cpu")
    # The target's snapshot holds its weights, config and tokenizer; the drafter's its two files.
    assert fake_hub[0][0] == "fake-org/target" and "*.safetensors" in fake_hub[0][1]
    assert fake_hub[1] == ("fake-org/drafter", ("config.json", "model.safetensors"))


def test_the_size_from_the_hub_reaches_the_status_line_before_the_download(fake_hub):
    spec = spec_for("fake-org/target", "fake-org/drafter")
    app = App([spec], spec.id, PairCache("cpu"))
    lines = [status for status, _ in app.loading.load_selected(spec.id)]
    # 1.5 G and 0.5 G bf16 values, loaded as float32 on the CPU.
    assert lines[1] == (
        "Loading **tiny pair** on cpu (first time only): weights 8.0 GB (target 6.0 GB + drafter 2.00 GB, "
        "from the Hub's metadata), about 10.0 GB with 25% for the KV caches and activations…"
    )
    assert "downloading" in lines[2]  # the size came first
    assert lines[-1].startswith("✓ **tiny pair** ready on cpu") and "; weights 8.0 GB (target 6.0 GB" in lines[-1]


GPU_PAIR = PairSpec(id="big", label="big pair", target="fake-org/big", drafter="fake-org/drafter", needs_gpu=True,
                    dtype="bfloat16")


def test_a_gpu_too_small_for_the_pair_is_refused_before_anything_downloads(fake_hub):
    cache = PairCache("cuda:0", memory=lambda: (20 * GB, 24 * GB), hub_api=hub_sizes(big=({"BF16": 30 * GB}, {})))
    app = App([GPU_PAIR], GPU_PAIR.id, cache)
    *_, (status, _) = app.loading.load_selected(GPU_PAIR.id)
    assert status.startswith("⚠ **Could not load big pair:** big pair needs about 76.2 GB on cuda:0 (weights 61.0 GB")
    assert "but cuda:0 has 20.0 GB free of 24.0 GB. The GPU is too small for this pair" in status
    assert fake_hub == [] and not cache.is_loaded(GPU_PAIR)  # nothing downloaded, nothing loaded
    with pytest.raises(gr.Error) as raised:  # a race on it says the same, and the app keeps serving
        list(app.live.compare("Hi", 8, 4, 0.0, 1.0, 0, pair_id=GPU_PAIR.id))
    assert "The GPU is too small for this pair" in raised.value.message


def test_a_pair_missing_from_the_hub_is_broken_not_too_big(fake_hub):
    cache = PairCache("cuda:0", memory=lambda: (100 * GB, 141 * GB), hub_api=hub_sizes(big=not_found("fake-org/big")))
    *_, (status, _) = App([GPU_PAIR], GPU_PAIR.id, cache).loading.load_selected(GPU_PAIR.id)
    assert "'fake-org/big' is not a model repository on the Hugging Face Hub" in status and fake_hub == []


def test_an_unreachable_hub_says_so_and_the_pair_still_loads(fake_hub):
    offline = hub_sizes(target=ConnectionError("[Errno -3] Temporary failure in name resolution"))
    spec = spec_for("fake-org/target", "fake-org/drafter")
    lines = [status for status, _ in App([spec], spec.id, PairCache("cpu", hub_api=offline)).loading.load_selected(spec.id)]
    assert "size unknown before download: the Hub could not be reached for fake-org/target (ConnectionError" in lines[1]
    assert [repo for repo, _ in fake_hub] == ["fake-org/target", "fake-org/drafter"]  # downloaded anyway
    assert lines[-1].startswith("✓ **tiny pair** ready on cpu") and "from the safetensors files" in lines[-1]


def test_progress_is_counted_even_when_the_bar_is_not_shown():
    seen = []
    bar_class = progress_tqdm("org/model", seen.append)
    files = bar_class(total=2, disable=True)
    data = bar_class(total=4 * GB, unit="B", disable=True)
    data.update(GB)
    files.update(1)
    assert seen[-1].message() == "downloading org/model: 1.00 of 4.00 GB, 1 of 2 files"


def test_switching_pairs_frees_the_previous_one_unless_memory_allows_both(tiny_dirs):
    free = {"bytes": 100 * GB}
    cache = PairCache("cpu", memory=lambda: (free["bytes"], 141 * GB))
    first, second, third = (spec_for(*tiny_dirs, pair_id=i, label=f"pair {i}") for i in "abc")
    app = App([first, second, third], "a", cache)
    *_, (status, _) = app.loading.load_selected("a")
    assert "Freed" not in status
    *_, (status, _) = app.loading.load_selected("b")  # plenty of room: both stay
    assert cache.is_loaded(first) and cache.is_loaded(second) and cache.freed == []
    free["bytes"] = 1000  # less than the next pair's weights
    *_, (status, _) = app.loading.load_selected("c")
    assert cache.is_loaded(third) and not cache.is_loaded(first) and not cache.is_loaded(second)
    assert cache.freed == ["pair a", "pair b"] and "Freed pair a, pair b to make room." in status


def test_cpu_pairs_are_never_freed(tiny_dirs):
    cache = PairCache("cpu")  # the real query: no device memory to count on a CPU
    cache.get(spec_for(*tiny_dirs, pair_id="a"))
    cache.get(spec_for(*tiny_dirs, pair_id="b"))
    assert cache.is_loaded(spec_for(*tiny_dirs, pair_id="a")) and cache.freed == []


class FailingCache(PairCache):
    def __init__(self, error):
        super().__init__("cuda:0")
        self.error = error

    def get(self, spec, progress=None):
        raise self.error


@pytest.mark.parametrize("error, words", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "out of GPU memory on cuda:0 (CUDA out of memory"),
    (RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors..."), "CUDA error on cuda:0 (RuntimeError: CUDA error: an illegal memory access"),
    (FileNotFoundError(2, "No such file", "/models/x/model-00001.safetensors"), "a file is missing: /models/x/model-00001.safetensors"),
])
def test_load_failures_reach_the_visitor_as_messages(tiny_dirs, error, words):
    spec = spec_for(*tiny_dirs)
    app = App([spec], spec.id, FailingCache(error))
    *_, (status, _) = app.loading.load_selected(spec.id)
    assert status.startswith("⚠ **Could not load tiny pair:** ") and words in status
    with pytest.raises(gr.Error) as raised:
        list(app.live.compare("Hi", 8, 4, 0.0, 1.0, 0, pair_id=spec.id))
    assert words in raised.value.message


def test_a_cuda_error_during_the_race_is_a_message(tiny_dirs, monkeypatch):
    spec = spec_for(*tiny_dirs)
    app = App([spec], spec.id, PairCache("cpu"))

    def broken_generate(*args, **kwargs):
        raise RuntimeError("CUDA error: device-side assert triggered")
        yield

    monkeypatch.setattr(dflash_core, "generate", broken_generate)  # the race imports it at call time
    with pytest.raises(gr.Error) as raised:
        list(app.live.compare("Hi", 8, 4, 0.0, 1.0, 0, pair_id=spec.id))
    assert raised.value.message.startswith("CUDA error on cpu (RuntimeError: CUDA error: device-side assert")


def test_failure_messages_never_say_just_error():
    assert failure_message(ValueError("bad")) == "unexpected ValueError: bad"
    assert failure_message(PermissionError(13, "Permission denied")).startswith("could not read the model files")


def test_the_app_adds_its_advice_to_the_engine_words():
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    engine = user_message(error, "cuda:0")
    assert engine == "CUDA error on cuda:0 (RuntimeError: CUDA error: an illegal memory access was encountered)."
    assert failure_message(error, "cuda:0") == engine + " If it repeats, restart the app: the GPU state may be broken."
    out_of_memory = user_message(torch.OutOfMemoryError("CUDA out of memory."), "cuda:0")
    assert "Load one pair" not in out_of_memory and "restart" not in engine
