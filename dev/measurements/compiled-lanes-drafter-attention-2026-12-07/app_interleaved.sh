#!/usr/bin/env bash
# The app's four examples on two servers at once, compiled lanes (port 7861) and --no-compile
# (port 7862), raced in turn, one server at a time, for 3 passes, so both see the same machine
# state; then the tok/s of each lane, example by example, pass by pass, and compiled over eager
# (docs/benchmarks.md, "One trace for every length"). Run from anywhere; output in app-interleaved/,
# or in the folder given as the first argument (relative to the repository); arguments after it go
# to every race (dev/scripts/race_examples.py: `--lanes tree` races the tree lane too).
set -u
cd "$(dirname "$0")/../../.."
out=${1:-dev/measurements/compiled-lanes-drafter-attention-2026-12-07/app-interleaved}; mkdir -p "$out"
.venv/bin/python app.py --port 7861 > "$out/app-compiled.log" 2>&1 & compiled=$!
.venv/bin/python app.py --port 7862 --no-compile > "$out/app-eager.log" 2>&1 & eager=$!
for port in 7861 7862; do until curl -s -o /dev/null "http://127.0.0.1:$port/"; do sleep 1; done; done
extra=("${@:2}")
race() {  # race NAME PORT PASS [args...]
  .venv/bin/python dev/scripts/race_examples.py --url "http://127.0.0.1:$2/" --pair smollm2-135m --block-size 4 \
    "${extra[@]}" "${@:4}" > "$out/examples-$1-$3.txt" 2>&1
}
race compiled 7861 0 --wait-compiled 1500  # waits for the compiled lanes; not counted
for pass in 1 2 3; do
  race compiled 7861 "$pass"
  race eager 7862 "$pass"
done
kill -TERM $compiled $eager; wait
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {name: [json.loads(Path(out, f"examples-{name}-{p}.txt").read_text().splitlines()[-1])["rows"] for p in (1, 2, 3)]
        for name in ("compiled", "eager")}
def tok_s(row, lane):
    return row[f"{lane}_tok_s"] if lane in ("plain", "dflash") else row["lanes"][lane]["tok_s"]
for i, row in enumerate(rows["eager"][0]):
    for lane in ("plain", "dflash", *row.get("lanes", {})):
        c = [tok_s(r[i], lane) for r in rows["compiled"]]
        e = [tok_s(r[i], lane) for r in rows["eager"]]
        print(f"{row['prompt'][:30]:32}{lane:7} compiled {c}  eager {e}  ratio {sum(c) / sum(e):.2f}x")
PY
