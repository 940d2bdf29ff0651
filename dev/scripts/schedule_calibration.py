"""Is the drafter's probability for its draft a calibrated chance that the target accepts it?

The block schedule (dflash_core/schedule.py) takes the drafter's probability c_i for draft i as the
chance that the target keeps it once every draft before it was kept. This decodes prompts of both
benchmark sets greedily at the drafter's full block, explained, and bins every slot the target
reached (each accepted slot and the first rejected one) by slot and by c_i: where the hit rate in
each bin is close to its mean c_i, the raw probability needs no calibration.

    PYTHONPATH=. python dev/scripts/schedule_calibration.py assets/drafters/smollm2-135m-instruct-dflash-b16 \
        --num-prompts 6 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import collections

import torch

from dflash_core.bench.run import select_prompts
from dflash_core.decoding import run
from dflash_core.loading.chat_template import template_args
from dflash_core.loading.pair import load_pair
from dflash_core.loading.prompting import encode_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafter")
    parser.add_argument("--target", default="default:smollm2")
    parser.add_argument("--num-prompts", type=int, default=6, help="per prompt set")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.drafter, dtype="float32")
    tokenizer = pair.tokenizer
    bins = collections.defaultdict(lambda: [0, 0, 0.0])  # (slot, bin) -> reached, accepted, sum of c
    for p in select_prompts(None, "both", args.num_prompts):
        ids = encode_prompt(tokenizer, p["prompt"], template_args=template_args(tokenizer, None))
        s = run(pair.target, ids, pair.drafter, max_new_tokens=args.max_new_tokens,
                stop_ids=[tokenizer.eos_token_id], explain=1)
        for block in s.blocks:
            confidence = [row[0][1] for row in block.explain.draft_topk]  # greedy drafts: the mode's probability
            for j, c in enumerate(confidence[: block.accepted + 1]):
                cell = bins[(min(j + 1, 4), min(int(c * 5), 4))]
                cell[0] += 1
                cell[1] += j < block.accepted
                cell[2] += c
    print("| slot | drafter's probability | slots reached | mean probability | accepted |")
    print("| --- | --- | --- | --- | --- |")
    for (slot, b), (n, hits, total) in sorted(bins.items()):
        print(f"| {slot}{'+' if slot == 4 else ''} | {b / 5:.1f}-{(b + 1) / 5:.1f} | {n} | {total / n:.2f} | {hits / n:.2f} |")


if __name__ == "__main__":
    main()
