"""One race as a visitor asked for it: `RaceRequest`, built once from the page's inputs and carried whole.

The Race handler checks the raw values once (`guard/limits.py: check_request`), the pair's kind
checks what the pair can honour (`RaceSession.check`, `VllmRaceSession.check`, which call the
engine's own checks), and the same object reaches the race session. It holds plain data only: on
ZeroGPU it is pickled into the GPU worker process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .lanes import TREE_BUDGET

if TYPE_CHECKING:  # torch comes with it: built when a race runs, not when a request is checked
    from dflash_core import SamplingParams


@dataclass(frozen=True)
class RaceRequest:
    """A checked race request: the pair it races, the prompt, the settings, the lanes (DFlash and
    plain decoding included, in the order they are shown) and the thinking switch."""

    pair_id: str
    prompt: str
    max_new_tokens: int
    block_size: int  # DFlash's tokens per cycle; the lanes derive theirs from it (`session.pair_lanes`)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    lanes: tuple[str, ...] = ("dflash", "plain")
    thinking: str | None = None  # "on" / "off" through the chat template; None: the pair's default
    tree_budget: int = TREE_BUDGET  # the tree lane's draft nodes per cycle

    @property
    def sampling(self) -> SamplingParams:
        """The engine's sampling settings (which check their own ranges)."""
        from dflash_core import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)
