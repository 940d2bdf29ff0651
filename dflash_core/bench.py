"""Benchmark: DFlash against plain decoding and the peers a user would try, side by side in one run.

For every prompt, in turn: plain greedy decoding, DFlash at each block size, transformers'
prompt-lookup decoding, and transformers' plain `generate` (a sanity check that our plain path is
not slow). All share one target with one dtype, so speedups compare like with like. Prints a table
and, as the last line of stdout, one JSON object with the headline figures.

    python -m dflash_core.bench --target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash \\
        --dtype float32 --max-new-tokens 128 --num-prompts 20

`--cycle-times` instead times the parts of one cycle (draft, verify, bookkeeping) of this pair
against one plain step, and `--synthetic SHAPE` does so for random-weight models in the released
Qwen3 shapes (see `bench_cycle.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from .batch_invariant import describe, is_batch_invariant, rows_alone_layers
from .chat_template import THINKING_CHOICES, describe_template, template_args
from .cpu_linear import single_row_library
from .decoding import run
from .lossless import compare as lossless_check
from .default_target import DEFAULT_TARGET
from .pair import DTYPES, load_pair
from .prompting import encode_prompt

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "heldout.jsonl"
BUILTIN_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost?",
    "Tell me a short story about a robot who learns to paint.",
]


def load_prompts(path: str | None, limit: int) -> list[dict]:
    """Up to `limit` records with a 'prompt' and, where the file gives one, a 'category'."""
    if path is None and not DEFAULT_PROMPTS.is_file():
        return [{"prompt": p} for p in BUILTIN_PROMPTS[:limit]]
    lines = Path(path or DEFAULT_PROMPTS).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    # Spread the selection over the whole file so every category is represented.
    step = max(1, len(records) // limit)
    return records[::step][:limit]


def timed_hf_generate(model, prompt_ids, max_new_tokens, eos_id, **kwargs):
    """Wall time and new ids of transformers' own `generate` (greedy)."""
    ids = torch.tensor([prompt_ids], device=model.device)
    start = time.perf_counter()
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=eos_id, pad_token_id=eos_id, **kwargs,
    )
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out[0, len(prompt_ids) :].tolist()


def benchmark(args) -> dict:
    pair = load_pair(
        args.target, args.drafter, device=args.device, dtype=args.dtype, drafter_dtype=args.drafter_dtype,
        batch_invariant={"on": True, "off": False, "auto": None}[args.batch_invariant],
    )
    target, drafter, tokenizer = pair.target, pair.drafter, pair.tokenizer
    block_sizes = args.block_sizes or [drafter.block_size]
    eos = tokenizer.eos_token_id if tokenizer is not None else None
    stop_ids = [eos] if eos is not None else []
    prompts = load_prompts(args.prompts, args.num_prompts)
    chat_args = template_args(tokenizer, args.thinking) if tokenizer is not None else {}
    encoded = [encode_prompt(tokenizer, p["prompt"], template_args=chat_args) for p in prompts]

    def decode(prompt_ids, block_size=None, use_drafter=True):
        return run(
            target, prompt_ids, drafter if use_drafter else None,
            max_new_tokens=args.max_new_tokens, block_size=block_size, stop_ids=stop_ids,
        )

    decode(encoded[0][:8], use_drafter=False)  # warm up kernels and allocator outside the clock
    decode(encoded[0][:8], block_sizes[0])

    rows = {"plain": [], "hf_generate": [], "prompt_lookup": [], **{f"dflash_b{b}": [] for b in block_sizes}}
    summaries = {b: [] for b in block_sizes}
    identical = {b: 0 for b in block_sizes}
    verdicts = {b: [] for b in block_sizes}
    for i, prompt_ids in enumerate(encoded):
        plain = decode(prompt_ids, use_drafter=False)
        rows["plain"].append((plain.total_s, len(plain.output_ids)))
        for b in block_sizes:
            s = decode(prompt_ids, b)
            summaries[b].append(s)
            rows[f"dflash_b{b}"].append((s.total_s, len(s.output_ids)))
            identical[b] += s.output_ids == plain.output_ids
            verdicts[b].append(lossless_check(target, prompt_ids, s.output_ids, plain.output_ids))
        for name, kwargs in () if args.skip_peers else (("hf_generate", {}), ("prompt_lookup", {"prompt_lookup_num_tokens": 10})):
            seconds, ids = timed_hf_generate(target.model, prompt_ids, args.max_new_tokens, eos, **kwargs)
            rows[name].append((seconds, len(ids)))
        print(f"  prompt {i + 1}/{len(encoded)}: tau " + ", ".join(
            f"b{b}={summaries[b][-1].tau:.2f}" for b in block_sizes), file=sys.stderr, flush=True)

    def tok_s(name):
        seconds = sum(t for t, _ in rows[name])
        return sum(n for _, n in rows[name]) / seconds if seconds else None

    plain_tok_s = tok_s("plain")
    per_block = {}
    for b in block_sizes:
        lengths = [length for s in summaries[b] for length in s.acceptance_lengths]
        cycles = sum(len(s.blocks) for s in summaries[b])
        per_block[b] = {
            "tau": statistics.fmean(lengths),
            "tok_s": tok_s(f"dflash_b{b}"),
            "speedup": tok_s(f"dflash_b{b}") / plain_tok_s,
            "identical": identical[b] / len(encoded),
            # identical / near_tie / diverged counts, and every difference (lossless.py)
            "lossless": {kind: sum(v.kind == kind for v in verdicts[b]) for kind in ("identical", "near_tie", "diverged")},
            "differences": [v.to_dict() for v in verdicts[b] if v.kind != "identical"],
            "per_position_acceptance": [
                sum(blk.accepted >= k for s in summaries[b] for blk in s.blocks) / cycles for k in range(1, b)
            ],
            "draft_ms_per_cycle": 1000 * sum(s.draft_s for s in summaries[b]) / cycles,
            "verify_ms_per_cycle": 1000 * sum(s.verify_s for s in summaries[b]) / cycles,
        }
    head = per_block[block_sizes[0]]
    # Where the drafter is weak (code? stories?) shows per category, at the first block size.
    per_category: dict[str, list[int]] = {}
    for p, s in zip(prompts, summaries[block_sizes[0]]):
        if "category" in p:
            per_category.setdefault(p["category"], []).extend(s.acceptance_lengths)
    return {
        "target": str(args.target),
        "drafter": str(args.drafter),
        "device": args.device,
        "dtype": args.dtype,
        "drafter_dtype": str(drafter.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        # Which library ran the target's one-row (plain decoding) matmuls; chosen per machine.
        "cpu_single_row": single_row_library(target.model),
        # Blocks verified bitwise as one-token steps (identical is then 1.0 by construction).
        "batch_invariant": is_batch_invariant(target.model),
        "rows_alone_linears": len(rows_alone_layers(target.model)),  # exact but slower on this CPU
        "numerics": describe(target.model),
        "chat_template": describe_template(tokenizer, chat_args),
        "num_prompts": len(encoded),
        "max_new_tokens": args.max_new_tokens,
        "block_size": block_sizes[0],
        "tau": head["tau"],
        "speedup": head["speedup"],
        "identical": head["identical"],
        "lossless": head["lossless"],
        "dflash_tok_s": head["tok_s"],
        "plain_tok_s": plain_tok_s,
        "per_position_acceptance": head["per_position_acceptance"],
        "speedup_prompt_lookup": None if args.skip_peers else tok_s("prompt_lookup") / plain_tok_s,
        "speedup_hf_generate": None if args.skip_peers else tok_s("hf_generate") / plain_tok_s,
        "speedup_assisted": None,  # no smaller model shares the default target's tokenizer offline
        "per_block_size": per_block,
        "tau_per_category": {c: statistics.fmean(v) for c, v in sorted(per_category.items()) if v},
    }


def cycle_times(args) -> dict:
    """`bench_cycle.time_cycle` for the loaded pair at each block size; prints one table per size."""
    from .bench_cycle import print_table as print_cycle, time_cycle

    pair = load_pair(args.target, args.drafter, device=args.device, dtype=args.dtype, drafter_dtype=args.drafter_dtype)
    result = {"target": str(args.target), "drafter": str(args.drafter), "per_block_size": {}}
    for b in args.block_sizes or [pair.drafter.block_size]:
        r = time_cycle(pair.target, pair.drafter, args.context, b, taus=(2, 3, 4, 6, 8, 12, 16))
        print_cycle({"target": result["target"], **r})
        result["per_block_size"][b] = r
    return result


def print_table(result: dict) -> None:
    plain = result["plain_tok_s"]
    print(f"\n{result['num_prompts']} prompts, {result['max_new_tokens']} new tokens, target {result['dtype']} "
          f"on {result['device']} ({result['threads']} threads"
          + (f", one-row matmuls by {result['cpu_single_row']}" if result.get("cpu_single_row") else "")
          + (f", {result['numerics']}" if result.get("numerics") else "") + ")")
    print(f"prompts through {result['chat_template']}")
    print(f"{'method':<22}{'tok/s':>9}{'speedup':>9}{'tau':>7}{'identical':>11}")
    print(f"{'plain (ours)':<22}{plain:>9.1f}{1.0:>9.2f}")
    for b, r in result["per_block_size"].items():
        print(f"{f'DFlash block {b}':<22}{r['tok_s']:>9.1f}{r['speedup']:>9.2f}{r['tau']:>7.2f}{r['identical']:>11.2f}"
              "   lossless: " + ", ".join(f"{n} {k}" for k, n in r["lossless"].items()))
        for d in r["differences"]:
            print(f"    {d['message']}")
    for name, label in (("hf_generate", "HF generate"), ("prompt_lookup", "HF prompt lookup")):
        speedup = result[f"speedup_{name}"]
        if speedup is None:
            continue
        print(f"{label:<22}{speedup * plain:>9.1f}{speedup:>9.2f}")
    print(f"{'HF assisted':<22}{'n/a: no same-tokenizer assistant available offline':>36}")
    if result["tau_per_category"]:
        print(f"tau at block {result['block_size']} by prompt category: "
              + ", ".join(f"{c} {t:.2f}" for c, t in result["tau_per_category"].items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_core.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--drafter", default="assets/drafters/smollm2-135m-instruct-dflash")
    parser.add_argument("--prompts", help="JSON lines with a 'prompt' field (default: the held-out prompts)")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32", help="the target's dtype")
    parser.add_argument("--drafter-dtype", choices=list(DTYPES), help="default: bfloat16 where the hardware runs it natively, else --dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--thinking", choices=THINKING_CHOICES,
                        help="Qwen3-style thinking in the chat template (default: off where the template has the "
                        "switch, as the released DFlash drafters were trained)")
    parser.add_argument("--batch-invariant", choices=("auto", "on", "off"), default="auto",
                        help="verify blocks bitwise as one-token steps (auto: bf16 on CPU; batch_invariant.py)")
    parser.add_argument("--skip-peers", action="store_true",
                        help="decode with plain and DFlash only (no transformers generate / prompt lookup)")
    parser.add_argument("--block-sizes", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--cycle-times", action="store_true",
                        help="time the parts of one cycle of this pair at each block size, instead of decoding prompts")
    parser.add_argument("--context", type=int, default=200, help="context length for --cycle-times")
    parser.add_argument("--synthetic", metavar="SHAPE", help="time one cycle of random-weight models (qwen3-8b, qwen3-4b, tiny)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, all cores); match the app's to compare")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.synthetic:
        from .bench_cycle import print_table as print_cycle, run_synthetic

        result = run_synthetic(args.synthetic, args.device, args.dtype)
        print_cycle(result)
    elif args.cycle_times:
        result = cycle_times(args)
    else:
        result = benchmark(args)
        print_table(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
