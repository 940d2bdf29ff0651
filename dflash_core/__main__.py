"""Command line: `python -m dflash_core generate ...` decodes one prompt and can write its trace;
`python -m dflash_core doctor ...` says why a pair accepts as much as it does (`doctor/`, docs/doctor.md).

Example::

    python -m dflash_core generate --target ./target --drafter ./drafter --prompt-ids 1,2,3 \\
        --max-new-tokens 64 --explain --trace-json trace.json

The trace is a "dflash-trace/2" file (`trace.py`) with a per-block CSV beside it.
"""

from __future__ import annotations

import argparse
import sys

from .decoding import generate
from .doctor import cli as doctor_cli
from .errors import DFlashError
from .events import Block, Prefill, Summary
from .loading.chat_template import THINKING_CHOICES, describe_template, template_args
from .loading.cli import add_pair_args, add_threads_arg, apply_args
from .loading.pair import load_pair
from .loading.prompting import IncrementalDecoder
from .sampling import SamplingParams
from .schedule import AUTO, CostProfile
from .trace import build_trace, lane_of, settings_of, write_trace


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def parse_block_size(text: str) -> int | str:
    """A whole number of tokens, or "auto" (the block schedule, `schedule.py`)."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--block-size must be a whole number or {AUTO}, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dflash_core", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="decode one prompt with DFlash (or plainly with --plain)")
    add_pair_args(gen, target=None, dtype="auto", steps=True)
    add_threads_arg(gen)
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="user message; goes through the target's chat template when it has one")
    prompt.add_argument("--prompt-ids", type=parse_ids, help="prompt token ids, comma-separated (no tokenizer needed)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--block-size", type=parse_block_size,
                     help="tokens per cycle (default: the drafter's trained size), or auto: each cycle verifies "
                     "the prefix of its draft worth its verify cost, up to the trained size")
    gen.add_argument("--cost-profile", metavar="JSON",
                     help="with --block-size auto: the verify cost per length (`bench cycle --cost-profile` writes "
                     "one); default: measured at the start, a few dozen verifies")
    gen.add_argument("--tree-budget", type=int, default=0, metavar="B",
                     help="verify a tree of B drafts grown from the drafter's per-slot top-k in one target forward "
                     "(docs/design.md, tree verification); 0: the drafter's chain")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--plain", action="store_true", help="plain decoding with the target alone")
    gen.add_argument("--no-chat-template", action="store_true", help="tokenize --prompt as raw text")
    gen.add_argument(
        "--thinking", choices=THINKING_CHOICES,
        help="Qwen3-style thinking in the chat template (default: off where the template has the switch, "
        "as the released DFlash drafters were trained)",
    )
    gen.add_argument("--trace-json", help="write the trace (dflash-trace/2: ids, blocks, metrics) here, and a CSV beside it")
    gen.add_argument(
        "--explain", type=int, nargs="?", const=5, default=0, metavar="K",
        help="explain every cycle in the trace (drafter and target top-K, decision, caches, times); K defaults to 5",
    )
    gen.add_argument("--quiet", action="store_true", help="print only the summary line")
    doctor_cli.add_parser(commands)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = apply_args(parser, parser.parse_args(argv))
    if args.command == "doctor":
        return doctor_cli.main(args)
    if not args.plain and not args.drafter:
        print("error: --drafter is required unless --plain is given", file=sys.stderr)
        return 2
    try:
        pair = load_pair(
            args.target,
            None if args.plain else args.drafter,
            device=args.device,
            dtype=args.dtype,
            drafter_dtype=args.drafter_dtype,
            block_size=None if args.block_size == AUTO else args.block_size,
            static_cache=args.static_cache,
            cuda_graphs=args.cuda_graphs,
            compiled=args.compile,
        )
        tokenizer = pair.tokenizer
        if args.prompt_ids is not None:
            prompt_ids = args.prompt_ids
        else:
            chat = not args.no_chat_template
            chat_args = template_args(tokenizer, args.thinking) if chat and tokenizer is not None else {}
            prompt_ids = pair.encode(args.prompt, template_args=chat_args, chat=chat)
            if not args.quiet:
                print(f"[prompt: {describe_template(tokenizer, chat_args, chat)}]", file=sys.stderr)
        sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
        events = generate(
            pair.target,
            prompt_ids,
            pair.drafter,
            max_new_tokens=args.max_new_tokens,
            block_size=args.block_size,
            sampling=sampling,
            stop_ids=pair.stop_ids,
            explain=args.explain,
            costs=CostProfile.load(args.cost_profile) if args.cost_profile else None,
            tree_budget=0 if args.plain else args.tree_budget,
        )
        text = IncrementalDecoder(tokenizer) if tokenizer is not None and not args.quiet else None
        for event in events:
            if text is not None and isinstance(event, (Prefill, Block)):
                ids = [event.token_id] if isinstance(event, Prefill) else event.committed_ids
                print(text.push(ids), end="", flush=True)
        summary: Summary = event
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if text is not None:
        print()
    target_dtype = str(pair.target.dtype).removeprefix("torch.")
    if pair.drafter is None:
        mode = f"plain {target_dtype}"
    else:
        block = summary.block_size
        if summary.block_schedule == AUTO:
            block = f"auto (mean {summary.mean_verify_len:.2f} of {block})"
        if summary.tree_budget:
            block = f"{block} tree={summary.tree_budget}"
        mode = f"dflash block={block} target {target_dtype} drafter {str(pair.drafter.dtype).removeprefix('torch.')}"
    print(
        f"[{mode}] {len(summary.output_ids)} tokens in {summary.total_s:.2f}s "
        f"({summary.tokens_per_s:.1f} tok/s), tau {summary.tau:.2f}, cycles {len(summary.blocks)}, "
        f"ttft {summary.ttft_s * 1000:.0f} ms, stop: {summary.stop_reason}"
    )
    if args.trace_json:
        drafter = pair.drafter
        trace = build_trace(
            settings=settings_of(args.prompt, prompt_ids, args.max_new_tokens, summary.block_size, sampling,
                                 target_dtype=pair.target.dtype, drafter_dtype=None if drafter is None else drafter.dtype,
                                 explain=args.explain, block_schedule=summary.block_schedule),
            pair={"id": None, "target": args.target, "drafter": None if drafter is None else args.drafter,
                  "trained_block_size": None if drafter is None else drafter.block_size},
            runs={lane_of(summary.method): summary},
            vocab_size=pair.target.vocab_size,
            text_of=None if tokenizer is None else lambda t: tokenizer.decode([t], skip_special_tokens=False),
            device=pair.target.device,
        )
        write_trace(trace, args.trace_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
