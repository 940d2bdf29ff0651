"""Compiled bf16 steps of the offline default target (batch-invariant, library GEMMs): does compiled
DFlash decode exactly what compiled plain decoding does, prompt by prompt, and where do both part
from eager plain decoding? Prints one line a prompt: the first token where each pair of runs
differs (None: identical). Run from the repository root:

    python dev/measurements/compiled-bf16-2026-12-07/compiled_vs_plain.py [max_new_tokens]
"""

import sys

import torch

from dflash_core import Target, compile_draft, compile_verify, load_pair, run, size_caches
from dflash_core.loading import DEFAULT_TARGET

PROMPTS = [
    "Give me three tips for learning to cook.", "What is 17 times 23?", "Summarize the plot of Hamlet.",
    "Why is the sky blue?", "Translate 'good morning' into French and Spanish.", "Write a limerick about a cat.",
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in two sentences.",
    "List three prime numbers and say why they are prime.", "def fib(n):", "Tell me a story about a robot.",
]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main(new_tokens: int) -> None:
    torch.set_num_threads(1)
    pair = load_pair(DEFAULT_TARGET, "assets/drafters/smollm2-135m-instruct-dflash", dtype="bfloat16")
    model, tokenizer = pair.target.model, pair.target.tokenizer
    drafter = pair.drafter.with_own_cache()
    plain, dflash = (Target(model, tokenizer, static_cache=True, compiled=True) for _ in range(2))
    size_caches(plain, None, 512)
    size_caches(dflash, drafter, 512)
    compile_verify(plain, 1)
    compile_draft(dflash, drafter, 4)
    same = 0
    for prompt in PROMPTS:
        ids = pair.encode(prompt)
        eager = run(pair.target, ids, None, max_new_tokens=new_tokens).output_ids
        compiled_plain = run(plain, ids, None, max_new_tokens=new_tokens).output_ids
        compiled_dflash = run(dflash, ids, drafter, max_new_tokens=new_tokens, block_size=4).output_ids
        part = first_difference(compiled_plain, compiled_dflash)
        same += part is None
        print(f"{prompt[:40]!r:44} compiled DFlash vs compiled plain: {part}; "
              f"compiled plain vs eager plain: {first_difference(eager, compiled_plain)}", flush=True)
    print(f"compiled DFlash identical to compiled plain decoding: {same}/{len(PROMPTS)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 128)
