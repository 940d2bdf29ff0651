"""Optional pieces fail soft: flash-attn only after a test call, Triton kernels fall back to their
references with one warning, kernels launch under their tensors' own CUDA device."""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

from dflash_core.models.target import default_attention
from dflash_core.speed import fallbacks, kernels
from dflash_core.speed.fallbacks import FallbackWarning, flash_attn_usable, probe_flash_attn
from dflash_core.speed.kernels import kv_injection, verify


@pytest.fixture
def fresh(monkeypatch):
    """Empty notice and broken-kernel registries, restored afterwards."""
    monkeypatch.setattr(fallbacks, "NOTICES", [])
    monkeypatch.setattr(kernels, "BROKEN", {})
    probe_flash_attn.cache_clear()
    yield
    probe_flash_attn.cache_clear()


def fake_flash(monkeypatch, func=None, importable=True):
    if not importable:
        monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn` raises ImportError
        return
    module = types.ModuleType("flash_attn")
    module.__version__ = "9.9"
    module.flash_attn_func = func
    monkeypatch.setitem(sys.modules, "flash_attn", module)


def test_flash_attn_needs_cuda_and_a_half_dtype():
    assert flash_attn_usable("cpu", torch.bfloat16) == (None, "flash-attn needs CUDA, not cpu")
    func, why = flash_attn_usable("cuda:0", torch.float32)
    assert func is None and why == "flash-attn runs only float16/bfloat16, and the model is float32"


def test_flash_attn_is_used_only_after_a_tiny_call_runs(monkeypatch, fresh):
    calls = []

    def works(q, k, v, causal):
        calls.append((q.dtype, causal))
        return q

    fake_flash(monkeypatch, works)
    func, why = probe_flash_attn(torch.device("cpu"), torch.bfloat16)  # the probe's logic, on CPU tensors
    assert func is works and why == "flash-attn 9.9" and calls == [(torch.bfloat16, False)]
    probe_flash_attn.cache_clear()

    def broken(q, k, v, causal):
        raise RuntimeError("no kernel image is available for execution on the device")

    fake_flash(monkeypatch, broken)
    func, why = probe_flash_attn(torch.device("cpu"), torch.float16)
    assert func is None and "failed a test call" in why and "no kernel image" in why
    probe_flash_attn.cache_clear()
    fake_flash(monkeypatch, importable=False)
    func, why = probe_flash_attn(torch.device("cpu"), torch.float16)
    assert func is None and why.startswith("flash-attn does not import (ModuleNotFoundError")


def test_drafter_says_once_why_it_uses_sdpa(monkeypatch, fresh):
    monkeypatch.setattr(fallbacks, "flash_attn_usable", lambda device, dtype: (None, "flash-attn does not import"))
    with pytest.warns(FallbackWarning, match="drafter attention on cuda:1 uses PyTorch SDPA: flash-attn does not import"):
        assert fallbacks.drafter_flash_attn(torch.device("cuda:1"), torch.bfloat16) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fallbacks.drafter_flash_attn(torch.device("cuda:1"), torch.bfloat16)  # said once only
    assert fallbacks.NOTICES == ["drafter attention on cuda:1 uses PyTorch SDPA: flash-attn does not import"]


def test_target_attention_is_sdpa_even_with_flash_attn():
    # transformers' flash path syncs the host in every layer of a multi-token forward (target.py).
    assert default_attention("cuda") == default_attention("cpu") == "sdpa"


def verify_inputs():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    return logits.argmax(-1)[:4].clone(), logits


def test_a_failing_triton_kernel_falls_back_with_one_warning(monkeypatch, fresh):
    calls = []

    def compile_error(*args):
        calls.append("triton")
        raise RuntimeError("PTX assembly failed: ptxas not found")

    monkeypatch.setattr(kernels, "use_triton", lambda device: True)  # as on a CUDA device in auto mode
    monkeypatch.setattr(verify, "verify_triton", compile_error)
    draft, logits = verify_inputs()
    with pytest.warns(FallbackWarning, match="Triton kernel greedy_verify failed .*ptxas not found.*PyTorch reference"):
        assert kernels.greedy_verify(draft, logits).tolist() == [4, int(logits[4].argmax())]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.greedy_verify(draft, logits).tolist() == [4, int(logits[4].argmax())]
    assert calls == ["triton"]  # not retried
    assert kernels.BROKEN == {"greedy_verify": "RuntimeError: PTX assembly failed: ptxas not found"}
    assert "fell back to torch: greedy_verify" in kernels.describe_backend("cpu")


def test_forced_triton_still_raises(monkeypatch, fresh):
    def launch_error(*args):
        raise RuntimeError("CUDA error: invalid device function")

    monkeypatch.setenv("DFLASH_KERNELS", "triton")
    monkeypatch.setattr(kernels, "use_triton", lambda device: True)
    monkeypatch.setattr(verify, "verify_triton", launch_error)
    with pytest.raises(RuntimeError, match="invalid device function"):
        kernels.greedy_verify(*verify_inputs())
    monkeypatch.setenv("DFLASH_KERNELS", "torch")
    monkeypatch.setattr(kernels, "use_triton", lambda device: False)
    assert kernels.greedy_verify(*verify_inputs()).shape == (2,)  # the switch forces the reference


def test_kernels_launch_under_their_tensors_device(monkeypatch, fresh):
    entered = []

    class FakeDevice:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(str(self.device))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", FakeDevice)
    with kernels.on_device(torch.device("cuda:1")):
        pass
    assert entered == ["cuda:1"]
    with kernels.on_device(torch.device("cpu")):  # nothing to guard on CPU
        pass
    assert entered == ["cuda:1"]

    seen = []
    monkeypatch.setattr(kernels, "use_triton", lambda device: True)
    monkeypatch.setattr(kernels, "on_device", lambda device: seen.append(device) or FakeDevice(device))
    monkeypatch.setattr(kv_injection, "inject_kv_triton", lambda *args: seen.append("kernel"))
    monkeypatch.setattr(verify, "verify_triton", lambda *args: seen.append("kernel"))
    kernels.greedy_verify(*verify_inputs())
    assert seen == [torch.device("cpu"), "kernel"]  # the logits' own device, around the launch
