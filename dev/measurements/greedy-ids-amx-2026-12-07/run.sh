#!/usr/bin/env bash
# One compiled bench (chain and tree of 8, bf16, 1 thread) at the checkout as it is, into <out>.
# From the repository root: bash dev/measurements/greedy-ids-amx-2026-12-07/run.sh <out>
set -euo pipefail
{
  date; uptime; git rev-parse --short HEAD; git status --short | grep -v '^??' | head -8
  grep -o -w 'avx2\|avx512_bf16\|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  python -m dflash_core.bench --dtype bfloat16 --compile --tree-budget 8 --num-prompts 4 --max-new-tokens 128 --threads 1
  date; uptime
} > "${1:?usage: run.sh <out>}" 2>&1
