"""How much of a block target-labelled text labels: the share of anchors whose slot k has a label.

Slot 1 always has one (the target's greedy token after the anchor); slot k > 1 only while the text
follows the target's greedy path (`objective.greedy_path_labels`), so the shares say how many
labels per forward such text gives compared with the target's own answers (1 at every slot):

    python dev/scripts/text_label_coverage.py runs/text-data [--seqs 100] [--block-size 4]
"""

from __future__ import annotations

import argparse

import torch

from dflash_core.loading.default_target import resolve_target
from dflash_core.models.target import Target
from dflash_core.training.data import load_sequences
from dflash_core.training.objective import greedy_path_labels, sample_anchors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--target", default="default:smollm2")
    p.add_argument("--seqs", type=int, default=100, help="sequences, evenly spaced over the data")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = Target.from_pretrained(resolve_target(args.target))
    seqs = load_sequences(args.data, 512)
    seqs = seqs[:: max(1, len(seqs) // args.seqs)][: args.seqs]
    totals: dict[str, list] = {}
    with torch.no_grad():
        for ids, plen, key in seqs:
            greedy = target.model(input_ids=ids[None]).logits[0].argmax(-1)
            anchors = sample_anchors(len(ids), plen, len(ids), torch.Generator())
            _, valid = greedy_path_labels(ids, greedy, anchors, args.block_size)
            for name in ("all", key.split(":")[0]):
                t = totals.setdefault(name, [torch.zeros(args.block_size - 1), 0])
                t[0] += valid.float().sum(0)
                t[1] += len(anchors)
    for name, (labelled, anchors) in totals.items():
        print(f"{name:<18} {anchors:>6} anchors, labelled share per slot: "
              + " ".join(f"{float(x):.3f}" for x in labelled / anchors))


if __name__ == "__main__":
    main()
