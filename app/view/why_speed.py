"""What a finished race's speedup means, in this run's numbers: the costs of a DFlash cycle counted
in plain decoding steps, why a speedup below 1 came out (the cycle cost more plain steps than it kept
tokens), and what the speedup model (`speedup.py`) gives at the same acceptance where a verify of the
whole block costs about one plain step, as on a GPU. The what-if model reads the same numbers from
the summary (`run_data`), so it never asks the server.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from .speedup import Costs, effective_acceptance, run_costs, speedup


@dataclass(frozen=True)
class CycleCost:
    """A lane's mean cycle in plain decoding steps, and what it kept."""

    block_size: int
    tau: float  # tokens kept per cycle, the bonus counted
    verify: float  # plain steps
    draft: float
    other: float
    rates: tuple[float, ...]  # per-slot cumulative acceptance r_1..r_(B-1)

    @property
    def cycle(self) -> float:
        return self.verify + self.draft + self.other

    @property
    def acceptance(self) -> float:
        """The per-slot acceptance a whose geometric tau equals this run's."""
        return effective_acceptance(self.tau, self.block_size)

    def on_one_step_verify(self) -> float:
        """The model's speedup at this acceptance and draft cost with a verify of one plain step."""
        return speedup(list(self.rates), Costs(self.draft, 1.0, self.other, 1.0))


def cycle_cost(lane, plain) -> CycleCost | None:
    """The mean cycle of `lane` (a `Summary`) in plain steps of `plain`; None without cycles or drafts."""
    costs = None if lane is None or plain is None or lane.block_size < 2 else run_costs(lane, plain)
    if costs is None or costs.plain <= 0:
        return None
    step = costs.plain
    return CycleCost(lane.block_size, lane.tau, costs.verify / step, costs.draft / step, costs.other / step,
                     tuple(lane.per_position_acceptance))


def why_html(cost: CycleCost | None, measured: float | None) -> str:
    """The sentence under a finished race's numbers: why DFlash was slower than plain decoding (only
    when it was), and the model's figure for a one-step verify; plus the run's numbers as data."""
    if cost is None:
        return ""
    data = (f'<span class="run-model" hidden data-a="{cost.acceptance:.4f}" data-v="{cost.verify:.4f}" '
            f'data-c="{cost.draft:.4f}" data-o="{cost.other:.4f}" data-b="{cost.block_size}" '
            f'data-s="{measured if measured is not None else 0:.4f}"></span>')
    if measured is None or measured >= 1:
        return data
    text = (
        f"Why slower than plain decoding here: each DFlash cycle kept {cost.tau:.2f} tokens (tau) but cost "
        f"{cost.cycle:.2f} plain steps: the target's verify of {cost.block_size} tokens {cost.verify:.2f}, the "
        f"drafter {cost.draft:.2f}, the rest {cost.other:.2f}. A speedup needs a cycle cheaper than the tokens it "
        f"keeps. Where a verify of {cost.block_size} tokens costs about one plain step, as on a GPU, the speedup "
        f"model gives {cost.on_one_step_verify():.2f}× at this run's acceptance (move the what-if model below)."
    )
    return f'<div class="why-slower">{html.escape(text)}</div>{data}'
