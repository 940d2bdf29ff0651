"""Shared fixtures: the golden reference pair and tiny random pairs built on the fly."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

# Without a GPU the Triton kernels can run only in Triton's interpreter, and triton fixes that mode
# when first imported: turn it on before anything imports it. The engine still runs the PyTorch
# references on CPU unless DFLASH_KERNELS=triton.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import tiny`

from alone import pytest_runtest_protocol  # noqa: E402, F401  (the `alone` marker's locks)
from tiny import build_drafter, build_target  # noqa: E402

from dflash_core import DFlashDrafter, Target  # noqa: E402

# Tiny models gain nothing from threads, and the tests then do not fight other jobs for cores.
torch.set_num_threads(1)

# The reference implementation's traces, copied into the repository (see golden/README.md).
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module, restored after: code under test (the app, `--threads`) may set it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    directory = GOLDEN / "zlab-tiny-a"
    assert directory.is_dir(), f"golden traces not found at {directory}"
    return directory


@pytest.fixture(scope="session")
def golden_expected(golden_dir) -> dict:
    return json.loads((golden_dir / "expected.json").read_text())


@pytest.fixture(scope="session")
def golden_pair(golden_dir):
    return Target.from_pretrained(golden_dir / "target"), DFlashDrafter.from_pretrained(golden_dir / "drafter")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """(target_dir, drafter_dir): a random Llama target with a tokenizer and a random drafter."""
    root = tmp_path_factory.mktemp("tiny")
    target_dir = build_target(root / "target")
    return target_dir, build_drafter(root / "drafter", target_dir)


@pytest.fixture(scope="session")
def tiny_pair(tiny_dirs):
    target_dir, drafter_dir = tiny_dirs
    return Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    """A target of two layers and a drafter of one at block 4, for tests that compile steps: a few
    shapes to compile, in seconds. Built for each module, which may change the models' state."""
    root = tmp_path_factory.mktemp("small")
    target_dir = build_target(root / "target", num_layers=2)
    drafter_dir = build_drafter(root / "drafter", target_dir, num_layers=1, block_size=4)
    return Target.from_pretrained(target_dir), DFlashDrafter.from_pretrained(drafter_dir)
