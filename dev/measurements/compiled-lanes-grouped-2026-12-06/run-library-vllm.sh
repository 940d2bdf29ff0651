#!/usr/bin/env bash
# After the grouped-query attention change: the path the app's lanes take by default (--compile with library GEMMs) against vLLM, 1 thread; run from the repo root.
set -u
out=dev/measurements/compiled-lanes-grouped-2026-12-06
export DFLASH_VLLM_VENV=$PWD/.venv-vllm
{ date -u; uptime; } > $out/library-vllm.txt
DFLASH_COMPILE_GEMMS=library .venv/bin/python -m dflash_core.bench --target default:smollm2 \
  --drafter assets/drafters/smollm2-135m-instruct-dflash --dtype float32 --max-new-tokens 128 --prompt-set natural \
  --num-prompts 4 --block-sizes 4 --threads 1 --no-peers --peer vllm --compile \
  >> $out/library-vllm.txt 2> $out/library-vllm.err
{ date -u; uptime; } >> $out/library-vllm.txt
grep '^{' $out/library-vllm.txt > $out/library-vllm.json
