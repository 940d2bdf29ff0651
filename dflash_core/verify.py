"""Acceptance rules: how many draft tokens the target keeps, and its own next ("bonus") token.

Every rule returns `[accepted, bonus_id]` (an int64 device tensor, so the caller decides when the
host waits for it) for one block: `draft_ids` [B-1] against the target's
scores at the B block slots (slot i scores the token after slot i). Greedy acceptance runs through
`kernels.greedy_verify` (fused on CUDA, PyTorch elsewhere); the sampled rules are PyTorch.
Given a `record` dict, a rule also leaves there the tensors its decision was made from (the target
distribution, its samples, the uniform draws), so an explanation reports them without redrawing.
"""

from __future__ import annotations

import torch

from .sampling import SamplingParams, probabilities, sample
from .speed import kernels


def pick(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`rows[index]` for a 0-dim device index, without the host read that indexing with it makes
    (PyTorch turns a 0-dim integer tensor index into a Python int, i.e. `.item()`)."""
    return rows.index_select(0, index.view(1))[0]


def greedy_accept(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Keep the longest draft prefix equal to the target's argmax; the bonus is the argmax after it."""
    return kernels.greedy_verify(draft_ids, target_logits)


def match_sampled_accept(draft_ids, target_probs, generator, record: dict | None = None) -> torch.Tensor:
    """Deterministic draft: sample the target at every slot and keep the draft while it equals the sample.

    Exact: each emitted token is a fresh sample of the target at its position.
    """
    choice = sample(target_probs, generator)
    if record is not None:
        record["choice"] = choice
    accepted = torch.cumprod(draft_ids == choice[:-1], dim=0).sum()
    return torch.stack([accepted, pick(choice, accepted)])


def rejection_accept(draft_ids, draft_probs, target_probs, generator, record: dict | None = None) -> torch.Tensor:
    """Sampled draft (token i drawn from `draft_probs[i]`): speculative rejection sampling.

    Token i is kept with probability min(1, p_i(x)/q_i(x)); the first rejected slot is resampled
    from normalize(max(0, p_i - q_i)); if all are kept the bonus is drawn from p at the last slot.
    The distribution to draw from is picked on the device, so nothing waits for the host.
    """
    n = draft_ids.shape[0]
    rows = torch.arange(n, device=draft_ids.device)
    p = target_probs[rows, draft_ids]
    q = draft_probs[rows, draft_ids]
    u = torch.rand(n, generator=generator, device=draft_ids.device)
    keep = u * q < p  # u < p/q without dividing by a q that rounds to zero
    if record is not None:
        record.update(p=p, q=q, u=u)
    accepted = torch.cumprod(keep, dim=0).sum()
    # Row a of [residuals; p at the last slot]: the residual after a rejection at slot a < n, or
    # the bonus distribution when every draft was kept (a == n).
    residual = pick(torch.cat([(target_probs[:n] - draft_probs).clamp_min(0), target_probs[n:]]), accepted)
    total = residual.sum()
    # p == q up to rounding leaves no residual: p itself is then exact.
    dist = torch.where(total > 0, residual / total, pick(target_probs, accepted))
    return torch.stack([accepted, sample(dist[None], generator)[0]])


def accept(
    draft_ids, target_logits, params: SamplingParams, generator=None, draft_probs=None, record: dict | None = None
) -> torch.Tensor:
    """[accepted, bonus] as a device tensor (no host sync), by the rule matching the sampling mode
    and the way the draft was made.

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
