#!/bin/bash
# Issue 56's equal-budget controls: four runs at once, one thread each, the same wall-clock budget.
cd "$(dirname "$0")/../../.."  # the repository root
N=${N:-30}
COMMON="--target default:smollm2 --data assets/data/smollm2-135m-instruct --soft-labels 8 --soft-weight 0.5 \
  --anchors-per-seq 256 --max-len 512 --grad-accum 4 --walk-weight 2 --heldout-frac 0.03 --eval-every 50 \
  --eval-seqs 32 --patience 100 --save-every 25 --feature-cache-gb 0 --time-budget $N --threads 1 --no-progress --log-every 5"
SCRATCH="--shards 132: --init-from-target --layers 3 --block-size 4 --draft-vocab 8192 --mask-token-id 16 --lr 6e-4 --warmup 0.03"
WARM="--shards 132: --init-from assets/drafters/smollm2-135m-instruct-dflash --lr 1e-4 --warmup 0.05"
run() { name=$1; shift; OMP_NUM_THREADS=1 nohup .venv/bin/python -m dflash_core.training.train $COMMON "$@" --out runs/c56/$name > runs/c56/$name.log 2>&1 & }
run kv-scratch $SCRATCH --context-fusion kv
run fusion-scratch $SCRATCH --context-fusion input
run dflash-continued $WARM
run dflash2-warm $WARM --dflash2 --selector-rank 32 --selector-top-k 16
