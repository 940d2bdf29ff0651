#!/usr/bin/env bash
# Trees of 4 to 32 drafts on the bf16 (batch-invariant) default pair, eager and compiled, 1 thread.
# From the repository root: bash dev/measurements/trees-48-rows-amx-2026-12-07/run.sh <outdir>
set -euo pipefail
out=${1:?usage: run.sh <outdir>}
mkdir -p "$out"
for path in eager compile; do
  flag=$([ "$path" = compile ] && echo --compile || true)
  {
    date; uptime; git rev-parse --short HEAD; git status --short | head -5
    grep -o -w 'avx2\|avx512_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    python -m dflash_core.bench --dtype bfloat16 $flag --tree-budget 4,8,16,32 --num-prompts 4 --max-new-tokens 128 --threads 1
    date; uptime
  } > "$out/trees-bf16-$path.txt" 2>&1
done
