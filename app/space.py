"""Running as a Hugging Face Space: ZeroGPU support, and the Space bundle made from this repository.

ZeroGPU (active only with the `spaces` package installed and `SPACES_ZERO_GPU` set, a no-op
elsewhere) attaches a GPU slice for the duration of each decorated call, which runs in a worker
process; `gpu_task` wraps the race's model work that way, with a duration computed from the
request (`race_seconds`), and `explain_gpu_errors` turns ZeroGPU's quota and busy errors into a
message that offers a recorded race instead.

`python -m app.space export DIR [--hardware zerogpu|cpu]` writes a folder that can be pushed to a
Space as it is (see `export`).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Iterator

import gradio as gr

# Nothing here imports torch at module level: app.py imports this module to decide whether
# `spaces` must be imported first, which ZeroGPU requires to happen before torch.

# Seconds per generated token of one side on a ZeroGPU slice (bfloat16, eager transformers); a
# race computes both sides, and the first call of a worker also pays CUDA start-up.
GPU_S_PER_TOKEN = {"qwen3-4b": 0.04, "qwen3-8b": 0.05}
GPU_S_PER_TOKEN_DEFAULT = 0.03
GPU_S_BASE = 10
GPU_S_MAX = 120  # ZeroGPU refuses longer requests from most visitors, and quota is counted in them

REPLAY_HINT = (
    "Meanwhile you can watch a recorded race: the Space ships race traces (assets/traces/) that the "
    "replay view plays back without a GPU."
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
    from .limits import SPACE_LIMITS, Limits

    return SPACE_LIMITS if on_space() or on_zerogpu() else Limits()


def race_seconds(pair_id: str, prompt_ids, max_new_tokens: int, *_args, **_kwargs) -> int:
    """GPU seconds to ask ZeroGPU for one race (called with the race function's own arguments)."""
    per_token = GPU_S_PER_TOKEN.get(pair_id, GPU_S_PER_TOKEN_DEFAULT)
    prefill = len(prompt_ids) / 2000  # a prefill runs thousands of tokens per second
    return min(GPU_S_MAX, math.ceil(GPU_S_BASE + prefill + 2 * int(max_new_tokens) * per_token))


def gpu_task(fn: Callable[..., Iterator], pairs=()) -> tuple[Callable[..., Iterator], bool]:
    """(the function to call for a race, whether it runs in this process).

    On ZeroGPU `fn` is wrapped in `spaces.GPU` with `race_seconds` as its duration; it then runs
    in a worker process, so it takes and yields only plain data. Elsewhere `fn` is returned as is.
    """
    if not on_zerogpu():
        return fn, True
    import spaces

    return spaces.GPU(duration=race_seconds)(fn), False


def explain_gpu_errors(stream: Iterator) -> Iterator:
    """Pass `stream` through; ZeroGPU's quota and busy errors become a message with a way out."""
    try:
        yield from stream
    except gr.Error as exc:
        title = str(getattr(exc, "title", "") or "")
        if not title.startswith("ZeroGPU"):
            raise
        raise gr.Error(f"{exc.message} {REPLAY_HINT}", title=title) from None
