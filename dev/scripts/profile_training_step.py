"""One training sequence's forward and backward for the shipped DFlash drafter and its DFlash2
conversion (`train.py --dflash2` defaults), interleaved, best of N, then a `torch.profiler` table of
each: what DFlash2 adds to a training step on a CPU. The target's features are computed once and
kept, so its forward is not timed.

    PYTHONPATH=. python dev/scripts/profile_training_step.py --reps 3 --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from dflash_core import DFlashDrafter, Target
from dflash_core.loading.default_target import resolve_target
from dflash_core.training.data import heldout, load_sequences
from dflash_core.training.drafter_init import to_dflash2
from dflash_core.training.objective import DrafterTrainer, sample_anchors

DRAFTER = "assets/drafters/smollm2-135m-instruct-dflash"
DATA = "assets/data/smollm2-135m-instruct"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--anchors", type=int, default=256)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = Target.from_pretrained(resolve_target("default:smollm2"))
    target.model.requires_grad_(False)
    # The first training sequence of the shipped drafter's data (shards 132-, 3% held out).
    ids, plen, key = next(s for s in load_sequences(DATA, 512, shards=[slice(132, None)]) if not heldout(s[2], 0.03))
    anchors = sample_anchors(len(ids), plen, args.anchors, torch.Generator().manual_seed(0))
    print(f"sequence of {len(ids)} tokens, {anchors.numel()} anchors")
    trainers = {}
    for name in ("dflash", "dflash2"):
        drafter = DFlashDrafter.from_pretrained(DRAFTER, dtype=torch.float32)
        if name == "dflash2":
            drafter = to_dflash2(drafter, conv_kernel_size=2, conv_group_size=16, selector_rank=32, selector_top_k=16)
        trainer = DrafterTrainer(target, drafter.train(), 4, 2.0, None, 1 << 30, soft_top_k=8, soft_weight=0.5)
        trainer.target_features(ids, key)
        trainers[name] = trainer
    best = dict.fromkeys(trainers, float("inf"))
    for _ in range(args.reps):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            trainer.forward(ids, anchors, key=key).loss.backward()
            best[name] = min(best[name], time.perf_counter() - start)
            trainer.core.zero_grad()
    print("best forward + backward, s:", {name: round(s, 2) for name, s in best.items()})
    for name, trainer in trainers.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.forward(ids, anchors, key=key).loss.backward()
        print(name, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()
