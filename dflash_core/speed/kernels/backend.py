"""Which implementation the kernels run: Triton or the PyTorch references, from `DFLASH_KERNELS`.

See the package docstring for the modes. Kept apart from the kernels so that they can ask whether
Triton runs interpreted without importing the package that dispatches to them.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from ...errors import DFlashError

MODES = ("auto", "triton", "torch")


class KernelUnavailableError(DFlashError):
    """Triton kernels were forced (DFLASH_KERNELS=triton) where they cannot run."""


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_imported_for_interpreter() -> bool:
    """Whether the imported triton runs its own library (tl.sum, ...) in the interpreter.

    Triton decides that when it is first imported, so TRITON_INTERPRET=1 set afterwards is not
    enough for kernels on CPU tensors.
    """
    import triton.language as tl

    return type(tl.sum).__name__ == "InterpretedFunction"


def mode() -> str:
    value = os.environ.get("DFLASH_KERNELS", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise KernelUnavailableError(f"DFLASH_KERNELS must be one of {MODES}, got {value!r}")
    return value


def use_triton(device: torch.device | str) -> bool:
    """Whether the kernels for tensors on `device` should be the Triton ones."""
    device = torch.device(device)
    chosen = mode()
    if chosen == "torch":
        return False
    if chosen == "auto":
        return device.type == "cuda" and triton_available()
    if not triton_available():
        raise KernelUnavailableError("DFLASH_KERNELS=triton but the triton package is not installed")
    if device.type != "cuda" and not interpreting():
        raise KernelUnavailableError(
            f"DFLASH_KERNELS=triton on {device.type} tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
            "(slow; meant for tests), or use DFLASH_KERNELS=auto to run the PyTorch references on CPU"
        )
    if device.type != "cuda" and not triton_imported_for_interpreter():
        raise KernelUnavailableError(
            "TRITON_INTERPRET=1 was set after triton had been imported; set it before the first import of triton"
        )
    return True
