"""The CPU rows kernel: float32 linears of 1 to MAX_ROWS rows, built from `cpu_rows.cpp` on first use.

A plain decoding step is a one-row linear per weight and a verify or draft step a block of a few
rows; both are bound by reading the weights. MKL's and oneDNN's few-row paths pay more for every
row after the first, while this kernel reads each weight once per call (figures: docs/benchmarks.md,
"The CPU rows kernel"). Each output row is bitwise the same whatever the number of rows beside it,
so a verify's linears compute exactly what one-token steps would.

The kernel needs an x86 CPU with AVX2 and FMA and a C++ compiler: `torch.utils.cpp_extension`
compiles it once into its cache (`TORCH_EXTENSIONS_DIR`, by default under
~/.cache/torch_extensions) and later processes load it from there. Where it cannot build or run,
`available()` says False with one `FallbackWarning`, and `cpu_linear.py` keeps the libraries' paths.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

from ..fallbacks import notice

MAX_ROWS = 16  # past a block, oneDNN's packed GEMM is the faster (a prefill)
SOURCE = Path(__file__).with_name("cpu_rows.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]  # OpenMP: at::parallel_for splits the outputs across threads


def unsupported_reason() -> str | None:
    """Why this machine cannot run the kernel, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"it is written for x86 CPUs, and this one is {platform.machine()}"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"it needs AVX2 and FMA, and PyTorch reports {capability} for this CPU"
    return None


def _shape(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@functools.cache
def available() -> bool:
    """Whether `rows_linear` runs here: builds (or loads the built) kernel the first time it is asked."""
    reason = unsupported_reason()
    if reason is None:
        try:
            from torch.utils.cpp_extension import load

            load(name="dflash_cpu_rows", sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                 is_python_module=False)
        except Exception as exc:  # noqa: BLE001 - a missing compiler or ninja: the libraries' paths still run
            reason = f"it did not build ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        else:
            torch.library.register_fake("dflash_cpu::rows_linear", _shape)  # what torch.compile traces
            return True
    notice(f"the CPU rows kernel is off, {reason}; few-row linears run on oneDNN or MKL")
    return False


def eligible(weight: torch.Tensor) -> bool:
    """Whether a linear with this weight can take the kernel (float32 on the CPU, inner size a multiple of 8)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.shape[-1] % 8 == 0


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` through the kernel (`available()` must have said True)."""
    return torch.ops.dflash_cpu.rows_linear(x, weight, bias)
