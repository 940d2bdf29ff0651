#!/usr/bin/env bash
# One-call GPU check for issue 4 (fused kernels + synthetic benchmark), for a session lent an H200.
#
# Runs, on CUDA and without TRITON_INTERPRET: the kernel tests (compiled Triton vs PyTorch
# references), golden parity of the engine on CUDA with the kernels on (auto) and off, and the
# synthetic benchmark for qwen3-8b and qwen3-4b in bf16. Output goes to $OUT/gpu_check.log (and
# the benchmark figures to $OUT/bench_synthetic.json) when OUT is set, else to ./gpu_check_out/.
# Needs a Python with CUDA torch, transformers and triton: $PYTHON, else .venv/bin/python, else python3.
# Budget: about 3-5 minutes (model init and Triton compiles included); hard stop per step below.
#
#   run(command="bash scripts/gpu_check.sh", timeout_s=540)
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
PY="${PYTHON:-}"
[ -z "$PY" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
[ -z "$PY" ] && PY=python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET DFLASH_KERNELS
# The golden traces live outside the repo (../shared/golden here); on the device machine they are
# found when the checkout has shared/golden (copy or link them there before the run).
if [ -z "${DFLASH_GOLDEN:-}" ]; then
  for g in shared/golden ../shared/golden; do [ -d "$g/zlab-tiny-a" ] && export DFLASH_GOLDEN="$PWD/$g" && break; done
fi
echo "golden traces: ${DFLASH_GOLDEN:-NOT FOUND (golden steps will fail)}" | tee -a "$LOG"
status=0

step() {  # step NAME SECONDS CMD...: run with a time limit, log it, remember failures
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date -u +%H:%M:%S))" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc" | tee -a "$LOG"
  [ "$rc" -ne 0 ] && status=1
  return 0
}

step "environment" 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
  $PY -c 'import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__, torch.cuda.get_device_name())'; \
  $PY -c 'import flash_attn; print(\"flash_attn\", flash_attn.__version__)' 2>/dev/null || echo 'flash_attn not installed'"

step "kernel tests on CUDA" 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernels.py

step "golden parity on CUDA (fp32, kernels auto vs torch)" 120 "$PY" - <<'PY'
import json, os, sys
from pathlib import Path
import torch
from dflash_core import DFlashDrafter, Target, run
root = Path(os.environ.get("DFLASH_GOLDEN", "shared/golden"))
d = root / "zlab-tiny-a"
exp = json.loads((d / "expected.json").read_text())
target = Target.from_pretrained(d / "target", device="cuda")
drafter = DFlashDrafter.from_pretrained(d / "drafter", device="cuda")
bad = 0
for mode in ("auto", "torch"):
    os.environ["DFLASH_KERNELS"] = mode
    ok = mismatched = 0
    for p in exp["prompts"]:
        for r in p["runs"]:
            s = run(target, p["prompt_ids"], drafter, max_new_tokens=exp["max_new_tokens"], block_size=r["block_size"])
            same = list(s.output_ids) == r["output_ids"] and [b.accepted + 1 for b in s.blocks] == r["acceptance_lengths"]
            ok += same; mismatched += not same
    print(f"kernels={mode}: {ok} runs equal to the CPU golden traces, {mismatched} differ")
    bad += mismatched
sys.exit(1 if bad else 0)
PY

for shape in qwen3-8b qwen3-4b; do
  step "synthetic benchmark $shape bf16" 150 "$PY" - "$shape" "$OUT" <<'PY'
import json, sys
from pathlib import Path
import torch
from dflash_core.bench_cycle import print_table, run_synthetic
shape, out = sys.argv[1], Path(sys.argv[2])
result = run_synthetic(shape, "cuda", "bf16", iters=30)
print_table(result)
path = out / "bench_synthetic.json"
figures = json.loads(path.read_text()) if path.exists() else {}
figures[shape] = {k: v for k, v in result.items()}
path.write_text(json.dumps(figures, indent=2, default=str) + "\n")
PY
done

echo "=== done: status=$status" | tee -a "$LOG"
exit $status
