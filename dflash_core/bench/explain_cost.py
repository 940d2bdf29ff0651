"""What the cycle explanation costs: the same prompts decoded with `explain` off and on, side by side.

`python -m dflash_core.bench explain-cost [--top-k K]` runs, for every prompt and for greedy and sampled
decoding, DFlash and plain decoding with explain=0 and explain=K in alternating order (so a drift
in the machine's speed lands on both), and reports compute milliseconds per cycle (prefill
excluded) and the overhead of explain in percent. Outputs must be identical either way.

On a machine shared with other jobs wall-clock time swings with their load, so two more figures
are given: the process's CPU time per cycle off and on (what this process itself spent, whoever
else runs), and the overhead measured inside each explained cycle: a block's compute time
(`elapsed_s` since the previous block) minus its draft + verify + other seconds is what building
its explanation cost, at the same moment and under the same load as the cycle itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ..decoding import run
from ..loading.cli import load_pair_of
from ..loading.prompting import encode_prompt
from ..sampling import SamplingParams
from .run import add_pair_args, add_prompt_args, load_prompts, parse

SAMPLINGS = {"greedy": SamplingParams(), "T=0.7": SamplingParams(temperature=0.7, seed=0)}


def _ms_per_cycle(summary) -> float:
    return 1000 * (summary.total_s - summary.prefill.seconds) / len(summary.blocks)


def in_cycle_overhead(summary) -> tuple[float, float]:
    """(cycle seconds without the explanation, seconds building it), summed over the run's blocks."""
    cycle = explain = 0.0
    previous = summary.prefill.seconds
    for block in summary.blocks:
        own = block.explain.time.total_s
        cycle += own
        explain += (block.elapsed_s - previous) - own
        previous = block.elapsed_s
    return cycle, explain


def explain_overhead(target, drafter, encoded: list[list[int]], *, k: int, max_new_tokens: int, stop_ids,
                     block_size: int, repeats: int = 2) -> dict:
    """Per-cycle ms off and on, and the overhead in percent, per side and sampling mode."""
    result = {"explain_k": k, "repeats": repeats, "modes": {}}
    for mode, sampling in SAMPLINGS.items():
        for side, d in (("dflash", drafter), ("plain", None)):
            cost = {0: [], k: []}
            cpu = {0: [], k: []}  # CPU ms per cycle, prefill's share included
            inside = [0.0, 0.0]
            same = True
            for prompt_ids in encoded:
                outputs = {}
                for rep in range(repeats):
                    for e in ((0, k) if rep % 2 == 0 else (k, 0)):
                        started = time.process_time()
                        s = run(target, prompt_ids, d, max_new_tokens=max_new_tokens, block_size=block_size,
                                sampling=sampling, stop_ids=stop_ids, explain=e)
                        cpu[e].append(1000 * (time.process_time() - started) / len(s.blocks))
                        cost[e].append(_ms_per_cycle(s))
                        if e:
                            inside = [a + b for a, b in zip(inside, in_cycle_overhead(s))]
                        outputs.setdefault(e, s.output_ids)
                same &= outputs[0] == outputs[k]
            off, on = statistics.fmean(cost[0]), statistics.fmean(cost[k])
            result["modes"][f"{side} {mode}"] = {
                "ms_per_cycle_off": off, "ms_per_cycle_on": on, "overhead_pct": 100 * (on - off) / off,
                # per prompt and repeat, so a noisy machine shows as a spread, not as one number
                "overhead_pct_median_pair": statistics.median(100 * (b - a) / a for a, b in zip(cost[0], cost[k])),
                "cpu_ms_per_cycle_off": statistics.fmean(cpu[0]), "cpu_ms_per_cycle_on": statistics.fmean(cpu[k]),
                "cpu_overhead_pct": 100 * (statistics.fmean(cpu[k]) / statistics.fmean(cpu[0]) - 1),
                "in_cycle_overhead_pct": 100 * inside[1] / inside[0],
                "identical_outputs": same,
            }
            r = result["modes"][f"{side} {mode}"]
            print(f"  {side} {mode}: {off:.1f} -> {on:.1f} ms/cycle, CPU {r['cpu_overhead_pct']:.1f}%, "
                  f"in-cycle {r['in_cycle_overhead_pct']:.1f}%", file=sys.stderr, flush=True)
    return result


def print_table(result: dict) -> None:
    print(f"\nexplain k={result['explain_k']}, {result['repeats']} runs per prompt and setting, "
          f"{result.get('num_prompts', '?')} prompts, {result.get('max_new_tokens', '?')} new tokens")
    print(f"{'side, sampling':<20}{'off ms/cycle':>14}{'on ms/cycle':>13}{'wall':>8}{'median':>8}"
          f"{'CPU':>8}{'in-cycle':>10}{'identical':>11}")
    for name, r in result["modes"].items():
        print(f"{name:<20}{r['ms_per_cycle_off']:>14.2f}{r['ms_per_cycle_on']:>13.2f}{r['overhead_pct']:>7.1f}%"
              f"{r['overhead_pct_median_pair']:>7.1f}%{r['cpu_overhead_pct']:>7.1f}%{r['in_cycle_overhead_pct']:>9.1f}%"
              f"{str(r['identical_outputs']):>11}")


def explain_costs(args) -> dict:
    """`explain_overhead` for the loaded pair at its first block size."""
    pair = load_pair_of(args)
    tokenizer = pair.tokenizer
    prompts = load_prompts(args.prompts, args.num_prompts)
    encoded = [encode_prompt(tokenizer, p["prompt"]) for p in prompts]
    block_size = (args.block_sizes or [pair.drafter.block_size])[0]
    common = dict(max_new_tokens=args.max_new_tokens, stop_ids=pair.stop_ids, block_size=block_size)
    run(pair.target, encoded[0][:8], pair.drafter, explain=args.top_k, **common)  # warm up outside the clock
    result = explain_overhead(pair.target, pair.drafter, encoded, k=args.top_k, **common)
    result.update(target=str(args.target), drafter=str(args.drafter), dtype=args.dtype, block_size=block_size,
                  threads=torch.get_num_threads(), num_prompts=len(encoded), max_new_tokens=args.max_new_tokens)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_core.bench explain-cost",
                                     description=__doc__.splitlines()[0])
    add_pair_args(parser)
    add_prompt_args(parser)
    parser.add_argument("--top-k", type=int, default=5, metavar="K", help="the explanation's top-k size (explain=K)")
    args = parse(parser, argv)
    if args.top_k < 1:
        parser.error(f"--top-k must be at least 1, got {args.top_k}")
    result = explain_costs(args)
    print_table(result)
    print(json.dumps(result))
    return 0
