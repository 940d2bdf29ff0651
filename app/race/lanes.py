"""The lanes a race can hold, as the page names and colors them (the order is `dflash_core.trace.RUNS`)."""

from __future__ import annotations

from dflash_core.trace import RUNS as LANES

__all__ = ["CHOICES", "COLORS", "LABELS", "LANES", "lane_title"]

LABELS = {"dflash": "DFlash", "scheduled": "DFlash, scheduled block", "ar": "AR drafter", "lookup": "prompt lookup",
          "plain": "plain decoding"}
COLORS = {"dflash": "#2f9e44", "scheduled": "#0c8599", "ar": "#e8590c", "lookup": "#ae3ec9", "plain": "#4c6ef5"}
# The lanes a visitor may add (label, name); DFlash and plain decoding always race.
CHOICES = [("DFlash, scheduled block (verifies what each cycle's drafts are worth)", "scheduled"),
           ("AR drafter (one pass per draft)", "ar"), ("prompt lookup (no model)", "lookup")]


def lane_title(lane: str, block_size: int) -> str:
    """The heading of a lane's pane."""
    if lane == "plain":
        return "Plain decoding"
    if lane == "ar":
        return f"AR drafter (block {block_size}: {block_size - 1} passes per cycle)"
    if lane == "lookup":
        return f"Prompt lookup (block {block_size}, no model)"
    if lane == "scheduled":
        return f"DFlash, scheduled block (1 to {block_size}, chosen each cycle: 1 pass per cycle)"
    return f"DFlash (block {block_size}: 1 pass per cycle)"
