"""vLLM as a benchmark peer: the same prompt ids decoded by vLLM plain and vLLM DFlash, in vLLM's own venv.

vLLM pins its own torch and transformers, so it lives in a separate venv (`bash scripts/setup.sh
--vllm` makes `.venv-vllm`; `$DFLASH_VLLM_VENV` names another). This module never imports vLLM: it
runs `scripts/vllm_generate.py` with that venv's python in a subprocess (`venv_peer.py`), one process
per method, and reads back its JSON (token ids, seconds per prompt, vLLM's per-request and aggregate
speculative-decoding metrics). `python -m dflash_core.bench --peer vllm` puts the results beside
this engine's rows; `tests/test_vllm.py` checks its outputs against this engine's.
"""

from __future__ import annotations

from pathlib import Path

from .venv_peer import ROOT, PeerUnavailable, PeerVenv, clean_env

GENERATE_SCRIPT = ROOT / "scripts" / "vllm_generate.py"
VENV_VARIABLE = "DFLASH_VLLM_VENV"
TIMEOUT_S = 1800  # one method's start-up (torch.compile: up to 200 s here) and every prompt


class VllmUnavailable(PeerUnavailable):
    """No vLLM venv to run the peer in, or vLLM failed in it."""


VLLM = PeerVenv("vLLM", VENV_VARIABLE, ".venv-vllm", "--vllm", VllmUnavailable)


def vllm_venv() -> Path:
    """The venv vLLM runs in: `$DFLASH_VLLM_VENV`, else `.venv-vllm` in the repository root."""
    return VLLM.venv()


def vllm_python() -> Path:
    """That venv's python; a `VllmUnavailable` that says how to make it where there is none."""
    return VLLM.python()


def subprocess_env(threads: int | None, compile_cache: bool = True) -> dict[str, str]:
    """This process's environment, less what belongs to it alone, plus vLLM's CPU settings
    (and, without `compile_cache`, vLLM's torch.compile cache switched off)."""
    env = clean_env()
    if not compile_cache:
        env["VLLM_DISABLE_COMPILE_CACHE"] = "1"
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
                  workdir: str | Path | None = None, compile_cache: bool = True) -> dict:
    """vLLM's greedy decoding of `prompts` (token ids, already through the chat template), one at a
    time: plain, or DFlash with `drafter` drafting `num_speculative_tokens` per cycle.

    Returns `scripts/vllm_generate.py`'s JSON: "outputs" (per prompt: token_ids, seconds,
    spec_decode), "summary" (tok_per_s, and for DFlash tau from the per-request records and
    tau_counters from the aggregate counters), "spec_decode_totals", "load_s", "vllm".
    eager: skip torch.compile (starts in about a third of the time; for correctness, not timing).
    compile_cache: False compiles afresh rather than loading vLLM's torch.compile cache.
    """
    args = ["--target", str(target_dir), "--max-tokens", str(max_new_tokens), "--dtype", dtype,
            "--max-model-len", str(max_model_len)]
    if threads:
        args += ["--threads", str(threads)]
    if drafter is not None:
        args += ["--drafter", str(drafter)]
        if num_speculative_tokens is not None:
            args += ["--num-speculative-tokens", str(num_speculative_tokens)]
    if eager:
        args.append("--eager")
    return VLLM.run(GENERATE_SCRIPT, prompts, args, subprocess_env(threads, compile_cache), TIMEOUT_S, workdir)
