#!/usr/bin/env bash
# A first launch of the app on a machine that has compiled nothing: an empty project cache folder
# (the converted default target linked in, so only compiling is measured) with empty inductor and
# saved-step caches. Prints the seconds from `python app.py` to the page answering, to DFlash and
# plain decoding running compiled, and to all lane steps compiled, then races the four examples.
# Usage: cold.sh REPOSITORY LABEL OUT   (REPOSITORY: a checkout with .venv, e.g. a worktree of an
# older commit with this checkout's .venv linked in; run from this repository's root).
set -u
repo=$(cd "$1" && pwd); label=$2; out=$(mkdir -p "$3" && cd "$3" && pwd)
here=$(pwd)
cache=$(mktemp -d /tmp/cold-cache.XXXX)
ln -s "${DFLASH_CACHE:-$HOME/.cache/dflash-studio}/smollm2-135m-instruct" "$cache/smollm2-135m-instruct"
start=$(date +%s.%N)
(cd "$repo" && DFLASH_CACHE=$cache TORCHINDUCTOR_CACHE_DIR=$cache/inductor .venv/bin/python app.py --port 7861) \
  > "$out/app-$label.log" 2>&1 & app=$!
until curl -s -o /dev/null "http://127.0.0.1:7861/"; do sleep 1; done
up=$(date +%s.%N)
"$here/.venv/bin/python" "$here/dev/scripts/race_examples.py" --url "http://127.0.0.1:7861/" --pair smollm2-135m \
  --block-size 4 --wait-compiled 1500 > "$out/examples-$label.txt" 2>&1
echo "$label ($(git -C "$repo" rev-parse --short HEAD)): page $(awk "BEGIN{printf \"%.1f\", $up - $start}") s after app.py" \
     "started; after it: $(grep -m1 'run compiled already' "$out/examples-$label.txt" | cut -d: -f1), all" \
     "$(grep -m1 'after this script started' "$out/examples-$label.txt" | sed 's/ after this script started//' | cut -c1-80)" \
  | tee -a "$out/launches.txt"
kill -TERM $app; wait $app
rm -rf "$cache"
