"""A DFlash2 drafter made from a DFlash one without training, to show the DFlash2 lane before a
trained one exists: the DFlash layers as they are, each sublayer's block convolution at identity
(a fresh `BlockConv`: tap 0 is 1, no correction), and a small random path selector whose pairwise
scores, `--scale` times the default initialization's, now and then walk off the LM head's first
candidate. Its drafts are the DFlash drafter's, proposed from the whole vocabulary (DFlash2 has no
draft vocabulary), except where the random selector turns the walk.

    PYTHONPATH=. .venv/bin/python dev/scripts/random_dflash2_from_dflash.py \
        --from assets/drafters/smollm2-135m-instruct-dflash --out runs/random-dflash2

Not a drafter to ship or measure: the DFlash2 lane's screenshot until a trained one lands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dflash_core import DFlashDrafter
from dflash_core.models.config import parse_drafter_config


def convert(source: Path, out: Path, rank: int, top_k: int, taps: int, group: int, scale: float, seed: int) -> Path:
    raw = json.loads((source / "config.json").read_text())
    raw["architectures"] = ["DFlash2DraftModel"]
    raw.pop("draft_vocab_size", None)
    raw["dflash_config"].update(conv_kernel_size=taps, conv_group_size=group, selector_rank=rank, selector_top_k=top_k)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(parse_drafter_config(raw))
    state = DFlashDrafter.from_pretrained(source).state_dict()
    own = drafter.state_dict()
    shared = {k: v for k, v in state.items() if k in own}
    missing = sorted(k for k in own if k not in shared and "conv" not in k and "candidate_selector" not in k)
    if missing:
        raise SystemExit(f"{source} lacks {missing}")
    drafter.load_state_dict(shared, strict=False)
    with torch.no_grad():
        selector = drafter.candidate_selector
        selector.predecessor_codebook.mul_(scale)
        selector.successor_codebook.mul_(scale)
    drafter.save_pretrained(out, dtype=torch.bfloat16)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", type=Path, required=True, help="a DFlash drafter folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rank", type=int, default=16, help="the selector's codebook rank")
    p.add_argument("--top-k", type=int, default=8, help="candidates per slot")
    p.add_argument("--taps", type=int, default=3, help="the block convolution's taps")
    p.add_argument("--group-size", type=int, default=64, help="channels per convolution group")
    p.add_argument("--scale", type=float, default=1.0, help="the pairwise scores, against the default initialization's")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(convert(args.source, args.out, args.rank, args.top_k, args.taps, args.group_size, args.scale, args.seed))


if __name__ == "__main__":
    main()
