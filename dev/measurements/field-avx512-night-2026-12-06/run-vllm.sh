#!/usr/bin/env bash
# The same 1-thread field run with --compile (template GEMMs), after the vLLM retry compiles afresh;
# run from the repo root.
set -u
out=dev/measurements/field-avx512-night-2026-12-06
export DFLASH_VLLM_VENV=$PWD/.venv-vllm
{ date -u; uptime; } > $out/template-vllm.txt
.venv/bin/python -m dflash_core.bench --target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash \
  --dtype float32 --max-new-tokens 128 --prompt-set natural --num-prompts 4 --block-sizes 4 --threads 1 \
  --no-peers --peer transformers --peer reference --peer vllm --compile \
  >> $out/template-vllm.txt 2> $out/template-vllm.err
{ date -u; uptime; } >> $out/template-vllm.txt
# The JSON line it prints last is kept beside its table: grep '^{' X.txt > X.json
