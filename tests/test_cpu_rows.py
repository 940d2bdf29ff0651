"""The CPU rows kernel (dflash_core/speed/kernels/cpu_rows.cpp) and how packed linears take it.

Exactness: within 1e-5 relative (+1e-6 absolute) of `F.linear` (the sums run in another order),
and each row of a block bitwise equal to that row alone, for every block size the kernel takes.
The timed choice is tested with one path made slow on purpose, so it cannot go either way by chance.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.utils.cpp_extension
from torch import nn

from dflash_core.speed import cpu_linear
from dflash_core.speed.cpu_linear import PackedLinear, choose_rows_kernel, pack_linears, single_row_library
from dflash_core.speed.fallbacks import FallbackWarning
from dflash_core.speed.kernels import cpu_rows

needs_kernel = pytest.mark.skipif(
    cpu_rows.unsupported_reason() is not None, reason=f"rows kernel: {cpu_rows.unsupported_reason()}"
)
pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 16, 17, 40])
@pytest.mark.parametrize("out_features,bias", [(1, False), (5, True), (200, True), (576, False)])
def test_kernel_matches_linear(rows, out_features, bias):
    assert cpu_rows.available()
    torch.manual_seed(rows * 1000 + out_features)
    linear = nn.Linear(96, out_features, bias=bias)
    x = torch.randn(rows, 96)
    expected = F.linear(x, linear.weight, linear.bias)
    torch.testing.assert_close(cpu_rows.rows_linear(x, linear.weight, linear.bias), expected, rtol=1e-5, atol=1e-6)
    # leading dimensions and a non-contiguous input are kept as F.linear keeps them
    x3 = torch.randn(96, 2, rows).transpose(0, 2)
    torch.testing.assert_close(cpu_rows.rows_linear(x3, linear.weight, linear.bias),
                               F.linear(x3, linear.weight, linear.bias), rtol=1e-5, atol=1e-6)


@needs_kernel
@pytest.mark.parametrize("in_features", [8, 64, 1536])
def test_each_row_of_a_block_is_bitwise_the_row_alone(in_features):
    assert cpu_rows.available()
    torch.manual_seed(in_features)
    weight, bias = torch.randn(37, in_features), torch.randn(37)
    x = torch.randn(cpu_rows.MAX_ROWS, in_features) * torch.logspace(-3, 3, in_features)  # sums that cancel
    alone = torch.cat([cpu_rows.rows_linear(x[i : i + 1], weight, bias) for i in range(len(x))])
    for rows in range(1, cpu_rows.MAX_ROWS + 1):
        assert torch.equal(cpu_rows.rows_linear(x[:rows], weight, bias), alone[:rows]), rows
        assert torch.equal(cpu_rows.rows_linear(x[-rows:], weight, bias), alone[-rows:]), rows


@needs_kernel
def test_kernel_rejects_what_it_cannot_compute():
    assert cpu_rows.available()
    with pytest.raises(RuntimeError, match="inner size must be a multiple of 8, not 12"):
        cpu_rows.rows_linear(torch.randn(2, 12), torch.randn(3, 12))
    with pytest.raises(RuntimeError, match="float32"):
        cpu_rows.rows_linear(torch.randn(2, 16, dtype=torch.float64), torch.randn(3, 16, dtype=torch.float64))
    assert not cpu_rows.eligible(torch.randn(3, 12)) and not cpu_rows.eligible(torch.randn(3, 16).bfloat16())


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
def test_a_compiled_step_calls_the_kernel():
    """Under torch.compile (`library` GEMMs) the kernel is an op in the graph, not a graph break."""
    torch.manual_seed(5)
    layer = _packed(64, 40)
    assert layer.rows_kernel
    x = torch.randn(1, 4, 64)
    compiled = torch.compile(layer.forward, fullgraph=True, backend="eager")
    with torch.inference_mode():
        assert torch.equal(compiled(x), cpu_rows.rows_linear(x, layer.weight, layer.bias))
