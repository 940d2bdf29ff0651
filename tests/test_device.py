"""The one-line warning for a GPU that torch cannot use (driver older than its CUDA build)."""

import torch

from dflash_core.speed import device


def fake_driver(monkeypatch, tmp_path, text):
    path = tmp_path / "version"
    path.write_text(text)
    monkeypatch.setattr(device, "DRIVER_FILE", path)


DRIVER_550 = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"


def test_an_old_driver_under_a_cuda_13_build_is_named_with_the_fix(monkeypatch, tmp_path):
    fake_driver(monkeypatch, tmp_path, DRIVER_550)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = device.cuda_mismatch()
    assert line.startswith("NVIDIA driver 550.54.14 is loaded, but torch ")
    assert "(built for CUDA 13.0) needs driver 580 or newer" in line and "--index-url" in line and "cu126" in line


def test_a_cpu_build_beside_a_driver_is_named(monkeypatch, tmp_path):
    fake_driver(monkeypatch, tmp_path, DRIVER_550)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "is a CPU build: install a CUDA build" in device.cuda_mismatch()


def test_nothing_to_say_without_a_driver_or_with_a_working_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(device, "DRIVER_FILE", tmp_path / "absent")
    assert device.cuda_mismatch() is None
    fake_driver(monkeypatch, tmp_path, DRIVER_550)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.cuda_mismatch() is None


def test_asking_for_cuda_without_a_usable_gpu_is_a_clear_error(tiny_dirs):
    import pytest

    from dflash_core import load_pair
    from dflash_core.errors import ConfigError

    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    with pytest.raises(ConfigError, match="torch sees no CUDA GPU here|NVIDIA driver"):
        load_pair(str(tiny_dirs[0]), device="cuda")
