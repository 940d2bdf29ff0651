"""An oracle drafter: plain decoding's own continuation, with slots corrupted on a fixed schedule.

Checks and benchmarks need acceptance known in advance. `OracleDrafter` wraps a real drafter
(whose forward and LM head still run, so a cycle costs what it would) and replaces its proposal:
for the block whose slot 0 is generated token s, it proposes `plan[s+1 : s+B]`, the continuation
plain decoding produced, except that in cycle c the slot `schedule[c]` (1-based: the first
`schedule[c] - 1` drafts stay right) is corrupted. Greedy verification then accepts exactly
`schedule[c] - 1` drafts in cycle c, so the acceptance lengths must equal the schedule (capped at
B) and the output must equal plain decoding: both are checked by scripts/gpu_check.py.

Everything the oracle needs per cycle is on the device before decoding starts (the plan and a
corruption mask per cycle); the decoding loop tells it the slot-0 position, known on the host
(`before_draft`), so the oracle adds no host sync. It picks the proposal there, outside the draft
step, into a buffer the step reads: the step stays the same launches every cycle, so it can be
replayed from a CUDA graph (`dflash_core/speed/cuda_graphs.py`).
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from ..models.drafter import DFlashDrafter, DrafterCache

CONFIDENT = 30.0  # logit of the proposed token (0 elsewhere): a point mass after softmax


def expected_lengths(schedule, block_size: int, cycles: int) -> list[int]:
    """Acceptance lengths the first `cycles` cycles must show: the schedule, repeated, capped at B."""
    return [min(length, block_size) for length in itertools.islice(itertools.cycle(schedule), cycles)]


def schedule_for_tau(tau: float, block_size: int) -> list[int]:
    """A short repeating schedule of acceptance lengths whose mean is `tau` (halves alternate)."""
    low = int(tau)
    if not 1 <= low <= block_size or (tau != low and low + 1 > block_size):
        raise ValueError(f"tau {tau} is not reachable with block size {block_size}")
    if tau == low:
        return [low]
    if tau * 2 != int(tau * 2):
        raise ValueError(f"tau {tau} must be a whole or a half number")
    return [low, low + 1]


class OracleDrafter(nn.Module):
    """Proposes `plan`'s continuation with the slot `schedule[c]` of cycle c corrupted (see module doc).

    plan: the plain decoding output ids (at least max_new_tokens + block_size of them);
    schedule: acceptance lengths per cycle, repeated; vocab_size: the target's.
    """

    def __init__(self, inner: DFlashDrafter, plan, schedule, vocab_size: int, max_cycles: int = 4096):
        super().__init__()
        self.inner = inner
        self.draft_vocab = None  # proposals are target ids; the inner drafter's head still runs
        self.vocab_size = vocab_size
        self.schedule = list(schedule)
        device = inner.fc.weight.device
        b = inner.block_size
        self.plan = torch.tensor(list(plan) + [0] * b, dtype=torch.long, device=device)
        lengths = expected_lengths(self.schedule, b, max_cycles)
        corrupt = torch.zeros(max_cycles, b - 1, dtype=torch.long)
        for c, length in enumerate(lengths):
            if length < b:
                corrupt[c, length - 1] = 1  # slot `length` is wrong: `length - 1` drafts accepted
        self.corrupt = corrupt.to(device)
        self.cycle = 0
        self._proposal = torch.zeros(b - 1, dtype=torch.long, device=device)

    # What the decoding loop reads of a drafter, passed through.
    block_size = property(lambda self: self.inner.block_size)
    mask_token_id = property(lambda self: self.inner.mask_token_id)
    target_layer_ids = property(lambda self: self.inner.target_layer_ids)
    dtype = property(lambda self: self.inner.dtype)

    def new_cache(self, capacity: int | None = None) -> DrafterCache:
        self.cycle = 0  # a new run starts
        return self.inner.new_cache(capacity)

    def before_draft(self, start: int) -> None:
        if self.cycle == 0:
            self._prompt_len = start  # slot 0 of the first block holds the prefill's token, plan[0]
        first = start - self._prompt_len + 1  # plan index of the first drafted slot
        drafts = self.plan[first : first + self.block_size - 1]
        torch.remainder(drafts + self.corrupt[self.cycle], self.vocab_size, out=self._proposal)
        self.cycle += 1

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def draft_head(self, lm_head):
        return self.inner.draft_head(lm_head)

    def draft_logits(self, hidden, lm_head, anchor_ids=None) -> torch.Tensor:
        self.inner.draft_logits(hidden, lm_head, anchor_ids)  # the real head's cost; its scores are replaced
        logits = torch.zeros(hidden.shape[0], self.vocab_size, dtype=self.dtype, device=hidden.device)
        # A block schedule may draft fewer slots than the block: the plan's first ones.
        return logits.scatter_(1, self._proposal[: hidden.shape[0], None], CONFIDENT)

    propose = DFlashDrafter.propose  # its proposal is plain logits, whatever the inner drafter's kind

    def to_target_ids(self, index: torch.Tensor) -> torch.Tensor:
        return index

    def full_logits(self, draft_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        return draft_logits.float()
