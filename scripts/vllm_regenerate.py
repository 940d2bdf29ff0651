"""Greedy answers to many prompts through vLLM's offline batch engine, as JSON lines while it runs.

Runs inside the separate `.venv-vllm` (`bash scripts/setup.sh --vllm`), never in the app's venv: it
imports vLLM and nothing of this project. `python -m dflash_core.training regenerate` with
`engine = "vllm"` starts it in a subprocess and reads its lines as they come
(`dflash_core/training/regenerate.py`). Unlike `vllm_generate.py`, which times one prompt at a time
as this engine decodes, it hands vLLM a batch at a time and lets it schedule them together.

    .venv-vllm/bin/python scripts/vllm_regenerate.py --target ~/.cache/dflash-studio/smollm2-135m-instruct \\
        --prompts prompts.json --out answers.jsonl --max-tokens 256 --batch-size 64

`prompts.json` is a JSON list of prompt token-id lists (already through the chat template); each
line of `--out` is `{"i": index, "token_ids": [...], "finish_reason": ...}`, appended per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model directory or Hub id")
    p.add_argument("--prompts", required=True, help="a .json list of prompt token-id lists")
    p.add_argument("--out", required=True, help="JSON lines, one per answered prompt, appended per batch")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64, help="prompts handed to vLLM per call (and its max_num_seqs)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=0, help="CPU only: bind vLLM's OpenMP threads to cores 0..N-1")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="CPU only: VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--eager", action="store_true",
                   help="enforce_eager: skip torch.compile (starts sooner, runs slower)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    with open(args.prompts) as f:
        prompts = json.load(f)
    # vLLM reads these when its engine starts, so they are set before it is imported.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    if args.threads:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}" if args.threads > 1 else "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    import torch

    # On CPU gpu_memory_utilization is the share of RAM vLLM may reserve: small, the machines are shared.
    # A GPU given to this job keeps vLLM's usual share for the KV cache.
    memory = 0.9 if torch.cuda.is_available() else 0.3
    llm = LLM(model=args.target, dtype=args.dtype, max_model_len=args.max_model_len, gpu_memory_utilization=memory,
              max_num_seqs=args.batch_size, enforce_eager=args.eager, seed=0)
    print(f"[vllm_regenerate] engine ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    with open(args.out, "a") as out:
        for start in range(0, len(prompts), args.batch_size):
            batch = prompts[start : start + args.batch_size]
            results = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in batch], params,
                                   use_tqdm=False)
            for i, result in enumerate(results, start):
                answer = result.outputs[0]
                out.write(json.dumps({"i": i, "token_ids": list(answer.token_ids),
                                      "finish_reason": answer.finish_reason}) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
