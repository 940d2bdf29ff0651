"""Sampling parameters and the target distribution they define.

Temperature, top-k and top-p shape the distribution `p` the output must follow (docs/design.md §4); the
same processing is applied to the drafter's logits when a draft is sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import GenerationInputError

# Dividing scores by a smaller temperature can overflow float32 (a logit of 1e3 / 1e-36 > 3.4e38) and
# leave NaN probabilities; at 1e-3 sampling already takes the top token unless another scores within
# about 0.01 of it (exp(-0.01 / 1e-3) = 5e-5).
MIN_TEMPERATURE = 1e-3


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 mean "no truncation"."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if not (self.temperature >= 0.0 and self.temperature <= 100.0):
            raise GenerationInputError(f"temperature must be in [0, 100], got {self.temperature}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise GenerationInputError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {self.temperature}: "
                "dividing the scores by a smaller one overflows them"
            )
        if not (0.0 < self.top_p <= 1.0):
            raise GenerationInputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise GenerationInputError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def greedy_ids(scores: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dimension, the first index among tied maxima as `argmax` gives it,
    through `max`, which PyTorch runs several times faster on CPU bfloat16 scores (docs/benchmarks.md,
    "Tree verification")."""
    return scores.max(dim=-1).indices


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of `logits` [n, V] turned into the sampling distribution (float32)."""
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass
        # before it already does. The top token is always kept.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    return generator


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of `probs` [n, V]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
