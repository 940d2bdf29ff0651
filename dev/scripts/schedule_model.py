"""The block schedule against fixed blocks, timed by a cost model instead of the clock.

Decodes each prompt greedily with the schedule (`block_size="auto"`) and with fixed blocks, checks
every output against plain decoding, and times every cycle with one table of costs: the drafter's
pass for n drafts, the target's verify of L tokens, and the rest of a cycle. The schedule decides
with the same table (`CostProfile` with `other_s` and `draft_s` given), so its choices, and the
modeled speedups, do not depend on the machine's load: what a shared machine cannot time, this
compares. `--variant NAME=CONST:VALUE,...` also runs the schedule with module constants changed
(e.g. `nopause=PATIENCE:1000000`, `nocalibration=PRIOR:1e9`).

The default costs are a quiet 2-core AMD EPYC (AVX2 only), float32, 1 thread, eager steps, from
`bench cycle` (docs/benchmarks.md, "The block schedule"): a plain step 70 ms; a verify of 2 / 4 /
8 / 16 tokens 95.2 / 105.8 / 123.6 / 155.3 ms, linear between; a drafter pass of n drafts
10 + 0.55 (n + 1) ms; 3 ms for the rest.

    python dev/scripts/schedule_model.py --drafter assets/drafters/smollm2-135m-instruct-dflash-b16 \
        --num-prompts 5 --max-new-tokens 96 --fixed 3,4,8 --variant nopause=PATIENCE:1000000
"""

from __future__ import annotations

import argparse
import json

import torch

import dflash_core.schedule as schedule
from dflash_core import run
from dflash_core.bench.run import select_prompts
from dflash_core.loading.pair import load_pair
from dflash_core.loading.prompting import encode_prompt

VERIFY_MS = {1: 70.0, 2: 95.2, 4: 105.8, 8: 123.6, 16: 155.3}
REST_MS = 3.0


def verify_ms(length: int) -> float:
    points = sorted(VERIFY_MS)
    for a, b in zip(points, points[1:]):
        if a <= length <= b:
            return VERIFY_MS[a] + (VERIFY_MS[b] - VERIFY_MS[a]) * (length - a) / (b - a)
    raise ValueError(f"no verify cost for {length} tokens")


def draft_ms(drafts: int) -> float:
    return 10.0 + 0.55 * (drafts + 1) if drafts else 0.0


def modeled_ms(summary) -> float:
    return sum(draft_ms(len(b.draft_ids)) + verify_ms(b.verify_len) + REST_MS for b in summary.blocks)


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, settings = text.partition("=")
    changes = {}
    for item in settings.split(","):
        const, _, value = item.partition(":")
        if not hasattr(schedule, const):
            raise SystemExit(f"dflash_core.schedule has no constant {const!r}")
        changes[const] = type(getattr(schedule, const))(float(value))
    return name, changes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default:smollm2")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--num-prompts", type=int, default=5, help="per prompt set (natural, generated)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--fixed", default="3,4", help="fixed block sizes to compare")
    parser.add_argument("--variant", action="append", default=[], help="NAME=CONST:VALUE,... (see the module doc)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(args.target, args.drafter)
    target, drafter = pair.target, pair.drafter
    longest = drafter.block_size
    costs = schedule.CostProfile(tuple(verify_ms(n) / 1000 for n in range(1, longest + 1)),
                                 other_s=(draft_ms(3) + REST_MS) / 1000, draft_s=draft_ms(3) / 1000)
    variants = {"auto": {}, **dict(parse_variant(v) for v in args.variant)}
    defaults = {const: getattr(schedule, const) for changes in variants.values() for const in changes}
    sets: dict[str, list] = {}
    for record in select_prompts(None, "both", args.num_prompts):
        sets.setdefault(record["set"], []).append(record)
    results = {}
    for name, records in sets.items():
        totals: dict[str, list] = {}
        plain_ms = 0.0
        for record in records:
            ids = encode_prompt(target.tokenizer, record["prompt"])
            plain = run(target, ids, None, max_new_tokens=args.max_new_tokens)
            plain_ms += len(plain.output_ids) * (verify_ms(1) + REST_MS)  # plain decoding: the same loop, no drafts
            runs = {}
            for variant, changes in variants.items():
                for const, value in {**defaults, **changes}.items():
                    setattr(schedule, const, value)
                runs[variant] = run(target, ids, drafter, max_new_tokens=args.max_new_tokens, block_size="auto", costs=costs)
            for const, value in defaults.items():
                setattr(schedule, const, value)
            for size in (int(s) for s in args.fixed.split(",")):
                runs[f"fixed {size}"] = run(target, ids, drafter, max_new_tokens=args.max_new_tokens, block_size=size)
            for key, out in runs.items():
                assert out.output_ids == plain.output_ids, f"{key} differs from plain decoding on {record['prompt'][:40]!r}"
                t = totals.setdefault(key, [0.0, 0, 0, 0])
                t[0] += modeled_ms(out)
                t[1] += len(out.blocks)
                t[2] += sum(not b.draft_ids for b in out.blocks)
                t[3] += len(out.output_ids)
        results[name] = {key: {"speedup": plain_ms / ms, "tau": tokens / cycles, "paused_cycles": paused, "cycles": cycles}
                         for key, (ms, cycles, paused, tokens) in totals.items()}
        print(f"{name} ({len(records)} prompts, {args.max_new_tokens} tokens; every output identical to plain):")
        for key, r in results[name].items():
            print(f"  {key:12s} modeled speedup {r['speedup']:.3f}  tau {r['tau']:.2f}  paused {r['paused_cycles']}/{r['cycles']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"drafter": args.drafter, "max_new_tokens": args.max_new_tokens, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
