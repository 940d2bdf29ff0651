"""The lanes a race can hold, as the page names and colors them (the order is `dflash_core.trace.RUNS`)."""

from __future__ import annotations

from dflash_core.trace import RUNS as LANES

__all__ = ["CHOICES", "COLORS", "CYCLE_LANES", "DRAFTER_LANES", "LABELS", "LANES", "MAX_TREE_BUDGET", "RESEARCH_LANES",
           "TREE_BUDGET", "lane_title"]

LABELS = {"dflash": "DFlash", "scheduled": "DFlash, scheduled block", "tree": "DFlash, tree", "dflash2": "DFlash2",
          "fusion": "input fusion", "ar": "AR drafter", "lookup": "prompt lookup", "plain": "plain decoding"}
COLORS = {"dflash": "#2f9e44", "scheduled": "#0c8599", "tree": "#5f3dc4", "dflash2": "#c2255c", "fusion": "#a9861a",
          "ar": "#e8590c", "lookup": "#ae3ec9", "plain": "#4c6ef5"}
# The lanes a visitor may add (label, name); DFlash and plain decoding always race.
CHOICES = [("DFlash, scheduled block (verifies what each cycle's drafts are worth, pauses a losing drafter)", "scheduled"),
           ("DFlash, tree (verifies a tree grown from each slot's top candidates in one target pass)", "tree"),
           ("DFlash2 (one path through each slot's top candidates)", "dflash2"),
           ("input fusion (target features at the input only)", "fusion"),
           ("AR drafter (one pass per draft)", "ar"), ("prompt lookup (no model)", "lookup")]
# The lanes that race a drafter of their own, which a pair names (`pairs/pairs.json`), and what it is.
DRAFTER_LANES = {"dflash2": "DFlash2 drafter", "fusion": "input-fusion drafter", "ar": "autoregressive drafter"}
# The lanes whose cycles "Inside a cycle" lays out, each in its own words (`view/lane_cycles.py`).
CYCLE_LANES = ("dflash", "scheduled", "tree", "dflash2", "fusion", "ar", "lookup")
# Lanes of research interest (ablations, a newer drafter): offered under "More lanes", not beside the basics.
RESEARCH_LANES = ("tree", "dflash2", "fusion")
# The tree lane's draft nodes per cycle unless the visitor sets them, and the most it may set. 4 is
# the budget that paid best on the CPU of docs/benchmarks.md ("tree verification"): a verify of many
# more rows costs more than the longer acceptance gains there.
TREE_BUDGET, MAX_TREE_BUDGET = 4, 32


def lane_title(lane: str, block_size: int) -> str:
    """The heading of a lane's pane."""
    if lane == "plain":
        return "Plain decoding"
    if lane == "ar":
        return f"AR drafter (block {block_size}: {block_size - 1} passes per cycle)"
    if lane == "lookup":
        return f"Prompt lookup (block {block_size}, no model)"
    if lane == "scheduled":
        return f"DFlash, scheduled block (1 to {block_size}, chosen each cycle; no pass while the drafter is paused)"
    if lane == "tree":
        return f"DFlash, tree (block {block_size}: 1 pass per cycle, a tree of its drafts verified in 1 target pass)"
    if lane == "dflash2":
        return f"DFlash2 (block {block_size}: 1 pass per cycle, then a path through each slot's candidates)"
    if lane == "fusion":
        return f"Input fusion (block {block_size}: 1 pass per cycle, target features at the input only)"
    return f"DFlash (block {block_size}: 1 pass per cycle)"
