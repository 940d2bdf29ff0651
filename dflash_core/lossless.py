"""The lossless check: DFlash's greedy output against plain decoding's, in three cases.

- `identical`: the same tokens.
- `near_tie`: the outputs first differ at a position where the target's own scores for the two
  tokens are within rounding of each other (`NEAR_TIE_ULPS` units in the last place of the largest
  score, in the target's dtype). A block verification and a one-token step run different kernels
  (in bf16 on a GPU, or on a CPU without batch invariance), and they may round such a tie
  differently; both continuations are then what the target "would" say. Reported with the
  position, both tokens and the target's top-2 margin there.
- `diverged`: they differ where the target's choice was clear: a bug, shown as one.

The target's scores at the first difference come from one extra forward pass over the prompt and
the common prefix, on a wrapper of its own, so the runs' caches are untouched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

VerdictKind = Literal["identical", "near_tie", "diverged"]
# A tie is "near" when both tokens score within this many ulps (of the largest score, in the
# target's dtype) of the best token. Rounding one matmul differently moves a logit by about one
# ulp; the layers before it add a few more.
NEAR_TIE_ULPS = 4


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    position: int | None = None  # index into the generated tokens of the first difference
    dflash_token: int | None = None
    plain_token: int | None = None
    top2_margin: float | None = None  # the target's best score minus its second best, there
    gap: float | None = None  # |score(plain token) - score(dflash token)|
    tolerance: float | None = None  # the near-tie bound at that position
    dtype: str = ""

    @property
    def lossless(self) -> bool:
        return self.kind != "diverged"

    def message(self) -> str:
        if self.kind == "identical":
            return "identical to plain decoding"
        where = (
            f"at token {self.position} (DFlash {self.dflash_token}, plain {self.plain_token}; the target's top-2 "
            f"margin there is {self.top2_margin:.3g}, the two tokens {self.gap:.3g} apart, tolerance {self.tolerance:.3g})"
        )
        if self.kind == "near_tie":
            return (
                f"diverged at a near-tie {where}: {self.dtype} block verification and one-token steps may round "
                "such ties differently; both continuations are the target's"
            )
        return f"DIVERGED {where}: the target's choice was clear, so this is a bug"

    def to_dict(self) -> dict:
        return {**asdict(self), "message": self.message()}


def first_difference(a, b) -> int | None:
    """Index of the first position where the two outputs differ (None when identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def tie_tolerance(logits) -> float:
    """`NEAR_TIE_ULPS` ulps of the largest score, in the scores' dtype."""
    import torch

    return NEAR_TIE_ULPS * torch.finfo(logits.dtype).eps * max(1.0, float(logits.abs().max()))


def compare(target, prompt_ids, dflash_ids, plain_ids) -> Verdict:
    """Classify greedy DFlash output `dflash_ids` against plain decoding's `plain_ids` (see the module doc).

    torch is imported here, not at the top: a replay-only app reads `first_difference` without it.
    """
    import torch

    from .models.target import Target

    dflash_ids, plain_ids = [int(t) for t in dflash_ids], [int(t) for t in plain_ids]
    i = first_difference(dflash_ids, plain_ids)
    dtype = str(target.dtype).removeprefix("torch.")
    if i is None:
        return Verdict("identical", dtype=dtype)
    if i >= min(len(dflash_ids), len(plain_ids)):
        # Same tokens, one run stopped earlier: a stop token the other did not emit would differ in
        # ids, so this is a length bug, never rounding.
        return Verdict("diverged", position=i, dtype=dtype)
    probe = Target(target.model)  # its own cache: the runs' caches stay as they are
    ids = torch.tensor([[*prompt_ids, *plain_ids[:i]]], device=target.device)
    with torch.inference_mode():
        logits, _ = probe.forward(ids, last_logits_only=True)
    scores = logits[-1]
    top = scores.float().topk(2).values
    tolerance = tie_tolerance(scores)
    d, p = dflash_ids[i], plain_ids[i]
    best = float(top[0])
    near = all(best - float(scores[t]) <= tolerance for t in (d, p))
    return Verdict(
        "near_tie" if near else "diverged", position=i, dflash_token=d, plain_token=p,
        top2_margin=float(top[0] - top[1]), gap=abs(float(scores[p]) - float(scores[d])), tolerance=tolerance,
        dtype=dtype,
    )
