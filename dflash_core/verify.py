"""Acceptance rules: how many draft tokens the target keeps, and its own next ("bonus") token.

Every rule returns `(accepted, bonus_id)` for one block: `draft_ids` [B-1] against the target's
scores at the B block slots (slot i scores the token after slot i). Greedy acceptance runs through
`kernels.greedy_verify` (fused on CUDA, PyTorch elsewhere); the sampled rules are PyTorch.
Given a `record` dict, a rule also leaves there the tensors its decision was made from (the target
distribution, its samples, the uniform draws), so an explanation reports them without redrawing.
"""

from __future__ import annotations

import torch

from . import kernels
from .sampling import SamplingParams, probabilities, sample


def greedy_accept(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Keep the longest draft prefix equal to the target's argmax; the bonus is the argmax after it."""
    accepted, bonus = kernels.greedy_verify(draft_ids, target_logits).tolist()  # the cycle's one host sync
    return accepted, bonus


def match_sampled_accept(draft_ids, target_probs, generator, record: dict | None = None) -> tuple[int, int]:
    """Deterministic draft: sample the target at every slot and keep the draft while it equals the sample.

    Exact: each emitted token is a fresh sample of the target at its position.
    """
    choice = sample(target_probs, generator)
    if record is not None:
        record["choice"] = choice
    accepted = int(torch.cumprod(draft_ids == choice[:-1], dim=0).sum())
    return accepted, int(choice[accepted])


def rejection_accept(draft_ids, draft_probs, target_probs, generator, record: dict | None = None) -> tuple[int, int]:
    """Sampled draft (token i drawn from `draft_probs[i]`): speculative rejection sampling.

    Token i is kept with probability min(1, p_i(x)/q_i(x)); the first rejected slot is resampled
    from normalize(max(0, p_i - q_i)); if all are kept the bonus is drawn from p at the last slot.
    """
    n = draft_ids.shape[0]
    rows = torch.arange(n, device=draft_ids.device)
    p = target_probs[rows, draft_ids]
    q = draft_probs[rows, draft_ids]
    u = torch.rand(n, generator=generator, device=draft_ids.device)
    keep = u * q < p  # u < p/q without dividing by a q that rounds to zero
    accepted = int(torch.cumprod(keep, dim=0).sum())
    if record is not None:
        record.update(p=p, q=q, u=u)
    if accepted == n:
        return accepted, int(sample(target_probs[n : n + 1], generator))
    residual = (target_probs[accepted] - draft_probs[accepted]).clamp_min(0)
    if residual.sum() <= 0:  # p == q up to rounding: the residual is undefined, p itself is exact
        residual = target_probs[accepted]
    return accepted, int(sample((residual / residual.sum())[None], generator))


def accept(
    draft_ids, target_logits, params: SamplingParams, generator=None, draft_probs=None, record: dict | None = None
) -> tuple[int, int]:
    """Dispatch to the rule matching the sampling mode and the way the draft was made.

    record: when given, receives the sampling distribution `target_probs` and the rule's own values.
    """
    if params.greedy:
        return greedy_accept(draft_ids, target_logits)
    target_probs = probabilities(target_logits, params)
    if record is not None:
        record["target_probs"] = target_probs
    if draft_probs is None:
        return match_sampled_accept(draft_ids, target_probs, generator, record)
    return rejection_accept(draft_ids, draft_probs, target_probs, generator, record)
