"""What one frame of a race may cost: the bytes of HTML each part of it may take, and the helper
that keeps the newest pieces of a part within its budget.

A frame redraws every pane, draft strip and the cycle view whole, so what it costs grows with the
race and with the length of its texts; a replayed trace chooses both. Each part draws its newest
pieces (tokens, blocks, slots) until its budget is spent and says how many earlier ones it left
out (`first_within`); hover boxes have budgets of their own, given to the newest tokens first (older ones keep
their one-line title). The budgets are set above what the app's own races draw (measured on the
shipped 128-token races, block 4), so those are drawn whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from ..race.lanes import LANES

T = TypeVar("T")

# Token spans of one pane (text, class, title): about 140 bytes a token (260 while the colour was
# inline), so a race of the app's most tokens (512, --max-new-tokens) takes about 72 KB and is drawn whole.
PANE_BYTES = 160_000
# Hover boxes of one pane: the shipped 128-token races' take at most 97 KB; a longer race keeps them
# for its newest tokens (a final frame is kept per session by Gradio: this bounds what it holds).
PANE_TIPS_BYTES = 112_000
# Rows of one draft strip (at most its last 40 blocks): 40 rows at block 16 take about 85 KB (chips
# styled by class; 160 KB while the style was inline).
STRIP_BYTES = 192_000
# Hover boxes of one draft strip: 40 rows at block 4 take at most 115 KB.
STRIP_TIPS_BYTES = 128_000
# The "Inside a cycle" view (also the cycle picker's answer): a block-4 cycle takes 6 KB, a
# block-16 one about 20 KB.
CYCLE_BYTES = 48_000
# The summary, the status lines and the markup around the parts: a few KB.
OTHER_BYTES = 16_000
# The most HTML one frame sends: every lane's pane and every drafting lane's strip at their budgets.
FRAME_BYTES = (len(LANES) * (PANE_BYTES + PANE_TIPS_BYTES) + (len(LANES) - 1) * (STRIP_BYTES + STRIP_TIPS_BYTES)
               + CYCLE_BYTES + OTHER_BYTES)


def first_within(items: Iterable[T], size: Callable[[T], int], budget: int) -> list[T]:
    """The first of `items` while their sizes add up to at most `budget` bytes; `items` may be a
    generator, so that those past the budget are never built."""
    kept: list[T] = []
    for item in items:
        budget -= size(item)
        if budget < 0:
            break
        kept.append(item)
    return kept
