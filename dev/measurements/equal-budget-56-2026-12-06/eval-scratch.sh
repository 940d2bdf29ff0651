#!/bin/bash
# Issue 56's controls raced with bench --methods: both prompt sets, one thread each, all at once.
cd "$(dirname "$0")/../../.."  # the repository root
COMMON="--target default:smollm2 --dtype float32 --max-new-tokens 64 --num-prompts 2 --threads 1"
for set in natural generated; do
  OMP_NUM_THREADS=1 nohup .venv/bin/python -m dflash_core.bench --methods plain,dflash,fusion $COMMON --prompt-set $set \
    --drafter runs/c56/kv-scratch --fusion-drafter runs/c56/fusion-scratch \
    --json /dev/null > runs/c56/methods-scratch-$set.log 2>&1 &
done
