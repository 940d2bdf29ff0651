"""The race as it stood at an earlier cycle: what a viewer stepping back through a paused or finished
run sees on every lane.

`as_of(snap, lane, cycles)` cuts every lane of a snapshot at the compute time at which `lane` ended
its cycle number `cycles`: that lane keeps its first `cycles` cycles, every other lane the events it
had computed by then on its own clock. That is the moment a race paused after that cycle shows
(`interleave.race` holds every lane's display clock at the end of the cycle allowed), so the panes
of a run stepped back to cycle k match those it showed when it was paused there.
"""

from __future__ import annotations

from dataclasses import replace

from .interleave import SideView, Snapshot


def cycle_end_s(view: SideView, cycles: int) -> float:
    """The compute time at which `view` ended its cycle number `cycles` (0: its prefill)."""
    if cycles <= 0:
        return view.prefill.seconds if view.prefill is not None else 0.0
    return view.blocks[cycles - 1].elapsed_s


def _cut(view: SideView, until_s: float, blocks: tuple | None = None) -> SideView:
    """`view` with only what it had computed by `until_s` (its own blocks `blocks` when given)."""
    prefill = view.prefill if view.prefill is not None and view.prefill.seconds <= until_s else None
    if blocks is None:
        blocks = tuple(block for block in view.blocks if block.elapsed_s <= until_s) if prefill is not None else ()
    whole = len(blocks) == len(view.blocks) and view.summary is not None and view.summary.total_s <= until_s
    return replace(
        view, prefill=prefill, blocks=blocks, summary=view.summary if whole else None,
        elapsed_s=view.summary.total_s if whole else max(min(view.elapsed_s, until_s), 0.0),
        timeline=tuple(point for point in view.timeline if point[0] <= until_s),
    )


def as_of(snap: Snapshot, lane: str, cycles: int) -> Snapshot:
    """`snap` as it stood when `lane` had ended `cycles` cycles (1 to its cycles shown), marked paused
    and not done: a run looked at, not one that plays or has ended."""
    view = snap.lanes[lane]
    if not 1 <= cycles <= len(view.blocks):
        raise ValueError(f"cycle {cycles} is not one of the {len(view.blocks)} cycles of the {lane} lane shown")
    until_s = cycle_end_s(view, cycles)
    lanes = {name: _cut(other, until_s, view.blocks[:cycles] if name == lane else None)
             for name, other in snap.lanes.items()}
    if len(view.blocks) == cycles and view.summary is not None:  # its last cycle: the lane as it ended
        lanes[lane] = view
    return replace(snap, lanes=lanes, done=False, stopped=False, paused=True, idle=False, released=None)
