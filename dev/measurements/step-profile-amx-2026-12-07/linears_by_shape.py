"""The default pair's target linears by shape (dtype `auto`, each layer's own path: the rows kernel's
`amx` variant here), 1 and 4 rows, 1 thread, no gradients: microseconds a call over the 30 layers'
weights of a shape in turn (median of 8 sweeps after one), the rate of weight bytes read, and the
shape's total a step. From the repository root:

    python dev/measurements/step-profile-amx-2026-12-07/linears_by_shape.py
"""
import collections
import statistics
import time

import torch

from dflash_core import load_pair
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.speed.cpu_linear import PackedLinear

torch.set_num_threads(1)
torch.set_grad_enabled(False)
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")
by_kind = collections.defaultdict(list)
for name, module in pair.target.model.named_modules():
    if isinstance(module, PackedLinear):
        by_kind[name.split(".")[-1]].append(module)
for rows in (1, 4):
    total = 0.0
    for kind, modules in by_kind.items():
        x = torch.randn(1, rows, modules[0].in_features).bfloat16()
        sweeps = []
        for _ in range(9):
            start = time.perf_counter()
            for module in modules:
                module(x)
            sweeps.append((time.perf_counter() - start) / len(modules))
        us = statistics.median(sweeps[1:]) * 1e6
        megabytes = modules[0].weight.numel() * modules[0].weight.element_size() / 1e6
        total += us * len(modules)
        print(f"{rows} rows  {kind:9} {tuple(modules[0].weight.shape)!s:13} {modules[0].rows_variant}  {us:6.0f} us"
              f"  {megabytes / us * 1e3:5.1f} GB/s  x{len(modules)} = {us * len(modules) / 1e3:5.2f} ms")
    print(f"{rows} rows  all linears {total / 1e3:.1f} ms a step")
