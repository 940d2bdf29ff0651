"""Greedy generation in vLLM from prompt token ids, plain or with a DFlash drafter, as JSON.

Runs inside the separate `.venv-vllm` (`bash scripts/setup.sh --vllm`), never in the app's venv: it
imports vLLM and nothing of this project. The `vllm` tests and the benchmark call it in a subprocess
and compare its token ids with this engine's. Acceptance comes from vLLM's own per-request
speculative-decoding metrics (`per_request_spec_decode_metrics="detailed"`): the tokens each verify
step accepted, so tau is computed as this engine computes it (accepted drafts + 1 per cycle).

    .venv-vllm/bin/python scripts/vllm_generate.py --target ~/.cache/dflash-studio/smollm2-135m-instruct \\
        --drafter assets/drafters/smollm2-135m-instruct-dflash --num-speculative-tokens 3 \\
        --prompts prompts.json --max-tokens 128 --threads 2

`prompts.json` is a JSON list of token-id lists; the result is one JSON object, written to `--out`
(vLLM logs to stdout, so stdout carries it only without `--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# vllm_can_draft.py sits beside this script, which also runs through runpy (dev/measurements/).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_can_draft import refusal  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model directory or Hub id")
    p.add_argument("--drafter", help="DFlash drafter directory or Hub id; without it, plain decoding")
    p.add_argument("--num-speculative-tokens", type=int, help="draft tokens per cycle (block size - 1); "
                   "default: the drafter's block size - 1")
    p.add_argument("--prompts", required=True, help="a .json list of prompt token-id lists, or a .jsonl of "
                   '{"prompt": text} rows (e.g. assets/prompts/natural.jsonl), put through the target\'s chat template')
    p.add_argument("--num-prompts", type=int, help="only N prompts, spread over the file as the benchmark picks them")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32", help="vLLM's --dtype for target and drafter")
    p.add_argument("--threads", type=int, default=0, help="CPU only: bind vLLM's OpenMP threads to cores 0..N-1 "
                   "(0: vLLM's own choice)")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="CPU only: VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--eager", action="store_true", help="enforce_eager: skip torch.compile (starts in seconds "
                   "instead of minutes on a small CPU; for correctness checks, not for timing)")
    p.add_argument("--out", help="write the JSON result here (default: stdout)")
    return p.parse_args(argv)


def drafter_block_size(drafter: str) -> int:
    with open(os.path.join(drafter, "config.json")) as f:
        raw = json.load(f)
    return int((raw.get("dflash_config") or {}).get("block_size") or raw["block_size"])


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters by name: a number, or a list per draft position."""
    return {m.name: getattr(m, "value", getattr(m, "values", None)) for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode")}


def delta(now, before):
    """`now - before` for a counter or a per-position list (before: None when it did not exist yet)."""
    if before is None:
        return now
    if isinstance(now, list):
        return [a - b for a, b in zip(now, before, strict=True)]
    return now - before


def main(argv=None) -> int:
    args = parse_args(argv)
    with open(args.prompts) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()] if args.prompts.endswith(".jsonl") else json.load(f)
    if args.num_prompts:
        # Spread over the file as `python -m dflash_core.bench --num-prompts` picks them, every category in.
        prompts = prompts[:: max(1, len(prompts) // args.num_prompts)][: args.num_prompts]
    if not prompts or not all(isinstance(p, str) or (isinstance(p, list) and p) for p in prompts):
        sys.exit(f"{args.prompts}: expected a JSON list of non-empty token-id lists, or a .jsonl of prompt rows")
    # vLLM reads these when its engine starts, so they are set before it is imported.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    if args.threads:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}" if args.threads > 1 else "0")
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {}
    if args.drafter:
        if reason := refusal(args.drafter):
            sys.exit(f"error: {reason}")
        k = args.num_speculative_tokens or drafter_block_size(args.drafter) - 1
        extra = {
            "speculative_config": {"method": "dflash", "model": args.drafter, "num_speculative_tokens": k},
            "per_request_spec_decode_metrics": "detailed",
        }
    t0 = time.perf_counter()
    # gpu_memory_utilization is, on CPU, the share of RAM vLLM may reserve; the KV cache size is
    # VLLM_CPU_KVCACHE_SPACE. Both stay small: the machines this runs on are shared.
    # One sequence at a time and small prefill chunks also keep vLLM's start-up profiling run short.
    llm = LLM(model=args.target, dtype=args.dtype, max_model_len=args.max_model_len, gpu_memory_utilization=0.3,
              max_num_seqs=1, max_num_batched_tokens=args.max_model_len, enforce_eager=args.eager, seed=0, disable_log_stats=False, **extra)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    tokenizer = llm.get_tokenizer()
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                      return_dict=False) if isinstance(p, str) else p
        for p in prompts
    ]
    # One short generation outside the clock, as the benchmark warms this engine up: the first call
    # pays for lazy set-up. The aggregate counters are read after it, so they count the prompts only.
    llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in prompts[0][:8]])],
                 SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    before = spec_counters(llm)
    results = []
    # One prompt at a time, as this engine decodes: tok/s is then single-stream latency, not batch throughput.
    for ids in prompts:
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in ids])], params, use_tqdm=False)[0].outputs[0]
        seconds = time.perf_counter() - t0
        spec = out.spec_decode_metrics.to_dict() if getattr(out, "spec_decode_metrics", None) is not None else None
        results.append({"token_ids": list(out.token_ids), "seconds": seconds, "finish_reason": out.finish_reason,
                        "spec_decode": spec})
    tokens = sum(len(r["token_ids"]) for r in results)
    seconds = sum(r["seconds"] for r in results)
    summary = {"prompts": len(results), "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds}
    # The engine's aggregate counters over the prompts (`LLM.get_metrics`, the server's /metrics).
    metrics = {name: delta(value, before.get(name)) for name, value in spec_counters(llm).items()}
    if extra:
        # tau as this engine counts it: tokens committed per verify cycle (accepted drafts + 1),
        # from the per-request records and from the aggregate counters.
        steps = sum(r["spec_decode"]["num_spec_steps"] for r in results)
        summary["tau"] = 1 + sum(r["spec_decode"]["num_accepted_draft_tokens"] for r in results) / max(steps, 1)
        drafts = metrics.get("vllm:spec_decode_num_drafts") or 0
        summary["tau_counters"] = 1 + (metrics.get("vllm:spec_decode_num_accepted_tokens") or 0) / drafts if drafts else None
    result = json.dumps({"vllm": vllm.__version__, "torch": torch.__version__, "dtype": args.dtype,
                         "drafter": args.drafter, "load_s": load_s, "summary": summary, "outputs": results, "spec_decode_totals": metrics})
    if args.out:
        with open(args.out, "w") as f:
            f.write(result + "\n")
    else:
        print(result)
    print(json.dumps({"drafter": args.drafter, **summary}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
