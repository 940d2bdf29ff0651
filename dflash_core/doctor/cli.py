"""`python -m dflash_core doctor`: load a pair, run every check, print one line each, write the JSON.

    python -m dflash_core doctor --target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash \\
        --dtype float32 --threads 1 [--server http://127.0.0.1:8765] [--prompts FILE] [--json report.json]

Exit status: 0 when no check fails, 3 when one does, 1 when the target cannot be loaded or an input is bad.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import DFlashError
from ..loading.chat_template import THINKING_CHOICES
from ..loading.cli import add_pair_args, add_threads_arg
from ..loading.pair import default_drafter_dtype, load_drafter, load_pair, parse_dtype
from ..models.hub import resolve_model_dir
from .diagnose import DoctorSettings, default_prompts, diagnose

FAILED = 3


def _shown(path) -> str:
    """`path` relative to the working directory where it lies below it (the header line)."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def add_parser(commands) -> argparse.ArgumentParser:
    """The `doctor` subcommand, on the CLI's subparsers."""
    doc = commands.add_parser("doctor", help="say why a pair accepts as much as it does (one line per check)",
                              description=__doc__.splitlines()[0])
    add_pair_args(doc, target=None, drafter=True)
    add_threads_arg(doc)
    doc.add_argument("--server", help="a vLLM server serving this pair, e.g. http://127.0.0.1:8765")
    doc.add_argument("--server-model", help="the served model's name (default: the server's only model)")
    doc.add_argument("--prompts", help="JSON lines with \"prompt\" (text) or \"prompt_ids\" (default: the set the "
                     "drafter's card names, else assets/prompts/natural.jsonl)")
    doc.add_argument("--num-prompts", type=int, default=6, help="prompts, spread over the file")
    doc.add_argument("--max-new-tokens", type=int, default=64)
    doc.add_argument("--block-size", type=int, help="tokens per cycle (default: the drafter's trained size)")
    doc.add_argument("--thinking", choices=THINKING_CHOICES,
                     help="the thinking setting the pair is used with (default: off where the template has the switch)")
    doc.add_argument("--json", help="write the report (dflash-doctor/1) here")
    return doc


def main(args: argparse.Namespace) -> int:
    if args.num_prompts < 1 or args.max_new_tokens < 1:
        print("error: --num-prompts and --max-new-tokens must be at least 1", file=sys.stderr)
        return 1
    try:
        target = load_pair(args.target, None, device=args.device, dtype=args.dtype).target
        drafter_dir = resolve_model_dir(args.drafter, ("config.json", "model.safetensors"))
        dtype = (parse_dtype(args.drafter_dtype) if args.drafter_dtype
                 else default_drafter_dtype(args.device, target.dtype))
        drafter, error = None, None
        try:
            drafter = load_drafter(target, drafter_dir, dtype, args.block_size)
        except DFlashError as exc:
            error = str(exc)
        prompts, source = default_prompts(drafter_dir, args.prompts, args.num_prompts)
        settings = DoctorSettings(max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                                  thinking=args.thinking, server=args.server, server_model=args.server_model)
        report = diagnose(target, drafter_dir, prompts, drafter=drafter, load_error=error, settings=settings,
                          target_name=args.target, log=lambda line: print(f"[doctor: {line}]", file=sys.stderr))
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"doctor: {args.target} + {args.drafter}, {len(prompts)} prompts from {_shown(source)}, "
          f"{args.max_new_tokens} new tokens, greedy")
    print("\n".join(report.lines()))
    if args.json:
        Path(args.json).write_text(report.to_json() + "\n")
    return FAILED if report.status == "FAIL" else 0
