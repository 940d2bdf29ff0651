#!/usr/bin/env bash
# The app's four examples, eager and compiled lanes, after the grouped-query attention change
# (dflash_core/models/attention.py). Three launches one after another on port 7861: the first
# compiles the new graphs into inductor's cache, the second is timed to "compiled" and races the
# examples compiled, the third races them on eager steps (--no-compile). Usage: run.sh FOLDER.
# app-positions-256 ran at 880188d (POSITIONS = 256 in app/pairs/compiled.py); app-positions-512 on
# the same commit with POSITIONS set to 512, a change not kept (docs/benchmarks.md); kernel/app-positions-1024
# at 26ec543 (the masked-attention kernel, POSITIONS = 1024).
set -u
cd "$(dirname "$0")/../../.."
out=dev/measurements/compiled-lanes-grouped-2026-12-06/${1:?a folder name}; mkdir -p "$out"
launch() {  # launch NAME [app args...]: start the app, race the examples, stop the app
  local name=$1; shift
  .venv/bin/python app.py --port 7861 "$@" > "$out/app-$name.log" 2>&1 &
  local pid=$!
  until curl -s -o /dev/null http://127.0.0.1:7861/; do sleep 1; done
  echo "$name: server up at $(date -u +%T)" >> "$out/timeline.txt"
  local wait=(); [[ " $* " == *" --no-compile "* ]] || wait=(--wait-compiled 1500)
  .venv/bin/python dev/scripts/race_examples.py --url http://127.0.0.1:7861/ --pair smollm2-135m \
    --block-size 4 "${wait[@]}" > "$out/examples-$name.txt" 2>&1
  echo "$name: raced by $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/timeline.txt"
  kill -TERM $pid; wait $pid
}
launch first
launch second
launch eager --no-compile
