#!/usr/bin/env bash
# The field on the AVX-512 class: 2 threads with --compile (template GEMMs), then 1 thread without
# --compile (the eager steps), every peer; run from the repo root. The JSON line each run prints last
# is kept beside its table: grep '^{' X.txt > X.json
set -u
out=dev/measurements/field-avx512-night-2026-12-06
export DFLASH_VLLM_VENV=$PWD/.venv-vllm
common=(--target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash --dtype float32
        --max-new-tokens 128 --prompt-set natural --num-prompts 4 --block-sizes 4
        --no-peers --peer transformers --peer reference --peer vllm)
{ date -u; uptime; } > $out/template-2threads.txt
.venv/bin/python -m dflash_core.bench "${common[@]}" --threads 2 --compile >> $out/template-2threads.txt 2> $out/template-2threads.err
{ date -u; uptime; } >> $out/template-2threads.txt
grep '^{' $out/template-2threads.txt > $out/template-2threads.json
{ date -u; uptime; } > $out/eager-1thread.txt
.venv/bin/python -m dflash_core.bench "${common[@]}" --threads 1 >> $out/eager-1thread.txt 2> $out/eager-1thread.err
{ date -u; uptime; } >> $out/eager-1thread.txt
grep '^{' $out/eager-1thread.txt > $out/eager-1thread.json
