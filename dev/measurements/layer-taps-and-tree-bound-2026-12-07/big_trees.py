"""Greedy trees of growing budgets against plain decoding on a batch-invariant bf16 target: the
tests' flattened 6-layer target with SmolLM2-135M's layer shapes (`tests/test_batch_invariance.py`,
`compiled_pair`), its random drafter at block 4, 8 random prompts of 12 tokens, 40 new tokens,
eager and compiled steps. `generate`'s bound on such targets (trees of at most MAX_BLOCK - 1
drafts) is lifted here, to show what it guards against.

    python dev/measurements/layer-taps-and-tree-bound-2026-12-07/big_trees.py 8,16,24,32
"""
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, "tests")
from tiny import build_drafter, build_target  # noqa: E402

from dflash_core import DFlashDrafter, Target, decoding, run  # noqa: E402

torch.set_num_threads(1)
root = Path(tempfile.mkdtemp())
target_dir = build_target(root / "target", num_layers=6, hidden=576, intermediate=1536, heads=9, kv_heads=3)
compiled = Target.from_pretrained(target_dir, dtype=torch.bfloat16, static_cache=True, compiled=True)
with torch.no_grad():
    compiled.model.lm_head.weight.div_(8)
drafter = DFlashDrafter.from_pretrained(build_drafter(root / "drafter", target_dir), dtype=torch.bfloat16)
eager = Target(compiled.model, compiled.tokenizer)
with mock.patch.object(decoding, "is_batch_invariant", lambda model: False):  # only the bound's check reads it
    for name, target in (("eager", eager), ("compiled", compiled)):
        for budget in map(int, sys.argv[1].split(",")):
            same = 0
            for seed in range(8):
                prompt = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
                plain = run(target, prompt, max_new_tokens=40).output_ids
                same += run(target, prompt, drafter, max_new_tokens=40, block_size=4, tree_budget=budget).output_ids == plain
            print(f"{name} tree of {budget} drafts: identical to plain decoding on {same} of 8 prompts", flush=True)
