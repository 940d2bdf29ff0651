"""Prompt lookup: a drafter with no model that copies what followed an earlier match of the context's end.

Each cycle the context (the prompt and every token generated so far, the bonus token last) is
searched for an earlier occurrence of its last n tokens, for each n of `ngram_sizes` from the
longest; the most recent occurrence followed by B-1 tokens wins (else the one followed by the
most), and the tokens that followed it are the draft. Without a match the draft is empty and the cycle is a plain decoding step. The drafts are
deterministic (q is a point mass), so sampling verifies them by the match rule (verify.py), which
is exact. Copying wins where the output repeats its input: code edits, quoted names, lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafting import DraftView, Proposal, RunSettings
from .errors import GenerationInputError
from .ngram import DEFAULT_NGRAM_SIZES, lookup

__all__ = ["DEFAULT_NGRAM_SIZES", "PromptLookup", "lookup"]


@dataclass(frozen=True)
class PromptLookup:
    """The prompt-lookup drafter: proposes up to `block_size - 1` copied tokens per cycle."""

    block_size: int = 4
    ngram_sizes: tuple[int, ...] = DEFAULT_NGRAM_SIZES
    method = "lookup"
    target_layer_ids = ()  # it reads no target features

    def __post_init__(self):
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2:
            raise GenerationInputError(f"prompt lookup needs block_size >= 2 (1 + the drafts), got {self.block_size!r}")
        sizes = tuple(self.ngram_sizes)
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise GenerationInputError(f"ngram_sizes must be positive integers, got {self.ngram_sizes!r}")
        # Longest first: a longer match is the stronger evidence that the text repeats.
        object.__setattr__(self, "ngram_sizes", tuple(sorted(set(sizes), reverse=True)))

    def session(self, run: RunSettings) -> "_LookupSession":
        return _LookupSession(self, run)


class _LookupSession:
    """One run's context, kept on the host: the loop already reads each cycle's tokens there."""

    target_layer_ids = ()

    def __init__(self, drafter: PromptLookup, run: RunSettings):
        self.drafter, self.run = drafter, run

    def prefill(self, prompt_ids, bonus, context) -> None:
        self.context = [*prompt_ids, bonus]

    def draft(self, bonus_ids, start, explain, length=None) -> Proposal:
        found = lookup(self.context, self.drafter.ngram_sizes, self.run.block_size - 1 if length is None else length)
        ids = torch.tensor(found, dtype=torch.long, device=self.run.target.device)
        view = None
        if explain:
            vocab = self.run.target.vocab_size
            view = DraftView(None, (), 0, None, lambda: torch.nn.functional.one_hot(ids, vocab).float())
        return Proposal(ids, None, 0, view)

    def advance(self, accepted, committed, features) -> None:
        self.context.extend(committed)
