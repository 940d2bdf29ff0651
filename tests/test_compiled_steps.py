"""Compiled steps (`compiled_steps.py`): torch.compile'd verify and draft steps decode token for
token as the eager ones, through oneDNN-packed linears, and refuse what they cannot run."""

from __future__ import annotations

import pytest
import torch
from tiny import build_drafter, build_target

from dflash_core import DFlashDrafter, SamplingParams, Target, load_pair, run
from dflash_core.__main__ import main as cli_main
from dflash_core.bench.__main__ import main as bench_main
from dflash_core.cpu_linear import PackedLinear
from dflash_core.errors import ConfigError


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    """Two target layers and one drafter layer at block 4: three shapes to compile, in seconds."""
    root = tmp_path_factory.mktemp("compiled")
    target_dir = build_target(root / "target", num_layers=2)
    drafter_dir = build_drafter(root / "drafter", target_dir, num_layers=1, block_size=4)
    return Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)


def test_compiled_steps_decode_as_the_eager_ones(small_pair, monkeypatch):
    eager, drafter = small_pair
    compiled = Target(eager.model, static_cache=True, compiled=True)
    packed_calls = []
    packed_forward = PackedLinear.packed_forward

    def counted(self, x):
        packed_calls.append(x.shape[:-1].numel())
        return packed_forward(self, x)

    monkeypatch.setattr(PackedLinear, "packed_forward", counted)
    prompts = [[5, 6, 7, 8, 9], [3, 1, 4, 1, 5, 9, 2, 6]]
    for ids in prompts:
        plain = run(eager, ids, None, max_new_tokens=24)
        assert run(compiled, ids, None, max_new_tokens=24).output_ids == plain.output_ids
        for sampling in (SamplingParams(), SamplingParams(temperature=0.9, seed=3)):
            a = run(eager, ids, drafter, max_new_tokens=24, sampling=sampling)
            b = run(compiled, ids, drafter, max_new_tokens=24, sampling=sampling)
            assert b.output_ids == a.output_ids and b.acceptance_lengths == a.acceptance_lengths
            if sampling.greedy:
                assert b.output_ids == plain.output_ids
    feature_width = len(drafter.target_layer_ids) * eager.hidden_size
    shapes = {tuple(tuple(s) for s, _, _ in key[1:]): entry is not None for key, entry in compiled.graphs.graphs.items()}
    # Every shape compiled (none fell back to eager): verify of 1 and 4 tokens, the draft step.
    assert shapes == {((1, 1), (1, 1)): True, ((1, 4), (1, 4)): True, ((1,), (1, 4, feature_width), (1, 8)): True}
    # The compiled steps ran their linears through the packed weights (a small model packs one rows too).
    assert packed_calls and set(packed_calls) >= {1, 4}


def test_compiled_steps_need_the_static_cache_and_exclude_cuda_graphs(small_pair, tmp_path, capsys):
    eager, _ = small_pair
    with pytest.raises(ConfigError, match=r"Compiled steps need the static KV cache \(static_cache=True"):
        Target(eager.model, compiled=True)
    with pytest.raises(ConfigError, match="choose CUDA graphs or compiled steps"):
        Target(eager.model, static_cache=True, cuda_graphs=True, compiled=True)
    with pytest.raises(SystemExit):
        bench_main(["--compile", "--cuda-graphs", "--static-cache"])
    assert "--compile and --cuda-graphs" in capsys.readouterr().err


def test_compile_is_a_switch_of_the_loaders(tmp_path):
    target_dir = build_target(tmp_path / "target", num_layers=1)
    pair = load_pair(target_dir, compiled=True, static_cache=True)
    assert pair.target.graphs is not None and pair.target.static_cache
    # The CLI's --compile implies the static cache.
    assert cli_main(["generate", "--target", str(target_dir), "--plain", "--prompt-ids", "1,2", "--max-new-tokens",
                     "2", "--compile", "--quiet"]) == 0
    assert torch.compiler.is_compiling() is False
