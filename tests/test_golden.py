"""Golden parity: the engine reproduces the reference implementation's traces token for token.

The reference drafts come from a float32 drafter beside the float32 target (the `golden_pair`
fixture; `--drafter-dtype float32` on the CLI). A bf16 drafter, the default where the CPU runs bf16
natively, proposes other drafts at near-ties but leaves the output unchanged.
"""

import pytest
import torch

from dflash_core import run


@pytest.mark.parametrize("prompt_index", [0, 1, 2])
def test_plain_decoding_matches_reference_greedy(golden_pair, golden_expected, prompt_index):
    target, _ = golden_pair
    prompt = golden_expected["prompts"][prompt_index]
    summary = run(target, prompt["prompt_ids"], max_new_tokens=golden_expected["max_new_tokens"])
    assert list(summary.output_ids) == prompt["target_greedy_ids"]


@pytest.mark.parametrize("prompt_index", [0, 1, 2])
def test_dflash_trace_matches_reference(golden_pair, golden_expected, prompt_index):
    target, drafter = golden_pair
    assert (target.dtype, drafter.dtype) == (torch.float32, torch.float32)
    prompt = golden_expected["prompts"][prompt_index]
    assert {r["block_size"] for r in prompt["runs"]} == {8, 4}
    for ref in prompt["runs"]:
        summary = run(
            target, prompt["prompt_ids"], drafter, max_new_tokens=golden_expected["max_new_tokens"], block_size=ref["block_size"]
        )
        assert list(summary.output_ids) == ref["output_ids"]
        assert summary.acceptance_lengths == ref["acceptance_lengths"]
        drafts = [list(b.draft_ids) for b in summary.blocks]
        assert drafts[:-1] == ref["draft_blocks"][:-1]
        assert len(drafts) == len(ref["draft_blocks"])


def test_golden_pair_has_partial_acceptance(golden_pair, golden_expected):
    """Guards the parity test itself: the traces exercise rollback after partial acceptance."""
    lengths = [l for p in golden_expected["prompts"] for r in p["runs"] for l in r["acceptance_lengths"]]
    assert any(1 < l < 8 for l in lengths)


@pytest.mark.parametrize("prompt_index", [0, 1, 2])
def test_bf16_drafter_keeps_reference_outputs(golden_dir, golden_pair, golden_expected, prompt_index):
    from dflash_core import DFlashDrafter

    target, _ = golden_pair
    drafter = DFlashDrafter.from_pretrained(golden_dir / "drafter", dtype=torch.bfloat16)
    prompt = golden_expected["prompts"][prompt_index]
    for ref in prompt["runs"]:
        summary = run(target, prompt["prompt_ids"], drafter, max_new_tokens=golden_expected["max_new_tokens"],
                      block_size=ref["block_size"])
        assert list(summary.output_ids) == ref["output_ids"]
