"""Thirty module calls without hooks, then with `LayerTaps`' hook on each (no Target recording), as
in an eager step of the default target's 30 layers: the least of 5 timeit repeats of 2,000 calls.

    python dev/measurements/layer-taps-and-tree-bound-2026-12-07/hook_calls.py
"""
import timeit

import torch

from dflash_core.models.target import LayerTaps

layers = torch.nn.ModuleList([torch.nn.Identity() for _ in range(30)])
x = torch.zeros(1)


def call_all():
    for layer in layers:
        layer(x)


without = min(timeit.repeat(call_all, number=2000, repeat=5)) / 2000
LayerTaps(layers)
with_hooks = min(timeit.repeat(call_all, number=2000, repeat=5)) / 2000
print(f"30 module calls: {without * 1e6:.1f} us without hooks, {with_hooks * 1e6:.1f} us with LayerTaps' hooks "
      f"(+{(with_hooks - without) * 1e6:.1f} us)")
