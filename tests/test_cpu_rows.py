"""The CPU rows kernel (dflash_core/speed/kernels/cpu_rows.cpp) and how packed linears take it.

Exactness: within 1e-5 relative (+1e-6 absolute) of `F.linear` (the sums run in another order;
bfloat16: within one rounding of the float32 result), and each row of a block bitwise equal to that
row alone, for every block size the kernel takes, on one thread and on several (outputs past the
parallel grain). Each variant (avx2, avx512, avx512_bf16, amx) runs where this CPU has its features
and is skipped, with the reason, elsewhere; `amx` on weights of whole tiles (16 outputs, 32 inputs). The timed choices (kernel or libraries, which variant) are
tested with one path made slow on purpose, so they cannot go either way by chance.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
import torch.utils.cpp_extension
from torch import nn
from torch._inductor.graph import GraphLowering

from dflash_core.speed import cpu_linear
from dflash_core.speed.batch_invariant import MAX_BLOCK
from dflash_core.speed.compiled_steps import CompiledBackend
from dflash_core.speed.cpu_linear import PackedLinear, choose_rows_kernel, pack_linears, single_row_library
from dflash_core.speed.fallbacks import FallbackWarning
from dflash_core.speed.kernels import cpu_rows

needs_kernel = pytest.mark.skipif(
    cpu_rows.unsupported_reason() is not None, reason=f"rows kernel: {cpu_rows.unsupported_reason()}"
)
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
ROOT = Path(__file__).resolve().parent.parent


def variant_param(variant: str, dtype: torch.dtype = torch.float32):
    """A test parameter that runs `variant` on `dtype` where this CPU has it, and says why not elsewhere."""
    reason = cpu_rows.variant_missing(variant)
    return pytest.param(variant, dtype, id=f"{variant}-{str(dtype).removeprefix('torch.')}",
                        marks=pytest.mark.skipif(reason is not None, reason=f"rows kernel {variant}: {reason}"))


VARIANTS = [variant_param("avx2"), variant_param("avx512"), variant_param("avx512", torch.bfloat16),
            variant_param("avx512_bf16"), variant_param("avx512_bf16", torch.bfloat16),
            variant_param("amx", torch.bfloat16)]
# The kernel's threads split the outputs in chunks of at least 16 tiles of 4 (cpu_rows.cpp): 301
# outputs make two chunks or more, the last tile part-full.
PAST_THE_GRAIN = 301


def tile_sizes(variant: str, out_features: int, in_features: int) -> tuple[int, int]:
    """The sizes `variant` takes nearest these: amx's are rounded up to whole tiles."""
    if variant != "amx":
        return out_features, in_features
    return -(-out_features // 16) * 16, -(-in_features // 32) * 32


@contextlib.contextmanager
def threads(n: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def close_to_linear(actual, x, weight, bias):
    """`actual` is F.linear in float32 (bfloat16 inputs: that result rounded once to bfloat16)."""
    expected = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    if x.dtype == torch.bfloat16:
        assert actual.dtype == torch.bfloat16
        # One rounding of the float32 sum: within half a bfloat16 step, plus the float32 sums' order.
        torch.testing.assert_close(actual.float(), expected, rtol=2**-8 + 1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant,dtype", VARIANTS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16, 17, 40])
@pytest.mark.parametrize("out_features,bias", [(1, False), (5, True), (200, True), (576, False)])
def test_kernel_matches_linear(variant, dtype, rows, out_features, bias):
    torch.manual_seed(rows * 1000 + out_features)
    out_features, in_features = tile_sizes(variant, out_features, 104)  # 104: avx512's half-width last step
    linear = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    x = torch.randn(rows, in_features, dtype=dtype)
    close_to_linear(cpu_rows.rows_linear(x, linear.weight, linear.bias, variant=variant), x, linear.weight, linear.bias)
    # leading dimensions and a non-contiguous input are kept as F.linear keeps them
    x3 = torch.randn(in_features, 2, rows, dtype=dtype).transpose(0, 2)
    out = cpu_rows.rows_linear(x3, linear.weight, linear.bias, variant=variant)
    assert out.shape == (rows, 2, out_features)
    close_to_linear(out, x3, linear.weight, linear.bias)


@pytest.mark.parametrize("variant,dtype", VARIANTS)
@pytest.mark.parametrize("in_features", [8, 24, 64, 1536])
@pytest.mark.parametrize("out_features,num_threads", [(37, 1), (PAST_THE_GRAIN, 1), (PAST_THE_GRAIN, 2)])
def test_each_row_of_a_block_is_bitwise_the_row_alone(variant, dtype, in_features, out_features, num_threads):
    torch.manual_seed(in_features)
    out_features, in_features = tile_sizes(variant, out_features, in_features)
    weight, bias = torch.randn(out_features, in_features, dtype=dtype), torch.randn(out_features, dtype=dtype)
    # Sums that cancel; past a batch-invariant block's rows (and amx's pass of 48).
    x = (torch.randn(MAX_BLOCK + 2, in_features) * torch.logspace(-3, 3, in_features)).to(dtype)
    with threads(1):
        alone = torch.cat([cpu_rows.rows_linear(x[i : i + 1], weight, bias, variant=variant) for i in range(len(x))])
    with threads(num_threads):
        for rows in range(1, len(x) + 1):
            assert torch.equal(cpu_rows.rows_linear(x[:rows], weight, bias, variant=variant), alone[:rows]), rows
            assert torch.equal(cpu_rows.rows_linear(x[-rows:], weight, bias, variant=variant), alone[-rows:]), rows
    # The rows themselves are right: within float32 rounding of the sum of the terms' sizes.
    scale = x.float().abs() @ weight.float().abs().T + bias.float().abs()
    error = (alone.float() - F.linear(x.float(), weight.float(), bias.float())).abs()
    assert (error <= 1e-5 * scale + (alone.float().abs() * 2**-8 if dtype == torch.bfloat16 else 0)).all()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fastest_variant_here_is_the_default(dtype):
    if dtype not in cpu_rows.dtypes():
        pytest.skip(f"the kernel takes no {dtype} here")
    torch.manual_seed(3)
    fastest = cpu_rows.variants_for(dtype)[-1]
    for out_features in (PAST_THE_GRAIN, 304):  # 304: whole tiles, which amx takes
        weight, x = torch.randn(out_features, 64, dtype=dtype), torch.randn(3, 64, dtype=dtype)
        expected = fastest if cpu_rows.takes(fastest, weight) else cpu_rows.variants_for(dtype)[-2]
        assert cpu_rows.best_for(weight) == expected
        assert torch.equal(cpu_rows.rows_linear(x, weight), cpu_rows.rows_linear(x, weight, variant=expected))
    with pytest.raises(ValueError, match="variants are avx2, avx512, avx512_bf16, amx, not 'sse'"):
        cpu_rows.variant_missing("sse")


@needs_kernel
def test_kernel_rejects_what_it_cannot_compute():
    assert cpu_rows.available()
    with pytest.raises(RuntimeError, match="inner size must be a multiple of 8, not 12"):
        cpu_rows.rows_linear(torch.randn(2, 12), torch.randn(3, 12))
    with pytest.raises(RuntimeError, match="takes float32 CPU tensors.*not Double rows and Double weights"):
        cpu_rows.rows_linear(torch.randn(2, 16, dtype=torch.float64), torch.randn(3, 16, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="not Float rows and BFloat16 weights"):
        cpu_rows.rows_linear(torch.randn(2, 16), torch.randn(3, 16).bfloat16())
    with pytest.raises(RuntimeError, match="the variant must be avx2, avx512 or avx512_bf16, not 'sse'"):
        cpu_rows.rows_linear(torch.randn(2, 16), torch.randn(3, 16), variant="sse")
    assert not cpu_rows.eligible(torch.randn(3, 12))
    assert cpu_rows.eligible(torch.randn(3, 16).bfloat16()) == ("avx512" in cpu_rows.variants())


@pytest.mark.skipif(cpu_rows.variant_missing("amx") is not None, reason=f"rows kernel amx: {cpu_rows.variant_missing('amx')}")
def test_amx_takes_bfloat16_weights_of_whole_tiles_packed():
    weight = torch.randn(32, 64).bfloat16()
    assert cpu_rows.takes("amx", weight)
    assert not cpu_rows.takes("amx", weight[:24]) and not cpu_rows.takes("amx", weight[:, :48])
    assert not cpu_rows.takes("amx", weight.float())
    assert cpu_rows.best_for(weight[:24], "amx") == "avx512_bf16"
    with pytest.raises(RuntimeError, match=r"multiples of 16 \(outputs\) and 32 \(inputs\), not \[24, 64\]"):
        cpu_rows.pack(weight[:24].contiguous(), "amx")
    with pytest.raises(RuntimeError, match="amx variant reads a packed weight"):
        torch.ops.dflash_cpu.rows_linear_with(torch.randn(2, 64).bfloat16(), weight, None, "amx")
    with pytest.raises(RuntimeError, match="must be packed by amx_pack"):
        torch.ops.dflash_cpu.rows_linear_amx(torch.randn(2, 64).bfloat16(), weight, None)
    with pytest.raises(RuntimeError, match="rows of 64 inputs, not 32"):
        cpu_rows.rows_linear(torch.randn(2, 32).bfloat16(), weight, variant="amx")


@pytest.mark.skipif(cpu_rows.variant_missing("avx2") is not None, reason=f"rows kernel avx2: {cpu_rows.variant_missing('avx2')}")
def test_bfloat16_needs_the_avx512_variant():
    with pytest.raises(RuntimeError, match="float32 CPU tensors, not BFloat16 rows"):
        cpu_rows.rows_linear(torch.randn(2, 16).bfloat16(), torch.randn(3, 16).bfloat16(), variant="avx2")


def _packed(in_features: int, out_features: int = 24) -> PackedLinear:
    model = nn.Sequential(nn.Linear(in_features, out_features))
    assert pack_linears(model) == 1
    return model[0]


@needs_kernel
def test_packed_linears_take_the_kernel_for_a_few_rows_only(monkeypatch):
    monkeypatch.setenv("DFLASH_CPU_ROWS", "on")
    torch.manual_seed(0)
    layer, odd = _packed(64), _packed(60)
    assert layer.rows_kernel and not odd.rows_kernel  # 60 inputs: not a multiple of 8
    assert single_row_library(nn.Sequential(layer)) == "rows kernel"
    x = torch.randn(1, cpu_rows.MAX_ROWS + 1, 64)
    with torch.inference_mode():
        block = x[:, : cpu_rows.MAX_ROWS]
        assert torch.equal(layer(block), cpu_rows.rows_linear(block, layer.weight, layer.bias))
        assert torch.equal(layer(x), layer.packed_forward(x))  # a prefill: packed oneDNN
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # the kernel reads the weight itself: nothing to repack
        torch.testing.assert_close(layer(x[:, :3]), F.linear(x[:, :3], layer.weight, layer.bias), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(cpu_rows.variant_missing("amx") is not None, reason=f"rows kernel amx: {cpu_rows.variant_missing('amx')}")
def test_a_packed_variant_follows_its_weight(monkeypatch):
    monkeypatch.setenv("DFLASH_CPU_ROWS", "on")
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(64, 40)).bfloat16()
    assert pack_linears(model) == 2
    tiles, odd = model
    assert (tiles.rows_variant, odd.rows_variant) == ("amx", "avx512_bf16") and odd.rows_packed is None
    x = torch.randn(3, 64).bfloat16()
    with torch.inference_mode():
        assert torch.equal(tiles(x), cpu_rows.rows_linear(x, tiles.weight, tiles.bias, variant="amx"))
    with torch.no_grad():
        tiles.weight.mul_(-2.0)  # the packed copy is stale: the next call packs again
    with torch.inference_mode():
        assert torch.equal(tiles(x), cpu_rows.rows_linear(x, tiles.weight, tiles.bias, variant="amx"))
    tiles.use_rows_kernel(None)
    assert not tiles.rows_kernel and tiles.rows_packed is None


def _slow(fn):
    def slowed(*args, **kwargs):
        time.sleep(1e-3)
        return fn(*args, **kwargs)
    return slowed


@needs_kernel
@pytest.mark.parametrize("slow", ["kernel", "libraries"])
def test_the_faster_path_takes_few_rows(monkeypatch, slow):
    layers = [_packed(32, 32) for _ in range(3)]
    if slow == "kernel":
        monkeypatch.setattr(cpu_rows, "rows_linear", _slow(cpu_rows.rows_linear))
    else:
        monkeypatch.setattr(PackedLinear, "packed_forward", _slow(PackedLinear.packed_forward))
        monkeypatch.setattr(cpu_linear.F, "linear", _slow(F.linear))
    keep = choose_rows_kernel(layers, reps=3)
    assert keep == (slow == "libraries")
    assert all(m.rows_kernel == keep for m in layers)


@pytest.mark.skipif(len(cpu_rows.variants_for(torch.float32)) < 2, reason="one float32 variant of the kernel here")
@pytest.mark.parametrize("slow", ["avx2", "avx512"])
def test_the_faster_variant_takes_few_rows(monkeypatch, slow):
    layers = [_packed(32, 32) for _ in range(3)]
    rows_linear = cpu_rows.rows_linear

    def slowed(x, weight, bias=None, variant=None, packed=None):
        if variant == slow:
            time.sleep(1e-3)
        return rows_linear(x, weight, bias, variant=variant, packed=packed)

    monkeypatch.setattr(cpu_rows, "rows_linear", slowed)
    monkeypatch.setattr(PackedLinear, "packed_forward", _slow(PackedLinear.packed_forward))
    monkeypatch.setattr(cpu_linear.F, "linear", _slow(F.linear))
    assert choose_rows_kernel(layers, reps=3)
    fast = "avx512" if slow == "avx2" else "avx2"
    assert all(m.rows_kernel and m.rows_variant == fast for m in layers)
    x = torch.randn(3, 32)
    with torch.inference_mode():
        assert torch.equal(layers[0](x), rows_linear(x, layers[0].weight, layers[0].bias, variant=fast))


def test_a_kernel_that_does_not_build_leaves_the_libraries(monkeypatch):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension 'dflash_cpu_rows': c++: not found")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    monkeypatch.setattr(cpu_rows, "unsupported_reason", lambda: None)
    cpu_rows.available.cache_clear()
    try:
        with pytest.warns(FallbackWarning, match="rows kernel is off, it did not build .*c\\+\\+: not found"):
            assert not cpu_rows.available()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FallbackWarning)  # said once per process
            layer = _packed(64)
        assert not layer.rows_kernel
        x = torch.randn(4, 64)
        with torch.inference_mode():
            assert torch.equal(layer(x), layer.packed_forward(x))
    finally:
        cpu_rows.available.cache_clear()


@needs_kernel
def test_the_switch(monkeypatch):
    monkeypatch.setenv("DFLASH_CPU_ROWS", "off")
    assert not _packed(64).rows_kernel
    monkeypatch.setenv("DFLASH_CPU_ROWS", "on")
    assert _packed(64).rows_kernel
    monkeypatch.setenv("DFLASH_CPU_ROWS", "always")
    with pytest.raises(ValueError, match="DFLASH_CPU_ROWS must be auto, on or off, not 'always'"):
        _packed(64)


@needs_kernel
@pytest.mark.parametrize("gemms", ["library", "template"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_what_an_inductor_compiled_step_runs(gemms, dtype):
    """With `library` GEMMs, inductor's code calls the kernel (an op in the graph, not a graph
    break), so each row is bitwise the row alone; with `template` GEMMs the linears are inductor's
    own (docs/design.md: blocks are then not bitwise one-token steps)."""
    if dtype not in cpu_rows.dtypes():
        pytest.skip(f"the kernel takes no {dtype} here")
    torch.manual_seed(5)
    layer = _packed(64, 48).to(dtype)
    layer.use_rows_kernel(cpu_rows.best_for(layer.weight))  # for the weight in `dtype`
    backend, codes = CompiledBackend(gemms), []
    torch._dynamo.reset()
    try:
        with torch.inference_mode(), mock.patch.object(GraphLowering, "save_output_code", codes.append):
            for rows in (4, 1):
                x = torch.randn(1, rows, 64, dtype=dtype)
                _, out = backend.capture(layer.forward, (x,))
                if gemms == "library":
                    assert torch.equal(out, cpu_rows.rows_linear(x, layer.weight, layer.bias, variant=layer.rows_variant))
                else:
                    close_to_linear(out.flatten(0, 1), x.flatten(0, 1), layer.weight, layer.bias)
    finally:
        torch._dynamo.reset()
    assert len(codes) == 2
    op = "dflash_cpu.rows_linear_amx" if layer.rows_variant == "amx" else "dflash_cpu.rows_linear"
    assert all((op in code) == (gemms == "library") for code in codes)


@needs_kernel
def test_a_copy_of_the_engine_loads_the_same_build_without_compiling(tmp_path):
    assert cpu_rows.available()
    folder = cpu_rows.build_folder()
    library = next(folder.glob("dflash_cpu_kernels*.so"))
    built = library.stat().st_mtime_ns
    # Another clone, or a Space bundle: the same sources at another path.
    shutil.copytree(ROOT / "dflash_core", tmp_path / "dflash_core", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", "from dflash_core.speed.kernels import cpu_rows; "
                           "print(cpu_rows.available(), cpu_rows.build_folder())"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", str(folder)], done.stderr[-2000:]
    assert library.stat().st_mtime_ns == built


def test_changed_sources_or_another_torch_build_in_a_folder_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "builds"))
    sources = tmp_path / "kernels"
    shutil.copytree(Path(cpu_rows.__file__).parent, sources, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    first = cpu_rows.build_folder(sources)
    assert first.parent == tmp_path / "builds" and {p.name for p in first.iterdir()} == set(cpu_rows.FILES)
    assert (first / "cpu_avx2.h").read_bytes() == (sources / "cpu_avx2.h").read_bytes()
    assert cpu_rows.build_folder(sources) == first
    with open(sources / "cpu_avx2.h", "a") as header:  # a header the .cpp files include
        header.write("// edited\n")
    edited = cpu_rows.build_folder(sources)
    assert edited != first and (edited / "cpu_avx2.h").read_text().endswith("// edited\n")
    monkeypatch.setattr(torch, "__version__", "0.0.0+other")
    assert cpu_rows.build_folder(sources) not in (first, edited)
