"""Why a machine with an NVIDIA GPU would still decode on the CPU: a driver older than torch's CUDA build.

A stock `pip install torch==2.13.0` on Linux is built for CUDA 13, which needs an R580-era driver;
on an older driver `torch.cuda.is_available()` is simply False. `cuda_mismatch()` tells that case
apart from a machine without a GPU, so the app and CLI can say it in one line instead of running
on the CPU in silence.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

# The oldest driver branch each CUDA major release runs on (NVIDIA's CUDA compatibility table).
MIN_DRIVER = {12: 525, 13: 580}
DRIVER_FILE = Path("/proc/driver/nvidia/version")


def nvidia_driver() -> str | None:
    """The loaded NVIDIA kernel driver's version, e.g. "550.54.14", or None without one."""
    try:
        match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", DRIVER_FILE.read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def cuda_mismatch() -> str | None:
    """One line naming the driver, the CUDA build and the fix, when a GPU is present but unusable."""
    driver, build = nvidia_driver(), torch.version.cuda
    if driver is None or torch.cuda.is_available():
        return None
    fix = f"pip install torch=={torch.__version__.split('+')[0]} --index-url https://download.pytorch.org/whl/cu126"
    if build is None:
        return (f"an NVIDIA driver ({driver}) is loaded but this torch {torch.__version__} is a CPU build: "
                f"install a CUDA build, e.g. {fix}")
    needed = MIN_DRIVER.get(int(build.split(".")[0]))
    too_old = needed is not None and int(driver.split(".")[0]) < needed
    why = f"needs driver {needed} or newer" if too_old else "cannot use it"
    return (f"NVIDIA driver {driver} is loaded, but torch {torch.__version__} (built for CUDA {build}) {why}, "
            f"so decoding runs on the CPU; for an older driver install the CUDA 12 build: {fix}")
