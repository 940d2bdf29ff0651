"""Where does a drafter miss? Its teacher-forced hit rate per block slot, binned by how sure the
target itself was of the token it had to guess.

Each slot's label is a greedy target token; the target chose it with top-1 probability p. Where p
is low the target's choice is a near-tie that only its own full forward settles, so a few-layer
drafter can hardly do better than guess; where p is high, a miss is the drafter's to fix. The bins
show how much of the lost acceptance lies in each. Runs on held-out sequences of the training data
(the same hash split as `train --heldout-frac`), every anchor, like the training evaluation:

    python dev/scripts/acceptance_by_confidence.py --drafter assets/drafters/smollm2-135m-instruct-dflash \
        --shards 127:,84:127:6 [--seqs 48]
"""

from __future__ import annotations

import argparse

import torch

from dflash_core.loading.default_target import resolve_target
from dflash_core.models.drafter import DFlashDrafter
from dflash_core.models.target import Target
from dflash_core.training.data import heldout, load_sequences, shard_range
from dflash_core.training.objective import DrafterTrainer, acceptance_lengths, default_gamma, sample_anchors

BINS = (0.0, 0.5, 0.8, 0.95, 1.01)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default:smollm2")
    p.add_argument("--drafter", required=True)
    p.add_argument("--data", default="assets/data/smollm2-135m-instruct")
    p.add_argument("--shards", default=None)
    p.add_argument("--heldout-frac", type=float, default=0.03)
    p.add_argument("--seqs", type=int, default=48)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    target = Target.from_pretrained(resolve_target(args.target))
    drafter = DFlashDrafter.from_pretrained(args.drafter, dtype=torch.float32)
    shards = shard_range(args.shards) if args.shards else None
    held = [s for s in load_sequences(args.data, 512, shards=shards) if heldout(s[2], args.heldout_frac)]
    step = max(1, len(held) // args.seqs)
    seqs = held[::step][: args.seqs]
    B = drafter.block_size
    # Top-1 soft labels make the trainer keep the target's own probability of every greedy token.
    trainer = DrafterTrainer(target, drafter, B, default_gamma(B), amp_dtype=torch.bfloat16,
                             feature_cache_bytes=1 << 32, soft_top_k=1, soft_weight=1e-6)

    hits, confidence, lengths = [], [], []
    with torch.no_grad():
        for ids, plen, key in seqs:
            anchors = sample_anchors(len(ids), plen, len(ids), torch.Generator())
            if anchors.numel() == 0:
                continue
            _, (_, top_p) = trainer.target_features(ids, key)
            out = trainer.forward(ids, anchors, key=key)
            hit = (out.logits.argmax(-1) == out.labels) & out.valid
            # Slot k's label is the token at anchor+k, which the target chose at anchor+k-1.
            src = (anchors[:, None] + torch.arange(B - 1)).clamp(max=len(ids) - 1)
            conf = top_p[src, 0].float().masked_fill(~out.valid, -1.0)  # -1: no label here
            hits.append(hit.cpu())
            confidence.append(conf.cpu())
            lengths.append(acceptance_lengths(out.logits, out.labels, out.valid).cpu())
    hit, conf, length = torch.cat(hits), torch.cat(confidence), torch.cat(lengths)

    print(f"{len(seqs)} held-out sequences, {hit.shape[0]} anchors, block {B}: teacher-forced tau {length.float().mean():.3f}")
    print("target p(top-1) | share of slot-1 labels | slot-1 hit rate | share of slot-1 misses")
    slot1, conf1 = hit[:, 0], conf[:, 0]
    misses = int((~slot1 & (conf1 >= 0)).sum())
    for lo, hi in zip(BINS, BINS[1:]):
        inside = (conf1 >= lo) & (conf1 < hi)
        n = int(inside.sum())
        if n:
            print(f"{lo:.2f}-{min(hi, 1):.2f} | {n / int((conf1 >= 0).sum()):.1%} | {float(slot1[inside].float().mean()):.1%} | "
                  f"{int((~slot1 & inside).sum()) / max(misses, 1):.1%}")
    # Slot k given slots 1..k-1 accepted: the conditional rates that multiply into tau.
    for k in range(1, B - 1):
        reached = hit[:, :k].all(1) & (conf[:, k] >= 0)
        sure = reached & (conf[:, k] >= 0.8)
        print(f"slot {k + 1} after {k} accepted: {float(hit[reached, k].float().mean()):.1%}; "
              f"where the target had p >= 0.8 ({float(sure.sum() / reached.sum()):.0%} of them): "
              f"{float(hit[sure, k].float().mean()):.1%}")


if __name__ == "__main__":
    main()
