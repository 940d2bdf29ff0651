"""`--dataset`: the paper's table on the reference benchmark's datasets (`datasets.py`): per dataset,
tau, speedup, tok/s, the acceptance-length histogram and token identity with plain decoding.

    python -m dflash_core.bench --dataset gsm8k,math500,humaneval,mbpp,mt-bench --max-samples 16 \\
        --target Qwen/Qwen3-8B --drafter z-lab/Qwen3-8B-DFlash-b16 --device cuda --dtype bfloat16 \\
        --max-new-tokens 2048

Every user turn is decoded greedily twice with the same target, plain decoding and then DFlash at the
first block size, through the chat template with `--thinking` (on, off, or a reasoning level for
templates that take one). A multi-turn sample (MT-Bench) asks each turn after the target's own answer
to the one before: plain decoding's output, decoded without special tokens as the reference does.
Every turn counts in the figures:

- tau: mean acceptance length over all cycles (bonus token included); tau/turn: the mean over turns
  of each turn's mean, the reference's "Average Acceptance length";
- speedup: DFlash tok/s over plain tok/s, each total new tokens over total seconds (the reference
  averages each turn's time per token instead);
- histogram: the share of cycles that kept L tokens, L = 1..block size;
- identical: turns whose DFlash output equals plain decoding's, with the lossless verdicts of
  `lossless.py` (a near-tie is rounding, a divergence a bug).

The mean row averages the datasets' figures, as the paper's average column does.
"""

from __future__ import annotations

import statistics
import sys

import torch

from ..decoding import run
from ..errors import DatasetError, GenerationInputError
from ..loading.chat_template import describe_template, reasoning_args
from ..loading.prompting import encode_chat
from ..lossless import compare as lossless_check
from .datasets import load_samples, seen_in_training

VERDICTS = ("identical", "near_tie", "diverged")


def decode_sample(pair, sample, block_size: int, max_new_tokens: int, stop_ids, chat_args) -> list[tuple]:
    """(plain summary, DFlash summary, lossless verdict) for each of `sample`'s turns, in order."""
    target, tokenizer = pair.target, pair.tokenizer
    messages, out = [], []
    for text in sample.turns:
        messages.append({"role": "user", "content": text})
        ids = encode_chat(tokenizer, messages, chat_args)
        plain = run(target, ids, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        dflash = run(target, ids, pair.drafter, max_new_tokens=max_new_tokens, block_size=block_size, stop_ids=stop_ids)
        out.append((plain, dflash, lossless_check(target, ids, dflash.output_ids, plain.output_ids)))
        # The next turn follows the target's own answer, as a chat with it would.
        messages.append({"role": "assistant", "content": tokenizer.decode(plain.output_ids, skip_special_tokens=True)})
    return out


def figures(turns: list[tuple], block_size: int) -> dict:
    """A dataset's row of the table from its turns' (plain, DFlash, verdict)."""
    plain = [p for p, _, _ in turns]
    dflash = [d for _, d, _ in turns]

    def tok_s(summaries):
        return sum(len(s.output_ids) for s in summaries) / sum(s.total_s for s in summaries)

    lengths = [length for d in dflash for length in d.acceptance_lengths]
    counts = [sum(d.acceptance_histogram[k] for d in dflash) for k in range(1, block_size + 1)]
    return {
        "turns": len(turns),
        "plain_tok_s": tok_s(plain),
        "dflash_tok_s": tok_s(dflash),
        "speedup": tok_s(dflash) / tok_s(plain),
        # None where no turn ran a cycle (every answer stopped at its first token).
        "tau": statistics.fmean(lengths) if lengths else None,
        "tau_per_turn": statistics.fmean(d.tau for d in dflash if d.blocks) if lengths else None,
        # Share of cycles with acceptance length 1..B (index 0 is length 1).
        "histogram": [c / max(1, len(lengths)) for c in counts],
        "identical": sum(d.output_ids == p.output_ids for p, d, _ in turns) / len(turns),
        "lossless": {kind: sum(v.kind == kind for _, _, v in turns) for kind in VERDICTS},
        "differences": [v.to_dict() for _, _, v in turns if v.kind != "identical"],
        "new_tokens": sum(len(p.output_ids) for p in plain),
    }


def load_datasets(args) -> tuple[dict, dict]:
    """({name: (samples, source)}, {name: why not}) for `args.dataset`. A dataset that cannot be
    loaded stops the run, or with `--skip-unavailable` is named in the second dict and left out."""
    loaded, unavailable = {}, {}
    for name in args.dataset:
        try:
            loaded[name] = load_samples(name, args.max_samples, args.datasets_from)
        except DatasetError as exc:
            if not args.skip_unavailable:
                raise
            unavailable[name] = str(exc)
            print(f"  {name}: skipped: {exc}", file=sys.stderr, flush=True)
    return loaded, unavailable


def benchmark_datasets(args, pair, loaded: dict) -> dict:
    """The table on `pair` for the datasets `load_datasets` loaded."""
    tokenizer = pair.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise GenerationInputError("--dataset needs a target with a tokenizer and a chat template: the datasets' "
                                   "prompts are chat turns")
    chat_args = reasoning_args(tokenizer, args.thinking)
    block_size = args.block_sizes[0] if args.block_sizes else pair.drafter.block_size
    stop_ids = pair.stop_ids
    warm = encode_chat(tokenizer, [{"role": "user", "content": "Hi"}], chat_args)
    run(pair.target, warm, max_new_tokens=8, stop_ids=stop_ids)  # kernels and allocator, outside the clock
    run(pair.target, warm, pair.drafter, max_new_tokens=8, block_size=block_size, stop_ids=stop_ids)
    rows = {}
    for name, (samples, source) in loaded.items():
        turns = []
        for i, sample in enumerate(samples):
            done = decode_sample(pair, sample, block_size, args.max_new_tokens, stop_ids, chat_args)
            turns.extend(done)
            print(f"  {name} {i + 1}/{len(samples)} (row {sample.row}, {len(done)} turn(s)): tau "
                  + ", ".join(f"{d.tau:.2f}" for _, d, _ in done), file=sys.stderr, flush=True)
        rows[name] = {"source": source, "samples": len(samples), **figures(turns, block_size),
                      "seen_in_training": seen_in_training(name, args.drafter)}
    values = {key: [r[key] for r in rows.values() if r[key] is not None] for key in ("speedup", "tau", "tau_per_turn")}
    mean = {key: statistics.fmean(v) if v else None for key, v in values.items()}
    return {
        "target": str(args.target), "drafter": str(args.drafter), "device": args.device, "dtype": args.dtype,
        "drafter_dtype": str(pair.drafter.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
        "chat_template": describe_template(tokenizer, chat_args), "max_new_tokens": args.max_new_tokens,
        "max_samples": args.max_samples, "block_size": block_size, "temperature": 0.0,
        "datasets": rows, "mean": mean,
    }


def _tau(value, width: int) -> str:
    """`value` to two places, or "-" where there is none (a dataset that ran no cycle)."""
    return f"{value:>{width}.2f}" if value is not None else f"{'-':>{width}}"


def print_dataset_table(result: dict) -> None:
    print(f"\n{result['target']} with {result['drafter']}: block {result['block_size']}, greedy, up to "
          f"{result['max_new_tokens']} new tokens a turn, target {result['dtype']} on {result['device']} "
          f"({result['threads']} threads); prompts through {result['chat_template']}")
    print(f"{'dataset':<12}{'samples':>8}{'turns':>6}{'plain tok/s':>12}{'DFlash tok/s':>13}{'speedup':>9}"
          f"{'tau':>7}{'tau/turn':>9}{'identical':>10}  source")
    for name, r in result["datasets"].items():
        label = name + ("*" if r["seen_in_training"] else "")
        print(f"{label:<12}{r['samples']:>8}{r['turns']:>6}{r['plain_tok_s']:>12.1f}{r['dflash_tok_s']:>13.1f}"
              f"{r['speedup']:>9.2f}{_tau(r['tau'], 7)}{_tau(r['tau_per_turn'], 9)}{r['identical']:>10.2f}  {r['source']}")
        for d in r["differences"]:
            print(f"    {d['message']}")
    m = result["mean"]
    print(f"{'mean':<12}{'':>39}{_tau(m['speedup'], 9)}{_tau(m['tau'], 7)}{_tau(m['tau_per_turn'], 9)}")
    print(f"acceptance length histogram (share of cycles that kept 1..{result['block_size']} tokens):")
    for name, r in result["datasets"].items():
        print(f"  {name:<10}" + " ".join(f"{100 * x:4.1f}%" for x in r["histogram"]))
    for name, r in result["datasets"].items():
        if r["seen_in_training"]:
            print(f"* {name}: seen in training: {r['seen_in_training']}")
    for name, why in result.get("unavailable", {}).items():
        print(f"{name}: not run: {why}")
