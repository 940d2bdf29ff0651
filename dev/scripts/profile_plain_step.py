"""Where a plain decoding step goes: wall time per token of this engine's plain decoding, the same
model in a bare transformers loop, and `torch.profiler`'s table of the engine's run (dev/LOG.md,
2026-12-06).

    python dev/scripts/profile_plain_step.py --threads 1 --tokens 64 [--compile]

--compile profiles the compiled steps (`Target(..., compiled=True)`) on the same weights instead.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import BUILTIN_PROMPTS
from dflash_core.loading.prompting import encode_prompt


def bare_loop_ms(model, ids: list[int], tokens: int) -> float:
    """ms per token of greedy steps straight through the transformers model, with no engine code."""
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        token = model(torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1).logits.argmax(-1)
        start = time.perf_counter()
        for _ in range(tokens):
            token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        return 1000 * (time.perf_counter() - start) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rows", type=int, default=22, help="rows of the profiler's table")
    parser.add_argument("--compile", action="store_true", help="the compiled steps (compiled once, before the clock)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.target, None, dtype="float32")
    target = pair.target
    if args.compile:
        target = Target(target.model, pair.tokenizer, static_cache=True, compiled=True)
    ids = encode_prompt(pair.tokenizer, BUILTIN_PROMPTS[-1])
    run(target, ids, max_new_tokens=16)  # warm-up
    start = time.perf_counter()
    run(target, ids, max_new_tokens=args.tokens)
    print(f"engine plain: {1000 * (time.perf_counter() - start) / args.tokens:.1f} ms per token")
    print(f"bare transformers loop, same model: {bare_loop_ms(target.model, ids, args.tokens):.1f} ms per token")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(target, ids, max_new_tokens=args.tokens)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
