"""Tau as greedy decoding meets it, per prompt set and category, in seconds per drafter.

The target's greedy responses (float32, up to 128 new tokens, as in the benchmark) to the natural set
and the generated split are made once, batched, and kept in `runs/`; each drafter is then scored by one
forward over every response, walking it as greedy decoding would (`val_tau_decode` of the training
evaluation). It tracks the benchmark's tau closely and is how drafters are compared while training;
the benchmark (`python -m dflash_core.bench`) stays the measurement:

    python -m dflash_core.training.evaluate assets/drafters/smollm2-135m-instruct-dflash runs/drafter-x
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..bench.run import PROMPT_SETS, load_prompts
from ..loading.cli import add_target_arg, add_threads_arg, apply_args
from ..loading.default_target import resolve_target
from ..loading.prompting import encode_prompt
from ..models.drafter import DFlashDrafter
from ..models.target import Target
from .datagen import _eos_pad, generate_batch
from .objective import DrafterTrainer, default_gamma, evaluate
from .train import choose_amp


def responses(target: Target, name: str, num: int, max_new_tokens: int, cache_dir: Path) -> list[dict]:
    """[{category, ids, plen}] for set `name`: prompt + the target's greedy response, cached as JSON."""
    path = cache_dir / f"responses-{name}-{num}-{max_new_tokens}.json"
    if path.is_file():
        return json.loads(path.read_text())
    records = load_prompts(str(PROMPT_SETS[name]), num)
    eos, pad = _eos_pad(target.tokenizer)
    encoded = [encode_prompt(target.tokenizer, r["prompt"]) for r in records]
    out = []
    for i in range(0, len(encoded), 8):
        for r, ids, (resp, _) in zip(records[i:i + 8], encoded[i:i + 8],
                                     generate_batch(target.model, encoded[i:i + 8], max_new_tokens, eos, pad)):
            out.append({"category": r.get("category", "-"), "ids": ids + resp, "plen": len(ids)})
    cache_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m dflash_core.training.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("drafters", nargs="+", metavar="DRAFTER")
    add_target_arg(p)
    p.add_argument("--sets", default="natural,generated")
    p.add_argument("--num-prompts", type=int, default=58)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=None, help="default: each drafter's trained size")
    p.add_argument("--cache-dir", type=Path, default=Path("runs"))
    add_threads_arg(p)
    args = apply_args(p, p.parse_args(argv))
    target = Target.from_pretrained(resolve_target(args.target))
    data = {name: responses(target, name, args.num_prompts, args.max_new_tokens, args.cache_dir)
            for name in args.sets.split(",")}
    amp = choose_amp("auto", torch.device("cpu"))  # as training autocasts (`train --amp auto`)
    for path in args.drafters:
        drafter = DFlashDrafter.from_pretrained(path, dtype=torch.float32)
        B = args.block_size or drafter.block_size
        trainer = DrafterTrainer(target, drafter, B, default_gamma(B), amp_dtype=amp)
        result = {"drafter": path, "block_size": B}
        for name, recs in data.items():
            groups = {"all": recs}
            for r in recs:
                groups.setdefault(r["category"], []).append(r)
            result[name] = {
                group: round(evaluate(trainer, [(torch.tensor(r["ids"]), r["plen"], None) for r in rs],
                                      anchors_per_seq=1 << 20)["val_tau_decode"], 3)
                for group, rs in groups.items()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
