"""oneDNN-packed linear layers (dflash_core/speed/cpu_linear.py) against `F.linear`.

Error bound: float32 outputs within 1e-5 relative (+1e-6 absolute) of `F.linear` (the two
libraries sum in different orders); bfloat16 within 2 bf16 ulps relative. The one-row path choice
is tested with one library made slow on purpose, so the timing cannot go either way by chance.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dflash_core.speed import cpu_linear
from dflash_core.speed.cpu_linear import (
    PackedLinear,
    choose_single_row_path,
    pack_linears,
    packable_dtypes,
    packing_wanted,
    single_row_library,
)
from dflash_core.speed.kernels import cpu_rows

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")


def packed_copy(linear: nn.Linear) -> PackedLinear:
    clone = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    clone.load_state_dict(linear.state_dict())
    model = nn.Sequential(clone.to(linear.weight.dtype))
    assert pack_linears(model) == 1
    return model[0]


@pytest.mark.parametrize("rows", [1, 3, 8, 16])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_matches_linear(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)  # 200 outputs: not a multiple of any SIMD width
    packed = packed_copy(linear)
    x = torch.randn(2, rows, 96)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(torch.bfloat16 not in packable_dtypes(), reason="no native bf16 on this CPU")
def test_bfloat16_matches_linear():
    torch.manual_seed(0)
    linear = nn.Linear(128, 64).to(torch.bfloat16)
    packed = packed_copy(linear)
    x = torch.randn(8, 128, dtype=torch.bfloat16)
    with torch.inference_mode():
        out = packed(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x, linear.weight, linear.bias), rtol=2 * 2**-8, atol=1e-3)


def test_weight_changed_in_place_is_repacked():
    torch.manual_seed(1)
    packed = packed_copy(nn.Linear(32, 16))
    x = torch.randn(4, 32)
    with torch.no_grad():
        packed.weight.mul_(-2.0)  # what an optimizer step does
        torch.testing.assert_close(packed(x), F.linear(x, packed.weight, packed.bias), rtol=1e-5, atol=1e-6)


def test_weight_replaced_is_repacked():
    torch.manual_seed(3)
    packed = packed_copy(nn.Linear(32, 16))
    packed.weight.data = torch.randn(16, 32)
    x = torch.randn(4, 32)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), F.linear(x, packed.weight, packed.bias), rtol=1e-5, atol=1e-6)


def test_gradients_flow_through_the_plain_path():
    torch.manual_seed(2)
    packed = packed_copy(nn.Linear(32, 16))
    x = torch.randn(4, 32, requires_grad=True)
    packed(x).sum().backward()
    assert x.grad is not None and packed.weight.grad is not None
    torch.testing.assert_close(x.grad, packed.weight.sum(0).detach().expand(4, -1))


def test_tied_weights_stay_tied():
    embed = nn.Embedding(50, 24)
    head = nn.Linear(24, 50, bias=False)
    head.weight = embed.weight
    model = nn.ModuleDict({"embed": embed, "head": head})
    pack_linears(model)
    assert isinstance(model["head"], PackedLinear) and model["head"].weight is embed.weight


def test_single_row_path_switches_only_one_row_inputs():
    torch.manual_seed(4)
    packed = packed_copy(nn.Linear(64, 48))
    packed.rows_kernel, packed.single_row_packed = False, False
    one, block = torch.randn(1, 1, 64), torch.randn(1, 4, 64)
    with torch.inference_mode():
        assert torch.equal(packed(one), F.linear(one, packed.weight, packed.bias))
        assert torch.equal(packed(block), packed.packed_forward(block))


def _slow(fn):
    def slowed(*args, **kwargs):
        time.sleep(1e-3)
        return fn(*args, **kwargs)
    return slowed


@pytest.mark.parametrize("slow", ["mkl", "packed"])
def test_the_faster_library_takes_single_rows(monkeypatch, slow):
    layers = [packed_copy(nn.Linear(32, 32)) for _ in range(3)]
    if slow == "mkl":
        monkeypatch.setattr(cpu_linear.F, "linear", _slow(F.linear))
    else:
        monkeypatch.setattr(PackedLinear, "packed_forward", _slow(PackedLinear.packed_forward))
    for m in layers:
        m.rows_kernel = False
    keep = choose_single_row_path(layers, reps=3)
    assert keep == (slow == "mkl")
    assert all(m.single_row_packed == keep for m in layers)
    assert single_row_library(nn.Sequential(*layers)) == ("oneDNN" if keep else "MKL")


@pytest.mark.parametrize("mode,size,calibrated", [("auto", 64, True), ("auto", 16, False), ("on", 64, False)])
def test_only_large_models_under_auto_are_timed(monkeypatch, mode, size, calibrated):
    calls, kernel_calls = [], []
    monkeypatch.setattr(cpu_linear, "choose_single_row_path", calls.append)
    monkeypatch.setattr(cpu_linear, "choose_rows_kernel", kernel_calls.append)
    monkeypatch.setattr(cpu_linear, "CALIBRATE_MIN_BYTES", 64 * 64 * 4)
    monkeypatch.setenv("DFLASH_CPU_LINEAR", mode)
    assert pack_linears(nn.Sequential(nn.Linear(size, 64, bias=False))) == 1
    assert len(calls) == calibrated
    assert len(kernel_calls) == (size == 64 and cpu_rows.available())  # DFLASH_CPU_ROWS is auto


def test_switch_off_and_bad_value(monkeypatch):
    model = nn.Sequential(nn.Linear(8, 8))
    monkeypatch.setenv("DFLASH_CPU_LINEAR", "off")
    assert pack_linears(model) == 0 and type(model[0]) is nn.Linear
    monkeypatch.setenv("DFLASH_CPU_LINEAR", "fast")
    with pytest.raises(ValueError, match="DFLASH_CPU_LINEAR must be auto, on or off, not 'fast'"):
        pack_linears(model)


@pytest.mark.skipif(not packing_wanted(), reason="DFLASH_CPU_LINEAR=off")
def test_loaded_targets_are_packed(tiny_pair):
    target, _ = tiny_pair
    packed = [m for m in target.model.modules() if isinstance(m, PackedLinear)]
    assert packed and target.head in packed


def test_drafter_head_is_packed_and_built_outside_inference_mode(tiny_pair):
    """The drafter's slice of the target head is built once during decoding (inference mode) and
    then reused, also with gradients in training: it must be packed and a normal tensor."""
    target, drafter = tiny_pair
    hidden = torch.randn(3, target.hidden_size)
    with torch.inference_mode():
        logits = drafter.draft_logits(hidden, target.head)
    head = drafter.draft_head(target.head)
    assert isinstance(head, PackedLinear) and not head.weight.is_inference()
    rows = target.head.weight if drafter.draft_vocab is None else target.head.weight[drafter.draft_vocab]
    torch.testing.assert_close(logits, F.linear(hidden.to(drafter.dtype), rows.to(drafter.dtype)), rtol=1e-5, atol=1e-5)
    grad_in = hidden.clone().requires_grad_()
    drafter.draft_logits(grad_in, target.head).sum().backward()
    assert grad_in.grad is not None and grad_in.grad.abs().sum() > 0
