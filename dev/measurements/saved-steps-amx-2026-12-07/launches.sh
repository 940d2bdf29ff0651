#!/usr/bin/env bash
# Two launches of the app on the offline default pair, one after the other: each time, seconds from
# `python app.py` to the status line's "Lane steps: compiled", then the four examples raced once
# (greedy, 128 new tokens, block 4) on the compiled lanes. The first launch starts from an empty
# folder of saved steps (`dflash_core/speed/saved_steps.py`), the second loads what the first saved.
# Run from anywhere; output in the folder given (relative to the repository), default launches/.
set -u
cd "$(dirname "$0")/../../.."
out=${1:-dev/measurements/saved-steps-amx-2026-12-07/launches}; mkdir -p "$out"
steps="${DFLASH_CACHE:-$HOME/.cache/dflash-studio}/compiled-steps"
rm -rf "$steps"
for launch in 1 2; do
  start=$(date +%s.%N)
  .venv/bin/python app.py --port 7861 > "$out/app-$launch.log" 2>&1 & app=$!
  until curl -s -o /dev/null "http://127.0.0.1:7861/"; do sleep 1; done
  up=$(date +%s.%N)
  .venv/bin/python dev/scripts/race_examples.py --url "http://127.0.0.1:7861/" --pair smollm2-135m --block-size 4 \
    --wait-compiled 1500 > "$out/examples-$launch.txt" 2>&1
  ready=$(grep -m1 "after this script started" "$out/examples-$launch.txt" | sed 's/ s after.*//')
  echo "launch $launch: page up $(awk "BEGIN{printf \"%.1f\", $up - $start}") s after app.py started, lanes compiled" \
       "$ready s after that; $(find "$steps" -name "*.step" | wc -l) saved steps, $(du -sh "$steps" | cut -f1)" | tee -a "$out/launches.txt"
  kill -TERM $app; wait $app
done
