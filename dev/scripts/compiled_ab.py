"""Eager against compiled steps in one process: plain decoding and DFlash of the same prompts through
the eager target (DynamicCache, the default), the same with the CPU rows kernel switched off
(`libraries`: MKL and oneDNN as `cpu_linear.py` chose them) and compiled ones (`Target(...,
compiled=True)` on the same weights, with `library` or `template` GEMMs, `compiled_steps.py`),
interleaved prompt by prompt, every output checked against the first variant's plain decoding.

    python dev/scripts/compiled_ab.py --threads 1 --num-prompts 8 --max-new-tokens 128 --reps 2 \
        --variants libraries eager library template

Prints tok/s (wall), CPU ms per token, and the median draft and verify time per cycle of each.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import time
from pathlib import Path

import torch

from dflash_core import Target, load_pair, run
from dflash_core.bench.run import DEFAULT_DRAFTER, select_prompts
from dflash_core.loading import DEFAULT_TARGET
from dflash_core.loading.prompting import encode_prompt
from dflash_core.precompile import size_caches
from dflash_core.speed.cpu_linear import PackedLinear


@contextlib.contextmanager
def rows_kernel_off(models, off: bool):
    """Within, the packed layers of `models` run as if the rows kernel had not been chosen (if `off`)."""
    layers = [m for model in models for m in model.modules() if isinstance(m, PackedLinear) and m.rows_kernel]
    for m in layers:
        m.rows_kernel = not off
    try:
        yield
    finally:
        for m in layers:
            m.rows_kernel = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--drafter", default=DEFAULT_DRAFTER)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prompt-set", default="natural", choices=["natural", "generated", "both"])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2, help="passes over the prompts")
    parser.add_argument("--positions", type=int, default=None,
                        help="what the compiled targets' static caches hold, less a block (the app's lanes: 508); "
                        "default: the longest prompt plus --max-new-tokens")
    parser.add_argument("--variants", nargs="+", default=["eager", "template"],
                        choices=["libraries", "eager", "library", "template"],
                        help="eager: the DynamicCache target; libraries: the same without the CPU rows kernel; "
                        "library, template: compiled with those GEMMs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(args.target, args.drafter, dtype="float32")
    drafter, tokenizer = pair.drafter, pair.tokenizer
    targets = {
        name: pair.target if name in ("eager", "libraries")
        else Target(pair.target.model, tokenizer, static_cache=True, compiled=True, compile_gemms=name)
        for name in args.variants
    }
    prompts = [encode_prompt(tokenizer, p["prompt"]) for p in select_prompts(None, args.prompt_set, args.num_prompts)]
    stop_ids = [tokenizer.eos_token_id]
    for target in targets.values():
        if target.static_cache:
            size_caches(target, drafter, args.positions or max(map(len, prompts)) + args.max_new_tokens)
    for name, target in targets.items():
        start = time.perf_counter()
        with rows_kernel_off((target.model, drafter), name == "libraries"):
            for model in (None, drafter):
                run(target, prompts[0][:8], model, max_new_tokens=args.max_new_tokens, stop_ids=stop_ids)
        print(f"{name} warm-up (compiles, or reads inductor's cache): {time.perf_counter() - start:.1f} s", flush=True)
    totals, identical = {}, []
    for rep in range(args.reps):
        for i, ids in enumerate(prompts):
            order = list(targets) if (i + rep) % 2 == 0 else list(targets)[::-1]  # none always goes first
            outputs = {}
            for name in order:
                for model, method in ((None, "plain"), (drafter, "dflash")):
                    with rows_kernel_off((targets[name].model, drafter), name == "libraries"):
                        cpu = time.process_time()
                        s = run(targets[name], ids, model, max_new_tokens=args.max_new_tokens, stop_ids=stop_ids)
                        cpu = time.process_time() - cpu
                    outputs[name, method] = s.output_ids
                    t = totals.setdefault((name, method), {"s": 0.0, "cpu": 0.0, "tokens": 0, "draft": [], "verify": []})
                    t["s"] += s.total_s
                    t["cpu"] += cpu
                    t["tokens"] += len(s.output_ids)
                    t["draft"] += [b.draft_s for b in s.blocks]
                    t["verify"] += [b.verify_s for b in s.blocks]
            identical.append(all(out == outputs[args.variants[0], "plain"] for out in outputs.values()))
            print(f"prompt {i + 1}/{len(prompts)}, pass {rep + 1}: outputs identical {identical[-1]}, "
                  f"load {Path('/proc/loadavg').read_text().split()[0]}", flush=True)
    for (name, method), t in totals.items():
        print(f"{name:9}{method:8}{t['tokens'] / t['s']:7.2f} tok/s {1000 * t['cpu'] / t['tokens']:7.1f} CPU ms/token  "
              f"draft {1000 * statistics.median(t['draft']):5.1f} ms, verify {1000 * statistics.median(t['verify']):6.1f} ms "
              "per cycle (medians)")
    print(f"all outputs identical on {sum(identical)}/{len(identical)} prompt passes; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
