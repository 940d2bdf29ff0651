"""Race the app's example prompts through a running app's `compare` endpoint and print the figures.

Start the app first (`python app.py --port 7861`), then:

    python dev/scripts/race_examples.py --url http://127.0.0.1:7861/ --pair smollm2-135m --block-size 4

Each example is raced once (greedy, 128 new tokens); one row per example with tau, speedup and whether
the two sides are token-identical, then one JSON line with all of them.
"""

from __future__ import annotations

import argparse
import json

from gradio_client import Client

from app.serve.examples import EXAMPLES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7860/")
    p.add_argument("--pair", default=None, help="pair id to select first (app/pairs/pairs.json); default: the app's")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    client = Client(args.url, verbose=False)
    if args.pair:
        status, _ = client.predict(args.pair, api_name="/select_pair")
        print(status)
    rows = []
    for (prompt,) in EXAMPLES:
        summary = client.predict(prompt, args.max_new_tokens, args.block_size, 0.0, 1.0, 0, api_name="/compare")[-2]
        rows.append({"prompt": prompt[:48], **{k: summary[k] for k in ("tau", "speedup", "identical", "dflash_tok_s", "plain_tok_s")}})
        print(f"{prompt[:48]:<50} tau {summary['tau']:.2f}  speedup {summary['speedup']:.2f}x  "
              f"identical {summary['identical']}  ({summary['plain_tok_s']:.1f} -> {summary['dflash_tok_s']:.1f} tok/s)",
              flush=True)
    print(json.dumps({"pair": args.pair, "block_size": args.block_size, "rows": rows}))


if __name__ == "__main__":
    main()
