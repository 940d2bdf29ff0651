"""`--methods`: plain decoding, DFlash, DFlash2, input fusion, the autoregressive drafter and prompt
lookup side by side.

Every method decodes every prompt in the same process, with the same target, dtype, threads and
block size; on each prompt the methods run one after another, the order rotated from prompt to
prompt so that no method always runs first. Per method: tau, the share of cycles whose draft slot k
was accepted, drafter passes, draft and verify milliseconds per cycle, tok/s, speedup over plain,
and whether each output equals plain decoding's (with the three-way verdict of `lossless.py`).

    python -m dflash_core.bench --methods plain,dflash,ar,lookup --prompt-set natural --threads 1

DFlash is the pair's `--drafter`; every other drafting method reads its own drafter folder
(`--dflash2-drafter`, `--fusion-drafter`, `--ar-drafter`; defaults in `DEFAULT_DRAFTERS`), which
must be of its kind and fit the target.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from ..decoding import run
from ..loading.chat_template import describe_template, reasoning_args
from ..loading.pair import load_lane_drafter
from ..loading.prompting import encode_prompt
from ..lossless import compare as lossless_check
from ..prompt_lookup import PromptLookup

METHODS = ("plain", "dflash", "dflash2", "fusion", "ar", "lookup")
LABELS = {"plain": "plain", "dflash": "DFlash", "dflash2": "DFlash2", "fusion": "input fusion", "ar": "AR drafter",
          "lookup": "prompt lookup"}
# The offline pair's drafter of each method that has its own (the app's pairs.json names the same
# folders for its lanes; tests/test_methods.py holds the two together).
DEFAULT_DRAFTERS = {
    "dflash2": "assets/drafters/smollm2-135m-instruct-dflash2",
    "fusion": "assets/drafters/smollm2-135m-instruct-fusion",
    "ar": "assets/drafters/smollm2-135m-instruct-ar",
}


def parse_methods(text: str) -> list[str]:
    """The comma-separated method names, in the canonical order, plain always among them (every
    other row is compared with it); an unknown name is an argparse error naming the allowed ones."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(METHODS)}")
    return [m for m in METHODS if m == "plain" or m in names]


def drafter_arg(args, method: str):
    """The drafter folder given for `method` (`--dflash2-drafter` and the like)."""
    return getattr(args, f"{method}_drafter")


def rotated(methods: list[str], i: int) -> list[str]:
    k = i % len(methods)
    return methods[k:] + methods[:k]


def row(summaries: list, plain: list, verdicts: list | None) -> dict:
    """One method's figures over its summaries (one per prompt); `plain`: plain decoding's."""
    blocks = [b for s in summaries for b in s.blocks]
    cycles = len(blocks)
    tokens, seconds = sum(len(s.output_ids) for s in summaries), sum(s.total_s for s in summaries)
    plain_tok_s = sum(len(s.output_ids) for s in plain) / sum(s.total_s for s in plain)
    tok_s = tokens / seconds
    out = {
        "num_prompts": len(summaries),
        "cycles": cycles,
        "tokens": tokens,
        "tau": statistics.fmean(b.acceptance_length for b in blocks),
        # Slot k counts as accepted in a cycle when the target kept at least k drafts.
        "per_position_acceptance": [sum(b.accepted >= k for b in blocks) / cycles
                                    for k in range(1, summaries[0].block_size)],
        "draft_passes_per_cycle": sum(b.draft_passes for b in blocks) / cycles,
        "draft_ms_per_cycle": 1000 * sum(b.draft_s for b in blocks) / cycles,
        "verify_ms_per_cycle": 1000 * sum(b.verify_s for b in blocks) / cycles,
        "tok_s": tok_s,
        "speedup": tok_s / plain_tok_s,
        "identical": sum(s.output_ids == p.output_ids for s, p in zip(summaries, plain, strict=True)),
    }
    if verdicts is not None:
        out["lossless"] = {kind: sum(v.kind == kind for v in verdicts) for kind in ("identical", "near_tie", "diverged")}
        out["differences"] = [{"prompt": i, **v.to_dict()} for i, v in enumerate(verdicts) if v.kind != "identical"]
    return out


def benchmark_methods(args, pair, prompts: list[dict]) -> dict:
    """Race `args.methods` on `prompts` (records of `select_prompts`) with `pair`'s target."""
    target, tokenizer = pair.target, pair.tokenizer
    block_size = args.block_sizes[0] if args.block_sizes else pair.drafter.block_size
    drafters = {"plain": None, "dflash": pair.drafter, "lookup": PromptLookup(block_size=block_size)}
    for method in DEFAULT_DRAFTERS:
        if method in args.methods:
            drafters[method] = load_lane_drafter(target, method, drafter_arg(args, method), pair.drafter.dtype,
                                                 block_size)
    methods = args.methods
    stop_ids = pair.stop_ids
    chat_args = reasoning_args(tokenizer, args.thinking) if tokenizer is not None else {}
    encoded = [encode_prompt(tokenizer, p["prompt"], template_args=chat_args) for p in prompts]

    def decode(method, prompt_ids):
        drafter = drafters[method]
        return run(target, prompt_ids, drafter, max_new_tokens=args.max_new_tokens,
                   block_size=None if drafter is None else block_size, stop_ids=stop_ids)

    for method in methods:  # warm up kernels and allocator outside the clock
        decode(method, encoded[0][:8])
    summaries = {m: [] for m in methods}
    for i, prompt_ids in enumerate(encoded):
        done = {m: decode(m, prompt_ids) for m in rotated(methods, i)}
        for m in methods:
            summaries[m].append(done[m])
        print(f"  prompt {i + 1}/{len(encoded)} ({prompts[i]['set']}/{prompts[i].get('category', '-')}): "
              + ", ".join(f"{m} {done[m].tau:.2f} {done[m].tokens_per_s:.1f} tok/s" for m in methods),
              file=sys.stderr, flush=True)

    plain = summaries["plain"]
    verdicts = {m: [lossless_check(target, p, s.output_ids, q.output_ids)
                    for p, s, q in zip(encoded, summaries[m], plain, strict=True)] for m in methods if m != "plain"}
    rows = {m: row(summaries[m], plain, verdicts.get(m)) for m in methods}
    sets: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        sets.setdefault(p["set"], []).append(i)
    per_set = {name: {m: row([summaries[m][i] for i in picked], [plain[i] for i in picked], None)
                      for m in methods} for name, picked in sets.items()} if len(sets) > 1 else None
    return {
        "mode": "methods",
        "target": str(args.target),
        "drafter": str(args.drafter),
        **{f"{m}_drafter": str(drafter_arg(args, m)) if m in methods else None for m in DEFAULT_DRAFTERS},
        "device": args.device,
        "dtype": args.dtype,
        "drafter_dtype": str(pair.drafter.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "chat_template": describe_template(tokenizer, chat_args),
        "prompt_sets": list(sets),
        "num_prompts": len(encoded),
        "max_new_tokens": args.max_new_tokens,
        "block_size": block_size,
        "methods": rows,
        "per_set": per_set,
        # Every output equal to plain decoding's (at T=0 all must be).
        "all_identical": all(r["identical"] == len(encoded) for r in rows.values()),
    }


def print_methods_table(result: dict) -> None:
    n = result["num_prompts"]
    print(f"\n{n} prompts ({', '.join(result['prompt_sets'])}), {result['max_new_tokens']} new tokens, block "
          f"{result['block_size']}, target {result['dtype']}, drafters {result['drafter_dtype']}, on "
          f"{result['device']} ({result['threads']} threads); prompts through {result['chat_template']}")
    slots = "/".join(str(k) for k in range(1, result["block_size"]))
    print(f"{'method':<15}{'tau':>6}{'accepted at slot ' + slots:>26}{'passes':>8}{'draft ms':>10}{'verify ms':>11}"
          f"{'tok/s':>8}{'speedup':>9}{'= plain':>9}")
    for method, r in result["methods"].items():
        accepted = " / ".join(f"{100 * a:.0f}%" for a in r["per_position_acceptance"]) or "-"
        print(f"{LABELS[method]:<15}{r['tau']:>6.2f}{accepted:>26}{r['draft_passes_per_cycle']:>8.2f}"
              f"{r['draft_ms_per_cycle']:>10.1f}{r['verify_ms_per_cycle']:>11.1f}{r['tok_s']:>8.2f}"
              f"{r['speedup']:>8.2f}x{str(r['identical']) + '/' + str(n):>9}")
        for d in r.get("differences", []):
            print(f"    prompt {d['prompt'] + 1}: {d['message']}")
    if not result["all_identical"]:
        print("NOT all outputs equal plain decoding (at T=0 all must): see the differences above")
    for name, rows in (result["per_set"] or {}).items():
        print(f"{name}: " + ", ".join(f"{LABELS[m]} tau {r['tau']:.2f} {r['speedup']:.2f}x" for m, r in rows.items()))

