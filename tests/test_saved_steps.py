"""Saved compiled steps (`speed/saved_steps.py`): a later backend loads what an earlier one compiled
and saved, instead of tracing it, and decodes token for token as it did; a step whose key inputs
changed (taps, a linear's path, the engine's source) is not loaded, a damaged file is compiled
again, and the steps of builds not used lately are removed."""

from __future__ import annotations

import os

import pytest
import torch
from torch._dynamo.utils import counters

from dflash_core import SamplingParams, Target, run
from dflash_core.errors import ConfigError
from dflash_core.speed import fallbacks, saved_steps
from dflash_core.speed.cpu_linear import PackedLinear

pytestmark = pytest.mark.skipif(not saved_steps.available(), reason="this torch has no aot_compile")

IDS = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture
def new_process(monkeypatch):
    """What a later process starts from: no traced code in dynamo, no step loaded from a file."""
    monkeypatch.setattr(saved_steps, "_KNOWN", {})
    monkeypatch.setattr(saved_steps, "_READ", set())
    monkeypatch.setattr(fallbacks, "NOTICES", [])
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def later_process() -> None:
    """Forget, as a later process would start without them, dynamo's traced code and the steps read."""
    torch._dynamo.reset()
    saved_steps._KNOWN.clear()
    saved_steps._READ.clear()


def saving(eager: Target, folder) -> Target:
    return Target(eager.model, eager.tokenizer, static_cache=True, compiled=True, compile_gemms="library",
                  steps_folder=folder)


def decode(target, drafter) -> list:
    """Plain decoding, DFlash greedy, DFlash sampled and DFlash verifying trees, each run's tokens."""
    return [run(target, IDS, None, max_new_tokens=16).output_ids,
            run(target, IDS, drafter, max_new_tokens=16).output_ids,
            run(target, IDS, drafter, max_new_tokens=16, sampling=SamplingParams(temperature=0.9, seed=3)).output_ids,
            run(target, IDS, drafter, max_new_tokens=16, tree_budget=4).output_ids]


def test_a_later_backend_loads_the_saved_steps_and_decodes_as_the_first(small_pair, tmp_path, new_process):
    eager, drafter = small_pair
    expected = decode(eager, drafter)
    first = saving(eager, tmp_path)
    assert decode(first, drafter) == expected
    saved = first.graphs.backend.saved
    assert saved.folder.parent == tmp_path  # a folder for this build of torch, transformers and the engine
    files = sorted(saved.folder.iterdir())
    # The one-token verify, the block verify (every length from 2 on), the draft step, the tree's verify.
    assert saved.saved == len(files) == 4 and all(path.suffix == saved_steps.SUFFIX for path in files)

    later_process()
    traced = counters["stats"]["unique_graphs"]
    later = saving(eager, tmp_path)
    assert decode(later, drafter) == expected
    assert counters["stats"]["unique_graphs"] == traced  # dynamo traced nothing
    assert (later.graphs.backend.saved.saved, sorted(saved.folder.iterdir())) == (0, files)
    assert later.graphs.backend.saved.loaded >= 4


def test_a_changed_key_input_is_not_loaded(small_pair, tmp_path, new_process):
    eager, drafter = small_pair
    target = saving(eager, tmp_path)
    target.reset(64)

    def key(tag=("verify", 64, ())):
        ids = torch.tensor([[5]])
        return saved_steps.step_key(target._step, tag, (ids, ids), {})

    assert key() == key() == saved_steps.step_key(saving(eager, tmp_path)._step, ("verify", 64, ()),
                                                  (torch.tensor([[5]]),) * 2, {})
    assert key(("verify", 64, (0,))) != key()  # another set of tapped layers
    linear = next(m for m in eager.model.modules() if isinstance(m, PackedLinear))
    before = key()
    assert "rows_limit" not in vars(linear)  # the class's bound
    linear.rows_limit = 8
    try:
        assert key() != before  # a linear's bound is read by the trace, not by a tensor guard
    finally:
        del linear.rows_limit
    assert key() == before
    ids = torch.tensor([[5, 6]])
    assert saved_steps.step_key(target._step, ("verify", 64, ()), (ids, ids), {}) != before  # a block, not one token


def test_the_engine_source_and_its_variables_name_the_folder(small_pair, tmp_path, new_process, monkeypatch):
    eager, _ = small_pair

    def folder():
        return saving(eager, tmp_path).graphs.backend.saved.folder

    before = folder()
    assert folder() == before
    monkeypatch.setenv("DFLASH_CPU_ROWS", "off")
    assert folder() != before
    monkeypatch.delenv("DFLASH_CPU_ROWS")
    monkeypatch.setattr(saved_steps, "_sources_digest", lambda: "edited")
    assert folder() != before


def test_a_damaged_file_is_compiled_again_with_a_warning(small_pair, tmp_path, new_process):
    eager, drafter = small_pair
    expected = run(eager, IDS, None, max_new_tokens=8).output_ids
    first = saving(eager, tmp_path)
    assert run(first, IDS, None, max_new_tokens=8).output_ids == expected
    (path,) = first.graphs.backend.saved.folder.iterdir()
    path.write_bytes(path.read_bytes()[:1000])
    later_process()
    again = saving(eager, tmp_path)
    with pytest.warns(fallbacks.FallbackWarning, match="a saved compiled step did not load"):
        assert run(again, IDS, None, max_new_tokens=8).output_ids == expected
    assert (again.graphs.backend.saved.loaded, again.graphs.backend.saved.saved) == (0, 1)
    assert list(path.parent.iterdir()) == [path]  # written again in its place


def test_a_folder_is_for_compiled_targets_and_without_one_nothing_is_saved(small_pair, tmp_path):
    eager, _ = small_pair
    assert Target(eager.model, static_cache=True, compiled=True, compile_gemms="library").graphs.backend.saved is None
    with pytest.raises(ConfigError, match=r"steps_folder=.* is for compiled steps \(compiled=True\)"):
        Target(eager.model, static_cache=True, steps_folder=tmp_path)


def test_a_step_that_cannot_be_prepared_for_saving_compiles_as_before(small_pair, tmp_path, new_process, monkeypatch):
    eager, _ = small_pair

    def refuse(entries):
        raise RuntimeError("no guards today")

    monkeypatch.setattr(saved_steps, "tensor_guards", refuse)
    monkeypatch.setattr(saved_steps, "_UNSAVABLE", set())
    target = saving(eager, tmp_path)
    with pytest.warns(fallbacks.FallbackWarning, match="could not be prepared for saving .*no guards today"):
        assert run(target, IDS, None, max_new_tokens=8).output_ids == run(eager, IDS, None, max_new_tokens=8).output_ids
    assert target.graphs.graphs and all(entry is not None for entry in target.graphs.graphs.values())  # compiled
    assert not any(tmp_path.iterdir())


def test_saving_removes_the_steps_of_environments_not_used_lately(small_pair, tmp_path, new_process):
    eager, _ = small_pair
    for age, name in enumerate(["newest", "older", "oldest", "ancient"]):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1e9 - age, 1e9 - age))
    target = saving(eager, tmp_path)
    assert run(target, IDS, None, max_new_tokens=4).output_ids == run(eager, IDS, None, max_new_tokens=4).output_ids
    here = target.graphs.backend.saved.folder
    assert here.parent == tmp_path and len(list(here.iterdir())) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([here.name, "newest", "older"])


def test_a_folder_that_cannot_be_written_leaves_the_steps_compiled_unsaved(small_pair, tmp_path, new_process):
    eager, _ = small_pair
    (tmp_path / "a-file").write_text("not a folder")
    target = saving(eager, tmp_path / "a-file" / "steps")
    with pytest.warns(fallbacks.FallbackWarning, match="a compiled step could not be saved to .*the next process compiles"):
        assert run(target, IDS, None, max_new_tokens=8).output_ids == run(eager, IDS, None, max_new_tokens=8).output_ids
    assert all(entry is not None for entry in target.graphs.graphs.values())
    assert target.graphs.backend.saved.saved == 0
