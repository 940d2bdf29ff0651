"""The CPU rows kernel: linears of a few rows (1 to MAX_ROWS; a batch-invariant model's trees, more),
built from `cpu_rows.cpp` on first use (with `cpu_attention.cpp`, the compiled steps' attention,
into the same extension).

A plain decoding step is a one-row linear per weight and a verify or draft step a block of a few
rows; both are bound by reading the weights. MKL's and oneDNN's few-row paths pay more for every
row after the first, while this kernel reads each weight once per call (figures: docs/benchmarks.md,
"The CPU rows kernel"). Each output row is bitwise the same whatever the number of rows beside it,
so a verify's linears compute exactly what one-token steps would.

It comes in four variants, chosen at run time by the CPU's features (`variants()`): `avx2` (AVX2
and FMA; float32), `avx512` (AVX-512 F/BW/VL; float32, and bfloat16 rows and weights widened to
float32 and summed there, then rounded once), `avx512_bf16` (AVX512-BF16 too; float32 as
`avx512`, bfloat16 through vdpbf16ps, which multiplies bfloat16 pairs into float32 sums at twice
the rate) and `amx` (AMX tiles; bfloat16 weights whose outputs are a multiple of 16 and inputs of
32, read from a copy laid out for the tiles, `pack`: a block of 16 rows costs about what one row
does, and one read of the weights serves up to 48 rows, a tree's verify). Each keeps the guarantee
above; their outputs differ from each other in the last bits.
`rows_linear` takes the last variant `variants()` names that takes the weight.

The kernel needs an x86 CPU with at least AVX2 and FMA and a C++ compiler: `torch.utils.cpp_extension`
compiles it once into its cache (`TORCH_EXTENSIONS_DIR`, by default ~/.cache/torch_extensions), in a
folder named by the sources, flags, torch and Python (`build_folder`), and later processes load it
from there. Where it cannot build or run,
`available()` says False with one `FallbackWarning`, and `cpu_linear.py` keeps the libraries' paths.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from pathlib import Path

import torch

from ..fallbacks import notice

# Past a chain's block, oneDNN's packed GEMM is the faster (a prefill); a batch-invariant model
# sends its longer blocks (trees) here too (`PackedLinear.rows_limit`), as exact rows cost more.
MAX_ROWS = 16
SOURCES = ("cpu_rows.cpp", "cpu_attention.cpp")
FILES = (*SOURCES, "cpu_avx2.h")  # what the build reads, beside this file
# No -m flags: each variant carries its own target attribute, so the one build runs on any x86-64
# CPU. No fast-math either: the sums must keep their written order. OpenMP: at::parallel_for splits
# the outputs (never a sum) across threads.
FLAGS = ["-O3", "-fopenmp"]
VARIANTS = ("avx2", "avx512", "avx512_bf16", "amx")
PACKED = ("amx",)  # variants that read a copy of the weight in their own layout (`pack`)


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


def build_folder(sources: Path = Path(__file__).parent) -> Path:
    """The kernel's build folder, with its files from `sources` copied in: named by their content,
    the flags and the torch and Python versions, so that every copy of the engine with the same
    sources (another clone, a Space bundle) loads one build. torch's builder rebuilds whenever a
    source's path changes, and keys a build by the sources alone, not the torch it links."""
    from torch.utils.cpp_extension import get_default_build_root

    contents = {name: (sources / name).read_bytes() for name in FILES}
    digest = hashlib.sha256(repr((torch.__version__, sys.version_info[:2], FLAGS)).encode())
    for name, data in contents.items():
        digest.update(name.encode() + b"\0" + data)
    folder = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / (
        f"dflash_cpu_kernels-{digest.hexdigest()[:16]}")
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        copy = folder / name
        # An identical copy stays untouched: a newer one would make the build look stale.
        if not copy.is_file() or copy.read_bytes() != data:
            partial = folder / f".{name}.{os.getpid()}"
            partial.write_bytes(data)
            partial.replace(copy)
    return folder


@functools.cache
def available() -> bool:
    """Whether `rows_linear` runs here: builds (or loads the built) kernel the first time it is asked."""
    reason = unsupported_reason()
    if reason is None:
        try:
            from torch.utils.cpp_extension import load

            folder = build_folder()
            load(name="dflash_cpu_kernels", sources=[str(folder / name) for name in SOURCES], extra_cflags=FLAGS,
                 extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=False)
        except Exception as exc:  # noqa: BLE001 - a missing compiler or ninja: the libraries' paths still run
            reason = f"it did not build ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        else:
            # What torch.compile traces.
            torch.library.register_fake("dflash_cpu::rows_linear", _shape)
            torch.library.register_fake("dflash_cpu::rows_linear_with", lambda x, w, b, variant: _shape(x, w, b))
            torch.library.register_fake("dflash_cpu::rows_linear_amx",
                                        lambda x, p, b: x.new_empty((*x.shape[:-1], p.shape[0] * p.shape[2])))
            torch.library.register_fake("dflash_cpu::masked_attention", lambda q, k, v, mask, scale: q.new_empty(q.shape))
            return True
    notice(f"the CPU rows kernel is off, {reason}; few-row linears run on oneDNN or MKL")
    return False


@functools.cache
def variants() -> tuple[str, ...]:
    """The variants this CPU runs, the one `rows_linear` takes last (none where the kernel is not available)."""
    return tuple(v for v in torch.ops.dflash_cpu.variants().split(",") if v) if available() else ()


def variant_missing(variant: str) -> str | None:
    """Why `variant` cannot run here (for tests that skip it), or None."""
    if variant not in VARIANTS:
        raise ValueError(f"the rows kernel's variants are {', '.join(VARIANTS)}, not {variant!r}")
    reason = unsupported_reason()
    if reason is None and not available():
        reason = "it did not build"
    if reason is None and variant not in variants():
        reason = f"this CPU lacks the {variant} variant's features (it runs {', '.join(variants()) or 'none'})"
    return reason


def variants_for(dtype: torch.dtype) -> tuple[str, ...]:
    """The variants here that take `dtype` and compute it their own way (for float32 `avx512_bf16`
    runs `avx512`'s code, so only `avx2` and `avx512`)."""
    own = ("avx2", "avx512") if dtype == torch.float32 else \
        ("avx512", "avx512_bf16", "amx") if dtype == torch.bfloat16 else ()
    return tuple(v for v in variants() if v in own)


def dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes the kernel takes here: bfloat16 too where an AVX-512 variant runs."""
    return (torch.float32, torch.bfloat16) if "avx512" in variants() else (torch.float32,)


def eligible(weight: torch.Tensor) -> bool:
    """Whether a linear with this weight can take the kernel (on the CPU, a dtype of `dtypes()`,
    inner size a multiple of 8)."""
    return weight.device.type == "cpu" and weight.dtype in dtypes() and weight.shape[-1] % 8 == 0


def takes(variant: str, weight: torch.Tensor) -> bool:
    """Whether `variant` computes linears with this (eligible) weight: its dtype, and for `amx`
    sizes of whole tiles (outputs a multiple of 16, inputs of 32)."""
    if variant not in variants_for(weight.dtype):
        return False
    return variant != "amx" or (weight.shape[0] % 16 == 0 and weight.shape[1] % 32 == 0)


def best_for(weight: torch.Tensor, preferred: str | None = None) -> str | None:
    """`preferred` if it takes this weight, else the last variant here that does (None: none does)."""
    if preferred is not None and takes(preferred, weight):
        return preferred
    return next((v for v in reversed(variants_for(weight.dtype)) if takes(v, weight)), None)


def pack(weight: torch.Tensor, variant: str) -> torch.Tensor | None:
    """The copy of `weight` that `variant` reads (None: it reads the weight itself)."""
    return torch.ops.dflash_cpu.amx_pack(weight.detach()) if variant in PACKED else None


def prepare(weight: torch.Tensor, variant: str | None = None) -> tuple[str | None, torch.Tensor | None]:
    """(`best_for(weight, variant)`, the copy of `weight` it reads): what `rows_linear` takes for it."""
    chosen = best_for(weight, variant)
    return chosen, pack(weight, chosen)


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                variant: str | None = None, packed: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` through the kernel (`available()` must have said True): the
    fastest variant here that takes the weight, or `variant`. A packed variant reads `packed`, the
    weight's `pack` (made here, once per call, where not given)."""
    variant = variant or best_for(weight)
    if variant in PACKED:
        return torch.ops.dflash_cpu.rows_linear_amx(x, pack(weight, variant) if packed is None else packed, bias)
    if variant is None:  # no variant takes this weight: the kernel's own check says why
        return torch.ops.dflash_cpu.rows_linear(x, weight, bias)
    return torch.ops.dflash_cpu.rows_linear_with(x, weight, bias, variant)
