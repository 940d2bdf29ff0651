"""Race the app's example prompts through a running app's `compare` endpoint and print the figures.

Start the app first (`python app.py --port 7861`), then:

    python dev/scripts/race_examples.py --url http://127.0.0.1:7861/ --pair smollm2-135m --block-size 4

Each example is raced once (greedy, 128 new tokens); one row per example with tau, speedup and whether
the two sides are token-identical, then one JSON line with all of them. `--lanes tree` (and any other
lane of the app) races those lanes beside DFlash and plain decoding, each with its tok/s, tau and
whether it is identical; `--tree-budget N` sets the tree lane's drafts per cycle. `--wait-compiled S` first
polls the pair's status line until its lanes run compiled (at most S seconds), and says how long that took.
"""

from __future__ import annotations

import argparse
import json
import time

from gradio_client import Client

from app.race.lanes import TREE_BUDGET
from app.serve.examples import EXAMPLES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7860/")
    p.add_argument("--pair", default=None,
                   help="pair id to select first (app/pairs/pairs.json); default: the app's, and with --wait-compiled "
                   "the offline default, smollm2-135m (the status line is asked for by pair)")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--wait-compiled", type=float, default=0, metavar="S",
                   help="first wait up to S seconds for the status line to say the lanes run compiled")
    p.add_argument("--lanes", nargs="*", default=[], help="more lanes to race (the app's names: tree, lookup, ...)")
    p.add_argument("--tree-budget", type=int, default=TREE_BUDGET, help="the tree lane's drafts per cycle (default: %(default)s, the app's)")
    args = p.parse_args()
    if args.wait_compiled and args.pair is None:
        args.pair = "smollm2-135m"
    start = time.perf_counter()
    client = Client(args.url, verbose=False)
    status, _ = client.predict(args.pair, api_name="/select_pair") if args.pair else (None, None)
    default_ready = False
    while args.wait_compiled and "Lane steps: compiled" not in (status or ""):
        if time.perf_counter() - start > args.wait_compiled:
            raise SystemExit(f"the lanes did not run compiled within {args.wait_compiled:g} s: {status}")
        if not default_ready and "run compiled already" in (status or ""):
            default_ready = True
            print(f"{time.perf_counter() - start:.1f} s: {status[status.index('Lane steps'):]}", flush=True)
        time.sleep(2)
        status, _ = client.predict(args.pair, api_name="/select_pair")
    if status:
        print(f"{time.perf_counter() - start:.1f} s after this script started: {status}", flush=True)
    rows = []
    for (prompt,) in EXAMPLES:
        summary = client.predict(prompt, args.max_new_tokens, args.block_size, 0.0, 1.0, 0, args.lanes, "default",
                                 args.tree_budget, api_name="/compare")[-2]
        lanes = {lane: {k: summary["lanes"][lane][k] for k in ("tok_s", "tau", "speedup", "identical")} for lane in args.lanes}
        rows.append({"prompt": prompt[:48], **{k: summary[k] for k in ("tau", "speedup", "identical", "dflash_tok_s", "plain_tok_s")},
                     **({"lanes": lanes} if lanes else {})})
        more = "".join(f"  {lane} {row['tok_s']:.1f} tok/s, tau {row['tau']:.2f}, identical {row['identical']}"
                       for lane, row in lanes.items())
        print(f"{prompt[:48]:<50} tau {summary['tau']:.2f}  speedup {summary['speedup']:.2f}x  "
              f"identical {summary['identical']}  ({summary['plain_tok_s']:.1f} -> {summary['dflash_tok_s']:.1f} tok/s){more}",
              flush=True)
    print(json.dumps({"pair": args.pair, "block_size": args.block_size, "lanes": args.lanes,
                      "tree_budget": args.tree_budget, "rows": rows}))


if __name__ == "__main__":
    main()
