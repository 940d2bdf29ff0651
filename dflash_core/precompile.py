"""Compiling a target's steps before the runs that take them.

A compiled target (`Target(..., compiled=True)`, `speed/compiled_steps.py`) compiles a step the
first time a run takes it: one verify step per length and set of tapped layers, and a drafter's
draft step per block size, each at the size of the static caches. That first run pays the compile
(seconds to minutes on a CPU) inside its own timings. `compile_verify`, `compile_draft` and
`compile_schedule` take the steps ahead of the runs, on the target that will run them. Dynamo keeps
a step's code per step function, and another target over the same model reuses it at its first
call where guards pass (same shapes, same tapped layers, same cache capacity, same compile options).

The caches only grow, and a step compiled at one capacity is not the step of another:
`size_caches` sets both caches to hold runs of up to `positions` tokens, before the steps are
compiled and before the runs.
"""

from __future__ import annotations

import torch

from .decoding import run
from .models.target import Target
from .schedule import measured_costs

# Any ids do: a step's code depends on shapes, not values. Long enough to give a draft step whole
# blocks after the first (the block-16 drafters included).
_PROMPT = list(range(10, 42))


def size_caches(target: Target, drafter, positions: int, rows: int | None = None) -> None:
    """Hold runs of up to `positions` tokens in `target`'s static cache and `drafter`'s (if any).
    rows: the most a verify step takes past them (default: the drafter's block; a tree's nodes)."""
    block = drafter.block_size if drafter is not None else 1
    target.reset(positions + max(block, rows or 0))
    if drafter is not None:
        drafter.new_cache(positions + 2 * block)


@torch.inference_mode()
def compile_verify(target: Target, length: int, layer_ids=()) -> None:
    """Compile `target`'s verify step of `length` tokens with `layer_ids` tapped (a DFlash drafter's
    `target_layer_ids`; none for plain decoding and prompt lookup), at its cache's capacity."""
    capacity = target.kv.capacity
    target.reset(capacity)
    target.tap_layers(layer_ids)
    try:
        target.forward(torch.tensor([_PROMPT[:4]], device=target.device))  # the prefill runs eagerly
        target.forward(torch.tensor([_PROMPT[4:4 + length]], device=target.device))
    finally:
        target.tap_layers(())
        target.reset(capacity)


def compile_draft(target: Target, drafter, block_size: int, tree_budget: int = 0) -> None:
    """Compile `drafter`'s draft step at `block_size` and the verify step its runs take with it (a
    tree of `tree_budget` drafts where one is given), by decoding a few blocks (greedy) on `target`."""
    run(target, _PROMPT, drafter, max_new_tokens=3 * block_size, block_size=block_size, tree_budget=tree_budget)


def compile_schedule(target: Target, drafter) -> None:
    """Compile what a scheduled run (`block_size="auto"`) of `drafter` takes on `target`: the draft
    step of a whole block, and the verify steps of 1 to the block's tokens with the drafter's layers
    tapped, which the schedule's cost profile (`measured_costs`, kept with the target) compiles in
    its warm-up round and then times. A draft of fewer slots runs the eager draft step
    (`drafting.DFlashDrafting.draft`)."""
    compile_draft(target, drafter, drafter.block_size)
    capacity = target.kv.capacity
    target.tap_layers(drafter.target_layer_ids)
    try:
        measured_costs(target, drafter.block_size)
    finally:
        target.tap_layers(())
        target.reset(capacity)
