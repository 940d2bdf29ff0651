"""Time every linear layer of a target at a few row counts: oneDNN-packed (for several expected row
counts), `F.linear` (MKL) and this project's rows kernel (`kernels/cpu_rows.py`), each of its
variants this CPU runs.
Verification multiplies a block of rows by the same weights a plain step multiplies one row by, so
this is the part of a verify's cost the CPU's GEMM kernels decide.

    python -m dflash_core.bench linear-rows --threads 1 [--rows 1 2 3 4 8 16] [--dtype bfloat16]
    ONEDNN_MAX_CPU_ISA=AVX2 python -m dflash_core.bench linear-rows --threads 1   # AVX2's kernels

Prints one line per row count: the median over interleaved sweeps, in ms per sweep of all layers;
then the same as one JSON line.
`--clock cpu` times the calling thread's CPU time instead of the wall clock (one thread only): on a
machine others load, time spent descheduled then does not count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from ..loading.cli import add_target_arg, add_threads_arg
from ..loading.default_target import resolve_target
from ..speed.kernels import cpu_rows
from .run import parse

PACK_HINTS = (None, 1, 4, 16)  # the batch_size oneDNN is told to lay the weight out for


def sweep(weights: list[torch.Tensor], linear, rows: int, clock=time.perf_counter) -> float:
    """Milliseconds to run `rows` rows through every layer once, `linear(i, x)` computing layer i."""
    xs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights]
    t0 = clock()
    for i, x in enumerate(xs):
        linear(i, x)
    return (clock() - t0) * 1e3


def packed_path(weights: list[torch.Tensor], hint: int | None):
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, hint) for w in weights]
    return lambda i, x: torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], "")


def kernel_path(weights: list[torch.Tensor], variant: str):
    """The rows kernel's `variant` (for a weight it does not take, the best here that does), its
    packed copies made before timing, as a packed linear keeps them."""
    prepared = [cpu_rows.prepare(w, variant) for w in weights]
    return lambda i, x: cpu_rows.rows_linear(x, weights[i], None, *prepared[i])


@torch.inference_mode()
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_core.bench linear-rows", description=__doc__.split("\n\n")[0])
    add_target_arg(p)
    add_threads_arg(p, default=1)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16], help="row counts to time")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the weights' and rows' dtype (the kernel takes bfloat16 in its AVX-512 and AMX variants)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: the wall clock; cpu: this thread's CPU time (with --threads 1 only)")
    args = parse(p, argv)
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu times the calling thread: with --threads 1 only")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    model = AutoModelForCausalLM.from_pretrained(resolve_target(args.target), dtype=getattr(torch, args.dtype))
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, nn.Linear)]
    paths = {f"oneDNN packed for {hint or 'default'}": packed_path(weights, hint) for hint in PACK_HINTS}
    paths["MKL (F.linear)"] = lambda i, x: F.linear(x, weights[i])
    for variant in cpu_rows.variants_for(getattr(torch, args.dtype)):
        paths[f"rows kernel {variant}"] = kernel_path(weights, variant)
    size = sum(w.numel() * w.element_size() for w in weights) / 2**20
    print(f"{len(weights)} linear layers, {size:.0f} MiB of {args.dtype}, {args.threads} thread(s), "
          f"{args.clock} clock")
    medians: dict[int, dict[str, float]] = {}
    for rows in args.rows:
        times: dict[str, list[float]] = {name: [] for name in paths}
        for rep in range(args.reps + 1):
            for name, linear in paths.items():
                ms = sweep(weights, linear, rows, clock)
                if rep:  # the first sweep of each path only warms up
                    times[name].append(ms)
        medians[rows] = {name: statistics.median(t) for name, t in times.items()}
        print(f"rows {rows:2d}: " + ", ".join(f"{name} {ms:.1f}" for name, ms in medians[rows].items()), flush=True)
    print(json.dumps({"layers": len(weights), "mib": size, "dtype": args.dtype, "threads": args.threads,
                      "clock": args.clock, "reps": args.reps, "ms_per_sweep": medians}))
    return 0
