"""What exact target-cache rollback costs per cycle: tiny random targets of the tested families, CPU.

For each family (tests/families.py) it times, at a fixed context:
- a plain decoding step (one token, then back to the context);
- a verify forward of a block, with the rollback of the previous cycle before it (`exact`);
- for gated delta-net hybrids, the same forward with per-position state recording switched off
  (`unrecorded`: the library's chunked rule, no recurrent restore). That target's state goes wrong
  after the first rejection, so it only shows what recording adds; decoding never runs it.

    python dev/scripts/rollback_cost.py --families qwen3_5,qwen3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from families import FAMILIES, build_family_target  # noqa: E402

from dflash_core import Target  # noqa: E402
from dflash_core.models.target_cache import LINEAR  # noqa: E402


def median_ms(step, iters: int, warmup: int = 3) -> float:
    samples = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        step()
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(samples)


@torch.inference_mode()
def time_family(target: Target, context: int, block: int, iters: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (1, context), generator=gen)
    tokens = torch.randint(0, target.vocab_size, (1, block), generator=gen)
    target.reset()
    target.forward(prompt, last_logits_only=True)
    target.forward(tokens)  # from here on every forward is recorded, as in decoding after the prefill

    def plain():
        target.crop(context)
        target.forward(tokens[:, :1])

    def verify():
        target.crop(context)  # every forward sees the same cache: the rollback runs first, inside it
        target.forward(tokens)
        target.crop(context + block // 2)  # a partial acceptance

    return {"plain_ms": median_ms(plain, iters), "verify_ms": median_ms(verify, iters)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="qwen3_5,gpt_oss,qwen3", help=f"comma-separated, from {sorted(FAMILIES)}")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for family in args.families.split(","):
            target = Target.from_pretrained(build_family_target(Path(root) / family, family))
            row = {"exact": time_family(target, args.context, args.block, args.iters)}
            if LINEAR in target.kv.kinds:
                unrecorded = Target(target.model)
                unrecorded.kv.recurrent = None
                row["unrecorded"] = time_family(unrecorded, args.context, args.block, args.iters)
            results[family] = row
            cells = ", ".join(f"{mode}: plain {r['plain_ms']:.3f} ms, verify {r['verify_ms']:.3f} ms"
                              for mode, r in row.items())
            print(f"{family:<12} {cells}")
    print(json.dumps({"context": args.context, "block": args.block, "threads": args.threads, "iters": args.iters,
                      "torch": torch.__version__, "results": results}))


if __name__ == "__main__":
    main()
