"""Greedy generation with z-lab's reference package (`dflash==0.1.0`: `dflash.model.dflash_generate`)
from prompt token ids, DFlash or DFlash2, or plain decoding (its own loop at block size 1), as JSON.

Runs inside the separate `.venv-reference` (`bash scripts/setup.sh --reference`), never in the app's
venv: it imports the package and nothing of this project. `dflash_core/bench/reference_peer.py` calls
it in a subprocess. Per prompt it records the new token ids, the seconds, the accepted length of
every cycle (the package's `acceptance_lengths`: accepted drafts + 1, cut at the token budget) and
every cycle's drafts, read off the drafter's logits as the loop computes them (their argmax for
DFlash, the selector's path for DFlash2), so a test can compare them with this engine's block for block.

    .venv-reference/bin/python scripts/reference_generate.py --target TARGET_DIR --drafter DRAFTER_DIR \\
        --prompts prompts.json --max-tokens 128 --threads 1 --out result.json

`prompts.json` is a JSON list of token-id lists.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time

import dflash.model as reference
import torch
import transformers
from transformers import AutoModelForCausalLM


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--drafter", required=True, help="DFlash or DFlash2 drafter directory (the package's loop needs "
                   "one even for plain decoding)")
    p.add_argument("--block-size", type=int, help="tokens verified per cycle; 1: plain decoding (default: the drafter's)")
    p.add_argument("--prompts", required=True, help="a .json list of prompt token-id lists")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop-ids", default="", help="comma-separated ids that end a generation")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu", help="torch device of target and drafter")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", required=True, help="write the JSON result here")
    return p.parse_args(argv)


def load_drafter(path: str, dtype: torch.dtype):
    with open(f"{path}/config.json") as f:
        architectures = json.load(f).get("architectures") or []
    known = {"DFlashDraftModel": reference.DFlashDraftModel, "DFlash2DraftModel": reference.DFlash2DraftModel}
    names = [name for name in architectures if name in known] or ([] if architectures else ["DFlashDraftModel"])
    if not names:
        raise SystemExit(f"{path}: architectures {architectures}; the reference package runs {', '.join(known)} drafters")
    cls = known[names[0]]
    return cls.from_pretrained(path, dtype=dtype).eval()


def record_drafts(model, drafts: list) -> None:
    """Append each cycle's draft ids to `drafts` as the loop proposes them (greedy only)."""
    if isinstance(model, reference.DFlash2DraftModel):
        propose = model.propose

        def recorded(*args, **kwargs):
            out = propose(*args, **kwargs)
            drafts.append(out[0][0].tolist())
            return out

        model.propose = recorded
    else:
        compute_logits = model.compute_logits

        def recorded(*args, **kwargs):
            logits = compute_logits(*args, **kwargs)
            drafts.append(logits[0].argmax(dim=-1).tolist())
            return logits

        model.compute_logits = recorded


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with open(args.prompts) as f:
        prompts = json.load(f)
    dtype = getattr(torch, args.dtype)
    stop_ids = [int(t) for t in args.stop_ids.split(",") if t] or None
    start = time.perf_counter()
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(args.device).eval()
    drafter = load_drafter(args.drafter, dtype).to(args.device)
    load_s = time.perf_counter() - start
    drafts: list = []
    record_drafts(drafter, drafts)
    if not torch.cuda.is_available():
        # The package times its stats with torch.cuda.synchronize, which a CPU build refuses; on a CPU the
        # plain clock is the same measurement.
        reference._cuda_time = time.perf_counter

    def generate(ids, max_new_tokens):
        before = time.perf_counter()
        stats = reference.dflash_generate(drafter, target, torch.tensor([ids], device=args.device), max_new_tokens, stop_ids,
                                          block_size=args.block_size, return_stats=True)
        return time.perf_counter() - before, stats

    generate(prompts[0][:8], 8)  # kernels and allocator outside the clock
    outputs = []
    for ids in prompts:
        drafts.clear()
        seconds, stats = generate(ids, args.max_tokens)
        outputs.append({"token_ids": stats.output_ids[0, len(ids):].tolist(), "seconds": seconds,
                        "acceptance_lengths": list(stats.acceptance_lengths), "draft_blocks": list(drafts)})
    total = sum(len(o["token_ids"]) for o in outputs)
    lengths = [n for o in outputs for n in o["acceptance_lengths"]]
    result = {
        "dflash": importlib.metadata.version("dflash"), "torch": torch.__version__,
        "transformers": transformers.__version__, "load_s": load_s, "outputs": outputs,
        "summary": {"tok_per_s": total / sum(o["seconds"] for o in outputs),
                    "tau": statistics.fmean(lengths) if lengths else None},
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
