"""Measured acceptance against what the drafter's card states.

A card states its figure in its YAML front matter (the Hugging Face model card header), under a
`dflash` key: `tau` (mean acceptance length, bonus included), and optionally the `prompts` set it
was measured on (a name under assets/prompts or a path), `max_new_tokens` and `block_size`:

    ---
    dflash:
      tau: 1.668
      prompts: natural
      max_new_tokens: 128
      block_size: 4
    ---

The doctor then decodes that set (a few prompts of it) and compares.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .measure import Measurement
from .report import Check

GOOD_SHARE, POOR_SHARE = 0.7, 0.4  # of the stated gain (tau - 1): at least PASS; below POOR, FAIL
COLLAPSED_SLOT1 = 0.10  # first-draft acceptance under which a drafter with no stated figure is called collapsed


@dataclass(frozen=True)
class Stated:
    tau: float
    prompts: str | None = None
    max_new_tokens: int | None = None
    block_size: int | None = None


def stated_acceptance(drafter_dir: str | Path) -> Stated | None:
    """The `dflash` figures of the card's front matter (README.md beside config.json), or None."""
    card = Path(drafter_dir) / "README.md"
    if not card.is_file():
        return None
    from huggingface_hub import metadata_load

    block = (metadata_load(card) or {}).get("dflash")
    if not isinstance(block, dict) or not isinstance(block.get("tau"), (int, float)):
        return None
    return Stated(float(block["tau"]), block.get("prompts"), block.get("max_new_tokens"), block.get("block_size"))


def stated_mask_token_id(drafter_dir: str | Path) -> int | None:
    """The mask token id the card's front matter names (`dflash: mask_token_id: ...`), or None."""
    card = Path(drafter_dir) / "README.md"
    if not card.is_file():
        return None
    from huggingface_hub import metadata_load

    block = (metadata_load(card) or {}).get("dflash")
    value = block.get("mask_token_id") if isinstance(block, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


TEXT = (
    "tau is how many tokens each cycle commits: the drafts the target accepted plus the one token the "
    "target adds itself, so 1.0 means no draft was ever accepted and the drafter only costs time. The "
    "per-slot shares say how often the 1st, 2nd, ... draft of a block was accepted; later slots are "
    "harder. A card's figure comes from its own prompts and lengths, so a few prompts here land near "
    "it, not on it; far below it, something on this side is wrong, and the other checks say what."
)


def acceptance_check(measured: Measurement, stated: Stated | None) -> Check:
    slots = ", ".join(f"{p:.0%}" for p in measured.per_slot)
    summary = f"tau {measured.tau:.2f} over {measured.cycles} cycles at block {measured.block_size}; per slot {slots}"
    numbers = {**measured.to_dict(), "stated": None if stated is None else asdict(stated)}
    title = "measured acceptance"
    if stated is None:
        if measured.per_slot and measured.per_slot[0] < COLLAPSED_SLOT1:
            return Check("acceptance", title, "WARN", summary + "; the card states no tau, and the first draft is "
                         "almost never accepted", TEXT, "acceptance collapsed (no stated figure to compare)", numbers)
        return Check("acceptance", title, "PASS", summary + "; the card states no tau", TEXT, numbers=numbers)
    share = (measured.tau - 1) / (stated.tau - 1) if stated.tau > 1 else 1.0
    numbers["share_of_stated_gain"] = round(share, 3)
    summary += f"; the card states {stated.tau:.2f}" + (f" ({stated.prompts})" if stated.prompts else "")
    if share >= GOOD_SHARE:
        return Check("acceptance", title, "PASS", summary, TEXT, numbers=numbers)
    status = "WARN" if share >= POOR_SHARE else "FAIL"
    return Check("acceptance", title, status, summary + f": {share:.0%} of its gain over plain decoding", TEXT,
                 f"tau far below the card's {stated.tau:.2f}", numbers)
