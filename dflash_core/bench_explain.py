"""What the cycle explanation costs: the same prompts decoded with `explain` off and on, side by side.

`python -m dflash_core.bench --explain [K]` runs, for every prompt and for greedy and sampled
decoding, DFlash and plain decoding with explain=0 and explain=K in alternating order (so a drift
in the machine's speed lands on both), and reports compute milliseconds per cycle (prefill
excluded) and the overhead of explain in percent. Outputs must be identical either way.
"""

from __future__ import annotations

import statistics
import sys

from .decoding import run
from .sampling import SamplingParams

SAMPLINGS = {"greedy": SamplingParams(), "T=0.7": SamplingParams(temperature=0.7, seed=0)}


def _ms_per_cycle(summary) -> float:
    return 1000 * (summary.total_s - summary.prefill.seconds) / len(summary.blocks)


def explain_overhead(target, drafter, encoded: list[list[int]], *, k: int, max_new_tokens: int, stop_ids,
                     block_size: int, repeats: int = 2) -> dict:
    """Per-cycle ms off and on, and the overhead in percent, per side and sampling mode."""
    result = {"explain_k": k, "repeats": repeats, "modes": {}}
    for mode, sampling in SAMPLINGS.items():
        for side, d in (("dflash", drafter), ("plain", None)):
            cost = {0: [], k: []}
            same = True
            for prompt_ids in encoded:
                outputs = {}
                for rep in range(repeats):
                    for e in ((0, k) if rep % 2 == 0 else (k, 0)):
                        s = run(target, prompt_ids, d, max_new_tokens=max_new_tokens, block_size=block_size,
                                sampling=sampling, stop_ids=stop_ids, explain=e)
                        cost[e].append(_ms_per_cycle(s))
                        outputs.setdefault(e, s.output_ids)
                same &= outputs[0] == outputs[k]
            off, on = statistics.fmean(cost[0]), statistics.fmean(cost[k])
            result["modes"][f"{side} {mode}"] = {
                "ms_per_cycle_off": off, "ms_per_cycle_on": on, "overhead_pct": 100 * (on - off) / off,
                # per prompt and repeat, so a noisy machine shows as a spread, not as one number
                "overhead_pct_median_pair": statistics.median(100 * (b - a) / a for a, b in zip(cost[0], cost[k])),
                "identical_outputs": same,
            }
            print(f"  {side} {mode}: {off:.1f} -> {on:.1f} ms/cycle", file=sys.stderr, flush=True)
    return result


def print_table(result: dict) -> None:
    print(f"\nexplain k={result['explain_k']}, {result['repeats']} runs per prompt and setting, "
          f"{result.get('num_prompts', '?')} prompts, {result.get('max_new_tokens', '?')} new tokens")
    print(f"{'side, sampling':<20}{'off ms/cycle':>14}{'on ms/cycle':>13}{'overhead':>10}{'median':>9}{'identical':>11}")
    for name, r in result["modes"].items():
        print(f"{name:<20}{r['ms_per_cycle_off']:>14.2f}{r['ms_per_cycle_on']:>13.2f}{r['overhead_pct']:>9.1f}%"
              f"{r['overhead_pct_median_pair']:>8.1f}%{str(r['identical_outputs']):>11}")
