"""The command-line options every command shares, and applying them: which pair (`--target`,
`--drafter`), its dtypes and device, how the steps run (`--static-cache`, `--cuda-graphs`,
`--compile`), and the CPU threads (`--threads`)."""

from __future__ import annotations

import argparse

import torch

from .default_target import DEFAULT_TARGET
from .pair import DTYPES, ModelPair, load_pair

TARGET_HELP = "target model directory or Hub id (default:smollm2 for the offline default)"


def add_target_arg(parser: argparse.ArgumentParser, default: str | None = DEFAULT_TARGET) -> None:
    """--target, default `default` (None makes it required)."""
    parser.add_argument("--target", default=default, required=default is None, help=TARGET_HELP)


def add_pair_args(parser: argparse.ArgumentParser, *, target: str | None = DEFAULT_TARGET, drafter: str | bool | None = None,
                  dtype: str = "float32", steps: bool = False) -> None:
    """--target (default `target`; None makes it required), --drafter (default `drafter`; True makes it
    required, False leaves it out), --dtype (default `dtype`, which may be "auto"), --drafter-dtype and
    --device; with `steps`, also --static-cache, --cuda-graphs and --compile."""
    add_target_arg(parser, target)
    if drafter is not False:
        parser.add_argument("--drafter", default=None if drafter is True else drafter, required=drafter is True,
                            help="DFlash drafter directory or Hub id")
    parser.add_argument("--dtype", choices=[*DTYPES, "auto"], default=dtype,
                        help="the target's dtype; auto: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32")
    parser.add_argument("--drafter-dtype", choices=list(DTYPES),
                        help="default: bfloat16 where the hardware runs it natively, else --dtype")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    if steps:
        parser.add_argument("--static-cache", action="store_true",
                            help="keep the target's KV cache in a preallocated StaticCache (default: DynamicCache)")
        parser.add_argument("--cuda-graphs", action="store_true",
                            help="replay the draft and verify steps from CUDA graphs (needs --static-cache; CUDA "
                            "only, elsewhere they run eagerly with one warning)")
        parser.add_argument("--compile", action="store_true",
                            help="run the draft and verify steps through torch.compile (implies --static-cache; the "
                            "first run of each shape compiles, minutes on a small CPU, then inductor's disk cache "
                            "serves)")


def add_threads_arg(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    parser.add_argument("--threads", type=int, default=default,
                        help="torch CPU threads (default: torch's, all cores); match the app's to compare")


def apply_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """`args` with --threads applied and the step options checked, where the parser has them; a bad
    combination is the parser's error (exit 2, with the usage)."""
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            parser.error(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    if getattr(args, "cuda_graphs", False) and not args.static_cache:
        parser.error("--cuda-graphs needs --static-cache: a graph replays fixed cache addresses and offsets")
    if getattr(args, "compile", False):
        if args.cuda_graphs:
            parser.error("--compile and --cuda-graphs each run the same steps their own way: choose one")
        args.static_cache = True
    return args


def load_pair_of(args: argparse.Namespace, drafter: str | None | bool = True, **options) -> ModelPair:
    """The pair `add_pair_args`'s options name, loaded (`drafter=None`: the target alone)."""
    steps = {name: getattr(args, name) for name in ("static_cache", "cuda_graphs") if hasattr(args, name)}
    if hasattr(args, "compile"):
        steps["compiled"] = args.compile
    return load_pair(args.target, args.drafter if drafter is True else drafter, device=args.device, dtype=args.dtype,
                     drafter_dtype=args.drafter_dtype, **steps, **options)
