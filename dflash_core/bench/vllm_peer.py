"""vLLM as a benchmark peer: the same prompt ids decoded by vLLM plain and vLLM DFlash, in vLLM's own venv.

vLLM pins its own torch and transformers, so it lives in a separate venv (`bash scripts/setup.sh
--vllm` makes `.venv-vllm`; `$DFLASH_VLLM_VENV` names another). This module never imports vLLM: it
runs `scripts/vllm_generate.py` with that venv's python in a subprocess, one process per method,
and reads back its JSON (token ids, seconds per prompt, vLLM's per-request and aggregate
speculative-decoding metrics). `python -m dflash_core.bench --peer vllm` puts the results beside
this engine's rows; `tests/test_vllm.py` checks its outputs against this engine's.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import DFlashError

ROOT = Path(__file__).resolve().parents[2]
GENERATE_SCRIPT = ROOT / "scripts" / "vllm_generate.py"
VENV_VARIABLE = "DFLASH_VLLM_VENV"
TIMEOUT_S = 1800  # one method's start-up (torch.compile: up to 200 s here) and every prompt


class VllmUnavailable(DFlashError):
    """No vLLM venv to run the peer in, or vLLM failed in it."""


def vllm_venv() -> Path:
    """The venv vLLM runs in: `$DFLASH_VLLM_VENV`, else `.venv-vllm` in the repository root."""
    return Path(os.environ.get(VENV_VARIABLE) or ROOT / ".venv-vllm").expanduser()


def vllm_python() -> Path:
    """That venv's python; a `VllmUnavailable` that says how to make it where there is none."""
    python = vllm_venv() / "bin" / "python"
    if not python.exists():
        raise VllmUnavailable(
            f"vLLM is not set up: {python} does not exist. vLLM runs in a venv of its own: "
            f"`bash scripts/setup.sh --vllm` makes .venv-vllm, or set {VENV_VARIABLE} to a venv with vLLM."
        )
    return python


def subprocess_env(threads: int | None) -> dict[str, str]:
    """This process's environment, less what belongs to it alone, plus vLLM's CPU settings."""
    # This venv's import path and the tests' Triton interpreter mode would leak into vLLM's.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    if threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
    # vLLM's CPU speculative decoding warns that it loses speed without Intel OpenMP preloaded;
    # vllm-cpu ships the library.
    iomp = vllm_venv() / "lib" / "libiomp5.so"
    if iomp.is_file() and "LD_PRELOAD" not in env:
        env["LD_PRELOAD"] = str(iomp)
    return env


def vllm_generate(target_dir: str, prompts: list[list[int]], *, drafter: str | None = None,
                  num_speculative_tokens: int | None = None, max_new_tokens: int = 128, dtype: str = "float32",
                  threads: int | None = None, eager: bool = False, max_model_len: int = 2048,
                  workdir: str | Path | None = None) -> dict:
    """vLLM's greedy decoding of `prompts` (token ids, already through the chat template), one at a
    time: plain, or DFlash with `drafter` drafting `num_speculative_tokens` per cycle.

    Returns `scripts/vllm_generate.py`'s JSON: "outputs" (per prompt: token_ids, seconds,
    spec_decode), "summary" (tok_per_s, and for DFlash tau from the per-request records and
    tau_counters from the aggregate counters), "spec_decode_totals", "load_s", "vllm".
    eager: skip torch.compile (starts in about a third of the time; for correctness, not timing).
    """
    python = vllm_python()
    with tempfile.TemporaryDirectory(prefix="dflash-vllm-", dir=workdir) as tmp:
        prompts_file, out, log = Path(tmp, "prompts.json"), Path(tmp, "vllm.json"), Path(tmp, "vllm.log")
        prompts_file.write_text(json.dumps([[int(t) for t in ids] for ids in prompts]))
        cmd = [str(python), str(GENERATE_SCRIPT), "--target", str(target_dir), "--prompts", str(prompts_file),
               "--max-tokens", str(max_new_tokens), "--dtype", dtype, "--max-model-len", str(max_model_len),
               "--out", str(out)]
        if threads:
            cmd += ["--threads", str(threads)]
        if drafter is not None:
            cmd += ["--drafter", str(drafter)]
            if num_speculative_tokens is not None:
                cmd += ["--num-speculative-tokens", str(num_speculative_tokens)]
        if eager:
            cmd.append("--eager")
        with open(log, "w") as f:
            try:
                done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=subprocess_env(threads),
                                      timeout=TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                raise VllmUnavailable(f"vLLM did not finish within {TIMEOUT_S} s: {' '.join(cmd)}") from None
        if done.returncode != 0 or not out.exists():
            raise VllmUnavailable(f"vLLM failed (exit {done.returncode}): {' '.join(cmd)}\n{log_tail(log.read_text())}")
        return json.loads(out.read_text())


def log_tail(text: str, lines: int = 40, width: int = 600) -> str:
    """The end of a vLLM log, each line cut to `width`: its errors name the cause at a line's start
    (an unsupported architecture comes before the list of every supported one)."""
    return "\n".join(line if len(line) <= width else line[:width] + " ..." for line in text.splitlines()[-lines:])
