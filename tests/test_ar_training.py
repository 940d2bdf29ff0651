"""The autoregressive drafter's training mode: its causal mask and layout, a tiny run whose loss
falls, and the released-format files it writes (`--drafter-kind ar`)."""

from __future__ import annotations

import json

import torch
from test_train import overfit_setup

from dflash_core import DFlashDrafter
from dflash_core.models.config import parse_drafter_config
from dflash_core.training.objective import block_layout, dense_block_mask
from dflash_core.training.train import main


def test_causal_mask_sees_the_context_before_the_anchor_and_the_block_up_to_itself():
    mask = dense_block_mask(torch.tensor([3, 5]), 8, 3, causal=True)
    assert mask.shape == (6, 14)
    assert mask[0, :3].all() and not mask[0, 3:8].any()
    assert mask[4, :5].all() and not mask[4, 5:8].any()
    own = mask[:, 8:]
    assert own[:3, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert not own[:3, 3:].any() and not own[3:, :3].any()
    assert own[3:, 3:].tolist() == own[:3, :3].tolist()


def test_causal_layout_holds_the_real_tokens_and_dflash_labels():
    ids = torch.arange(100, 110)
    anchors = torch.tensor([2, 8])
    block_ids, positions, labels, valid = block_layout(anchors, 10, 4, 7, ids, causal=True)
    # Three real tokens from the anchor on; past the sequence's end the mask id, never a label.
    assert block_ids.tolist() == [102, 103, 104, 108, 109, 7]
    assert positions.tolist() == [*range(10), 2, 3, 4, 8, 9, 10]
    assert labels.tolist() == [[103, 104, 105], [109, -100, -100]]
    _, _, dflash_labels, dflash_valid = block_layout(anchors, 10, 4, 7, ids)
    assert torch.equal(labels, dflash_labels) and torch.equal(valid, dflash_valid)


def test_ar_training_loss_falls_and_writes_an_autoregressive_drafter(tiny_dirs, tmp_path, one_thread):
    target_dir, _ = tiny_dirs
    out = tmp_path / "out"
    target, _, common = overfit_setup(target_dir, tmp_path / "data")
    summary = main([*common, "--out", str(out), "--drafter-kind", "ar", "--init-from-target", "--max-steps", "30"])
    assert summary["step"] == 30
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if r["kind"] == "train"]
    assert losses[-1] < 0.5 * losses[0]
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["DFlashARDraftModel"]
    assert parse_drafter_config(raw).autoregressive
    drafter = DFlashDrafter.from_pretrained(out)
    assert drafter.autoregressive and drafter.block_size == 4
