"""Benchmark: tree verification beside the chain, on the same prompts (`bench --tree-budget 2,4,...`).

Per prompt: plain decoding, DFlash's chain at the drafter's block size, then a tree of each budget
(`tree.py`), all greedy. Per prompt set and variant: tau, tokens verified per cycle, what a cycle
costs in plain steps (the mean one-token verify of the plain run on the same prompts): the draft,
the verify, and the host's tree growth and walk; then the speedup over plain decoding and the share
of prompts whose output is plain decoding's.

Whole runs on a shared machine time noisily, so each variant's verify is also timed alone
(`verify_costs`: one verify of its rows after the same context, all variants interleaved, the
median of several rounds, over a plain step's median). From those: `CPU model`, the speedup its tau
gives at that verify cost (tau / (draft + verify + host), in plain steps), `break-even tau`, the
tau it needs to match the chain's model speedup, and `GPU model`, the speedup its tau would give
where a verify of up to 33 rows costs one plain step, as on a GPU at this model size: tau / (1 +
draft + host), the draft and host costs as measured here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ..decoding import run
from ..loading.chat_template import reasoning_args
from ..loading.prompting import encode_prompt
from ..tree import ancestor_mask, grow

CHAIN = 0  # tree_budget 0: the drafter's chain


def parse_budgets(text: str) -> list[int]:
    """Comma-separated node budgets, each at least 1."""
    try:
        budgets = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        budgets = []
    if not budgets or min(budgets) < 1:
        raise argparse.ArgumentTypeError(f"--tree-budget must list whole numbers >= 1, e.g. 2,4,8; got {text!r}")
    return list(dict.fromkeys(budgets))


def label(budget: int) -> str:
    return "chain" if budget == CHAIN else f"tree {budget}"


def verify_costs(target, context: list[int], block_size: int, budgets: list[int], rounds: int = 15) -> dict[int, float]:
    """Median seconds of one verify after `context`: a plain step (key -1), the chain's block (0)
    and a tree of each budget, timed in turn within each round so that load on the machine falls
    on all of them alike."""
    target.reset(len(context) + 2 * max([block_size, *budgets]) + 8)
    target.forward(torch.tensor([context]), last_logits_only=True)
    trees = {b: grow(0, [list(range(b))] * (block_size - 1), [[-r for r in range(b)]] * (block_size - 1), b)
             for b in budgets}
    steps = {-1: lambda: target.forward(torch.tensor([[0]])),
             CHAIN: lambda: target.forward(torch.tensor([[0] * block_size]))}
    for b, tree in trees.items():
        steps[b] = lambda tree=tree: target.forward_tree(torch.tensor([tree.tokens]), torch.tensor(tree.depths),
                                                          ancestor_mask(tree, target.device))
    times: dict[int, list[float]] = {key: [] for key in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            start = time.perf_counter()
            step()
            times[key].append(time.perf_counter() - start)
            target.crop(len(context))
    return {key: statistics.median(values) for key, values in times.items()}


def benchmark_trees(args, pair, prompts: list[dict]) -> dict:
    target, drafter, tokenizer = pair.target, pair.drafter, pair.tokenizer
    eos = tokenizer.eos_token_id if tokenizer is not None else None
    chat_args = reasoning_args(tokenizer, args.thinking) if tokenizer is not None else {}
    encoded = [encode_prompt(tokenizer, p["prompt"], template_args=chat_args) for p in prompts]
    variants = [CHAIN, *args.tree_budget]

    def decode(prompt_ids, budget=None):
        return run(target, prompt_ids, None if budget is None else drafter, max_new_tokens=args.max_new_tokens,
                   stop_ids=[] if eos is None else [eos], tree_budget=budget or 0)

    decode(encoded[0][:8])  # warm up outside the clock
    for budget in variants:
        decode(encoded[0][:8], budget)
    plain, runs = [], {b: [] for b in variants}
    for i, prompt_ids in enumerate(encoded):
        plain.append(decode(prompt_ids))
        for budget in variants:
            runs[budget].append(decode(prompt_ids, budget))
        print(f"  prompt {i + 1}/{len(encoded)} ({prompts[i]['set']}): tau "
              + ", ".join(f"{label(b)}={runs[b][-1].tau:.2f}" for b in variants), file=sys.stderr, flush=True)

    costs = verify_costs(target, encoded[0], drafter.block_size, args.tree_budget)

    def figures(picked: list[int]) -> dict:
        plain_blocks = [blk for i in picked for blk in plain[i].blocks]
        step = statistics.fmean(blk.verify_s for blk in plain_blocks)  # one plain step's verify
        plain_tok_s = sum(len(plain[i].output_ids) for i in picked) / sum(plain[i].total_s for i in picked)
        rows = {"plain_step_ms": 1000 * step, "plain_tok_s": plain_tok_s}
        chain_model = None
        for budget in variants:
            summaries = [runs[budget][i] for i in picked]
            blocks = [blk for s in summaries for blk in s.blocks]
            host = statistics.fmean(blk.tree.host_s for blk in blocks) if budget else 0.0
            draft = statistics.fmean(blk.draft_s for blk in blocks)
            verify = statistics.fmean(blk.verify_s for blk in blocks)
            cycle = sum(s.total_s - s.prefill.seconds for s in summaries) / len(blocks)
            tau = statistics.fmean(blk.acceptance_length for blk in blocks)
            timed = costs[budget] / costs[-1]  # the verify alone, in plain steps
            model_cost = (draft + host) / step + timed
            if budget == CHAIN:
                chain_model = tau / model_cost
            tok_s = sum(len(s.output_ids) for s in summaries) / sum(s.total_s for s in summaries)
            rows[label(budget)] = {
                "tau": tau,
                "verified": statistics.fmean(blk.verified + 1 for blk in blocks),
                "draft_steps": draft / step,
                "verify_steps": verify / step,
                "host_ms": 1000 * host,
                "cycle_steps": cycle / step,
                "speedup": tok_s / plain_tok_s,
                "identical": statistics.fmean(s.output_ids == plain[i].output_ids for s, i in zip(summaries, picked)),
                "timed_verify_steps": timed,
                "cpu_model_speedup": tau / model_cost,
                "break_even_tau": chain_model * model_cost,
                "gpu_model_speedup": tau / (1 + (draft + host) / step),
            }
        return rows

    sets: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        sets.setdefault(p["set"], []).append(i)
    return {
        "target": str(args.target), "drafter": str(args.drafter), "dtype": args.dtype,
        "threads": torch.get_num_threads(), "num_prompts": len(encoded),
        "max_new_tokens": args.max_new_tokens, "block_size": drafter.block_size, "tree_budgets": args.tree_budget,
        "verify_ms": {label(b) if b >= 0 else "plain": 1000 * t for b, t in costs.items()},
        "per_set": {name: figures(picked) for name, picked in sets.items()},
    }


def print_trees_table(result: dict) -> None:
    print(f"\n{result['num_prompts']} prompts, {result['max_new_tokens']} new tokens, target {result['dtype']}, "
          f"{result['threads']} threads, drafter block {result['block_size']}; costs in plain steps")
    print("one verify, timed alone (median ms): " + ", ".join(f"{k} {v:.1f}" for k, v in result["verify_ms"].items()))
    head = (f"{'variant':<10}{'tau':>6}{'rows':>6}{'draft':>7}{'verify':>8}{'alone':>7}{'host ms':>9}{'cycle':>7}"
            f"{'speedup':>9}{'ident':>7}{'CPU model':>11}{'break-even':>12}{'GPU model':>11}")
    for name, rows in result["per_set"].items():
        print(f"{name}: plain step {rows['plain_step_ms']:.1f} ms, plain {rows['plain_tok_s']:.1f} tok/s")
        print(head)
        for variant, r in rows.items():
            if not isinstance(r, dict):
                continue
            print(f"{variant:<10}{r['tau']:>6.2f}{r['verified']:>6.1f}{r['draft_steps']:>7.2f}{r['verify_steps']:>8.2f}"
                  f"{r['timed_verify_steps']:>7.2f}{r['host_ms']:>9.2f}{r['cycle_steps']:>7.2f}{r['speedup']:>8.2f}x"
                  f"{r['identical']:>7.2f}{r['cpu_model_speedup']:>10.2f}x{r['break_even_tau']:>12.2f}"
                  f"{r['gpu_model_speedup']:>10.2f}x")
