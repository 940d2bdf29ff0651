"""scripts/vllm_generate.py in one process (no engine-core subprocess), with vLLM's CPU `rms_norm`
run once per row when its weight is stacked [layers, head_dim] (first argument `patch`), or as
vLLM ships it (`shipped`); prints how many stacked-weight calls the run made. Run from the
repository root with the vLLM venv's python; the remaining arguments go to vllm_generate.py."""
import atexit
import os
import runpy
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the patch below must reach the engine core
from vllm import _custom_ops as ops  # noqa: E402

PATCH = sys.argv.pop(1) == "patch"
calls = [0]
original = ops.rms_norm


def rms_norm(out, x, weight, eps):
    if weight is not None and weight.dim() == 2:
        calls[0] += 1
        if PATCH:
            for i in range(weight.shape[0]):
                original(out[i], x[i], weight[i], eps)
            return
    original(out, x, weight, eps)


ops.rms_norm = rms_norm
atexit.register(lambda: print(f"stacked-weight rms_norm calls: {calls[0]} (patched: {PATCH})", file=sys.stderr))
sys.argv[0] = "scripts/vllm_generate.py"
runpy.run_path(sys.argv[0], run_name="__main__")
