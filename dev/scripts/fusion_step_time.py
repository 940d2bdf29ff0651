"""What input fusion costs a training step: the drafter's forward and backward for one sequence, with
KV injection and with input fusion, on the same weights, sequences and anchors.

Both drafters are the offline pair's training shape (3 layers copied from the target's top layers,
block 4, an 8,192-token draft vocabulary, up to 256 anchors); the target's features are computed
once and cached, so only the drafter's share of a step is timed. The kinds alternate sequence by
sequence, so a shared machine's load falls on both alike:

    python dev/scripts/fusion_step_time.py [--seqs 3] [--reps 2] [--threads 1] [--amp bf16]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from dflash_core.loading.default_target import resolve_target
from dflash_core.models.drafter import DFlashDrafter
from dflash_core.models.target import Target
from dflash_core.training.data import load_sequences
from dflash_core.training.drafter_init import build_drafter_config, init_from_target
from dflash_core.training.objective import DrafterTrainer, sample_anchors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="assets/data/smollm2-135m-instruct")
    p.add_argument("--seqs", type=int, default=3, help="sequences of shard 132 on, up to 512 tokens")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--amp", choices=["none", "bf16"], default="none")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target = Target.from_pretrained(resolve_target("default:smollm2"))
    target.model.requires_grad_(False)
    seqs = load_sequences(args.data, 512, shards=[slice(132, None)])[: args.seqs]
    config = build_drafter_config(target, 3, 4, 16, [1, 14, 27])
    config.draft_vocab_size = 8192  # which ids it holds does not change the cost
    kv = DFlashDrafter(config)
    init_from_target(kv, target, [ids for ids, _, _ in seqs])
    fusion_config = copy.deepcopy(config)
    fusion_config.context_fusion = "input"
    fusion = DFlashDrafter(fusion_config)
    fusion.load_state_dict(kv.state_dict())
    amp = torch.bfloat16 if args.amp == "bf16" else None
    trainers = {kind: DrafterTrainer(target, drafter, 4, 2.0, amp, feature_cache_bytes=2**30)
                for kind, drafter in (("kv", kv), ("input", fusion))}
    gen = torch.Generator().manual_seed(0)
    anchors = [sample_anchors(len(ids), plen, 256, gen) for ids, plen, _ in seqs]

    def step(trainer, i):
        ids, _, key = seqs[i]
        t0 = time.perf_counter()
        trainer.forward(ids, anchors[i], key=key, dense=True).loss.backward()
        return time.perf_counter() - t0

    for trainer in trainers.values():  # caches the target's features; warms up
        for i in range(len(seqs)):
            step(trainer, i)
    times = {kind: [[] for _ in seqs] for kind in trainers}
    for _ in range(args.reps):
        for i in range(len(seqs)):
            for kind, trainer in trainers.items():
                times[kind][i].append(step(trainer, i))
    print(f"threads {args.threads}, autocast {amp}")
    for i, (ids, plen, _) in enumerate(seqs):
        kv_s, input_s = (statistics.median(times[kind][i]) for kind in trainers)
        print(f"sequence of {len(ids)} tokens, {len(anchors[i])} anchors: kv {kv_s * 1000:.0f} ms, "
              f"input {input_s * 1000:.0f} ms ({input_s / kv_s:.2f}x)")


if __name__ == "__main__":
    main()
