#!/usr/bin/env bash
# The field in one run on the AVX-512 class, 1 thread, this engine with --compile (template GEMMs, the
# bench's default) and then with the path the app's lanes take by default (library GEMMs); run from the repo root.
set -u
out=dev/measurements/field-avx512-night-2026-12-06
common=(--target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash --dtype float32
        --max-new-tokens 128 --prompt-set natural --num-prompts 4 --block-sizes 4 --threads 1)
export DFLASH_VLLM_VENV=$PWD/.venv-vllm
{ date -u; uptime; grep -o -w 'avx2\|avx512_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $out/template.txt
.venv/bin/python -m dflash_core.bench "${common[@]}" --no-peers --peer transformers --peer reference --peer vllm --compile \
  >> $out/template.txt 2> $out/template.err
{ date -u; uptime; } >> $out/template.txt
{ date -u; uptime; } > $out/library.txt
DFLASH_COMPILE_GEMMS=library .venv/bin/python -m dflash_core.bench "${common[@]}" --no-peers --peer vllm --compile \
  >> $out/library.txt 2> $out/library.err
{ date -u; uptime; } >> $out/library.txt
# The JSON line each run prints last is kept beside its table: grep '^{' X.txt > X.json
