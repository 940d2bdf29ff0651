"""How much of the target's answers a drafter's draft vocabulary can propose, and a copy of the drafter
with a larger one.

A token outside the draft vocabulary can never be drafted, so its share of the target's responses
caps slot-1 acceptance. The vocabulary picks rows of the target's own (frozen) LM head, so a larger
one needs no retraining: `--extend N` writes a copy whose vocabulary is the old one followed by the
next most frequent response tokens of the training data, to be scored with `python -m dflash_core.training.evaluate`.

    python -m dflash_core.training.evaluate DRAFTER       # makes the cached responses it reads
    python dev/scripts/draft_vocab.py DRAFTER
    python dev/scripts/draft_vocab.py DRAFTER --extend 16384 --out runs/drafter-dv16k
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import defaultdict
from pathlib import Path

import torch

from dflash_core import DFlashDrafter, Target
from dflash_core.loading.pair import fetch_target
from dflash_core.training.data import frequent_tokens, load_sequences


def coverage(vocab: set[int], cache_dir: Path) -> dict:
    """{set: {category: share of response tokens outside `vocab`}} over the cached responses of training.evaluate."""
    out = {}
    for path in sorted(cache_dir.glob("responses-*.json")):
        counts = defaultdict(lambda: [0, 0])  # category -> [tokens, outside]
        for r in json.loads(path.read_text()):
            for t in r["ids"][r["plen"]:]:
                for key in ("all", r["category"]):
                    counts[key][0] += 1
                    counts[key][1] += t not in vocab
        out[path.stem.split("-")[1]] = {k: round(outside / n, 4) for k, (n, outside) in counts.items()}
    return out


def extend(drafter_dir: Path, out: Path, size: int, data: list[str], target: str) -> None:
    """Copy `drafter_dir` to `out` with its draft vocabulary grown to `size` by response-token frequency."""
    dtype = getattr(torch, json.loads((drafter_dir / "config.json").read_text()).get("dtype", "float32"))
    drafter = DFlashDrafter.from_pretrained(drafter_dir, dtype=dtype)  # the file's dtype: weights copied exactly
    old = drafter.draft_vocab.tolist()
    head = Target.from_pretrained(fetch_target(target)).head
    seqs = [s for d in data for s in load_sequences(d, max_len=512)]
    have = set(old)
    vocab_size = drafter.config.vocab_size
    extra = [t for t in frequent_tokens(seqs, vocab_size, vocab_size).tolist() if t not in have]
    state = drafter.state_dict()
    state["draft_vocab"] = torch.tensor(old + extra[: size - len(old)])
    drafter.config.draft_vocab_size = len(state["draft_vocab"])
    grown = DFlashDrafter(drafter.config)
    grown.load_state_dict(state)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(drafter_dir, out)  # the card and training logs go along
    grown.save_pretrained(out, dtype=dtype, lm_head=head)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drafter", type=Path)
    p.add_argument("--cache-dir", type=Path, default=Path("runs"), help="where training.evaluate keeps its responses")
    p.add_argument("--extend", type=int, metavar="N", help="write a copy with an N-token draft vocabulary")
    p.add_argument("--out", type=Path, help="with --extend: the copy's directory")
    p.add_argument("--target", default="default:smollm2", help="with --extend: the target whose LM head rows the copy carries")
    p.add_argument("--data", nargs="+", default=["assets/data/smollm2-135m-instruct"],
                   help="datagen or text_data shard directories whose response tokens rank the new ids")
    args = p.parse_args()
    if args.extend:
        if args.out is None:
            p.error("--extend needs --out")
        extend(args.drafter, args.out, args.extend, args.data, args.target)
        print(f"wrote {args.out} with a {args.extend}-token draft vocabulary")
    else:
        vocab = set(DFlashDrafter.from_pretrained(args.drafter).draft_vocab.tolist())
        print(json.dumps({"drafter": str(args.drafter), "draft_vocab": len(vocab),
                          "outside": coverage(vocab, args.cache_dir)}))


if __name__ == "__main__":
    main()
