"""Does this CPU's packed linear kernel compute a row of a block as it computes that row alone?

Prints, per (in_features, out_features) shape and dtype, the fraction of output elements that differ
between a block of 2..MAX_BLOCK rows and the same rows one at a time: on random inputs, and on the
cancelling inputs `batch_invariant.rows_alone_from` probes with. Then times `make_batch_invariant`
on the default target and names the layers it runs row by row:

    python -m dflash_core.bench row-invariance [--dtype bfloat16] [--trials 5]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from ..loading.default_target import DEFAULT_TARGET, resolve_target
from ..loading.pair import DTYPES
from ..models.target import Target
from ..speed.batch_invariant import MAX_BLOCK, cancelling_rows, make_batch_invariant, rows_alone_layers
from ..speed.cpu_linear import pack_linears

SHAPES = [(576, 576), (576, 1536), (1536, 576), (576, 49152)] + [(k, 576) for k in (512, 768, 1024, 1056, 1152, 2048)]


@torch.inference_mode()
def mismatch_fraction(linear: nn.Linear, x: torch.Tensor) -> float:
    alone = torch.cat([linear(x[:, i : i + 1]) for i in range(x.shape[1])], dim=1)
    differ = sum(int((linear(x[:, :rows]) != alone[:, :rows]).sum()) for rows in range(2, x.shape[1] + 1))
    return differ / sum(rows * linear.out_features for rows in range(2, x.shape[1] + 1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_core.bench row-invariance",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    print(f"{'in':>6} {'out':>6} {'random inputs':>14} {'cancelling':>11}")
    for in_f, out_f in SHAPES:
        layer = nn.Sequential(nn.Linear(in_f, out_f, bias=False, dtype=dtype))
        pack_linears(layer, calibrate=False)
        linear = layer[0]
        rand = [mismatch_fraction(linear, torch.randn(1, MAX_BLOCK, in_f, generator=gen).to(dtype)) for _ in range(args.trials)]
        cancel = mismatch_fraction(linear, cancelling_rows(linear.weight, MAX_BLOCK))
        print(f"{in_f:>6} {out_f:>6} {sum(rand) / len(rand):>14.2e} {cancel:>11.2e}")

    target = Target.from_pretrained(resolve_target(DEFAULT_TARGET), dtype=dtype, batch_invariant=False)
    t0 = time.perf_counter()
    make_batch_invariant(target.model)
    names = rows_alone_layers(target.model)
    print(f"make_batch_invariant on the default target: {time.perf_counter() - t0:.2f} s; "
          f"{len(names)} linear layers row by row{': ' + ', '.join(names[:3]) + ', ...' if names else ''}")
    return 0
