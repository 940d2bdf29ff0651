#!/usr/bin/env bash
# The field in one run on the AMX class (Intel Xeon): this engine eager and with --compile, at 1 and
# 2 threads, against transformers, z-lab's reference and vLLM; the target in bfloat16 as dtype auto
# picks on this CPU (batch-invariant here; the peers run bf16 too). Run from the repo root after
# `bash scripts/setup.sh --dev --vllm --reference` (each its own call); output here, or in the folder
# given as the first argument.
set -u
out=${1:-dev/measurements/field-amx-2026-12-07}; mkdir -p "$out"
common=(--target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash --dtype bfloat16
        --max-new-tokens 128 --prompt-set natural --num-prompts 4 --block-sizes 4
        --no-peers --peer transformers --peer reference --peer vllm)
export DFLASH_VLLM_VENV=$PWD/.venv-vllm
for threads in 1 2; do
  for path in eager compile; do
    name=$path-${threads}thread
    flag=(); [ $path = compile ] && flag=(--compile)
    { date -u; uptime; grep -o -w 'avx2\|avx512_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $out/$name.txt
    .venv/bin/python -m dflash_core.bench "${common[@]}" --threads $threads "${flag[@]}" >> $out/$name.txt 2> $out/$name.err
    { date -u; uptime; } >> $out/$name.txt
    grep '^{' $out/$name.txt > $out/$name.json
  done
done
