"""The target's grouped-query SDPA computes bitwise what transformers' `sdpa` does, without repeating heads."""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_module
from families import build_family_target

from dflash_core import Target
from dflash_core.models.attention import GROUPED_SDPA

PROMPT = list(range(5, 25))
BLOCK = [40, 41, 42, 43, 44]
STEPS = [50, 51, 52]
NO_STATIC_CACHE = ("gemma4",)


def logits_of_a_run(target: Target) -> list[torch.Tensor]:
    """The logits of a prefill, a verify of a block with two slots rejected, and one-token steps."""
    target.reset()
    outputs = [target.forward(torch.tensor([PROMPT]))[0]]
    outputs.append(target.forward(torch.tensor([BLOCK]))[0])
    target.crop(len(PROMPT) + 3)
    outputs += [target.forward(torch.tensor([[token]]))[0] for token in STEPS]
    return outputs


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma4"])
def grouped_target(request, tmp_path_factory):
    """(family, directory) of a tiny target with 4 query heads on 2 key/value heads."""
    return request.param, build_family_target(tmp_path_factory.mktemp(request.param) / "target", request.param)


@pytest.mark.parametrize("static_cache", [False, True])
@torch.inference_mode()
def test_grouped_sdpa_gives_bitwise_the_logits_of_transformers_sdpa(grouped_target, static_cache):
    family, directory = grouped_target
    if static_cache and family in NO_STATIC_CACHE:
        pytest.skip(f"{family}'s sliding-window layers take the dynamic cache only")
    target = Target.from_pretrained(directory, static_cache=static_cache)
    config = target.model.config
    assert config._attn_implementation == GROUPED_SDPA and config.num_key_value_heads < config.num_attention_heads
    grouped = logits_of_a_run(target)
    target.model.set_attn_implementation("sdpa")
    repeated = logits_of_a_run(target)
    for a, b in zip(grouped, repeated, strict=True):
        assert torch.equal(a, b)


@torch.inference_mode()
def test_grouped_sdpa_never_repeats_the_cache_per_query_head(grouped_target, monkeypatch):
    family, directory = grouped_target
    # A verify step passes a mask with either cache, and so does every step over a static one.
    target = Target.from_pretrained(directory, static_cache=family not in NO_STATIC_CACHE)

    def repeat_kv(*args):
        raise AssertionError("a key/value head was repeated for its query heads")

    monkeypatch.setattr(sdpa_module, "repeat_kv", repeat_kv)
    logits_of_a_run(target)
    target.model.set_attn_implementation("sdpa")  # the check itself catches transformers' repeat
    with pytest.raises(AssertionError, match="repeated"):
        logits_of_a_run(target)
