"""Whether Triton's interpreter can run the project's kernels here (CPU machines run them only there)."""

from __future__ import annotations

from importlib import metadata

import torch


def interpreter_skip_reason() -> str | None:
    """Why the interpreted kernels cannot be tested here, or None when they can.

    Triton 3.6's interpreter (the GPU image's release) fails on the kernels with "TypeError: only
    0-dimensional arrays can be converted to Python scalars"; 3.7 and later run them. On CUDA the
    kernels are compiled, so this does not apply there.
    """
    if torch.cuda.is_available():
        return None
    try:
        version = tuple(int(p) for p in metadata.version("triton").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return None  # the tests that need triton skip on their own
    if version < (3, 7):
        return f"triton {metadata.version('triton')}'s interpreter cannot run these kernels on CPU (3.7+ can)"
    return None
