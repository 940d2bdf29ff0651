"""Acceptance rules: how many draft tokens the target keeps, and its own next ("bonus") token.

These are the exact PyTorch references; `kernels/` holds fused versions for CUDA. Every rule
returns `(accepted, bonus_id)` for one block: `draft_ids` [B-1] against target scores at the
B block slots (slot i scores the token after slot i).
"""

from __future__ import annotations

import torch

from .sampling import SamplingParams, probabilities, sample
from . import kernels


def greedy_verify_reference(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """[accepted, bonus] as an int64 device tensor: the reference for `kernels.verify`'s greedy mode."""
    choice = target_logits.argmax(dim=-1)
    accepted = torch.cumprod(draft_ids == choice[:-1], dim=0).sum()
    return torch.stack([accepted, choice[accepted]])


def greedy_accept(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Keep the longest draft prefix equal to the target's argmax; the bonus is the argmax after it."""
    accepted, bonus = kernels.greedy_verify(draft_ids, target_logits).tolist()  # the cycle's one host sync
    return accepted, bonus


def truncation_cutoff(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """Per-row lowest kept tempered score under top-k/top-p ([n] float32), or None without truncation.

    Keeping the tokens with `logits / T >= cutoff` is the truncation of `sampling.probabilities`,
    except that tokens tied with the top-p boundary token are all kept (a sort breaks such ties
    arbitrarily; a threshold cannot and need not).
    """
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    cutoff = None
    if 0 < params.top_k < vocab:
        cutoff = torch.topk(scores, params.top_k, dim=-1).values[..., -1]
        scores = scores.masked_fill(scores < cutoff[..., None], float("-inf"))
    if params.top_p < 1.0:
        sorted_scores = torch.sort(scores, dim=-1, descending=True).values
        sorted_probs = sorted_scores.softmax(dim=-1)
        kept = ((sorted_probs.cumsum(dim=-1) - sorted_probs) < params.top_p).sum(dim=-1).clamp_min(1)
        top_p_cutoff = sorted_scores.gather(-1, (kept - 1)[..., None]).squeeze(-1)
        cutoff = top_p_cutoff if cutoff is None else torch.maximum(cutoff, top_p_cutoff)
    return cutoff


def match_sampled_verify_reference(draft_ids, target_logits, temperature: float, cutoff, uniforms) -> torch.Tensor:
    """Uniform-driven `match_sampled_accept`: [accepted, bonus] as an int64 device tensor.

    The target's sample at each slot is the Gumbel-max draw argmax(logits / T + g) with
    g = -log(-log(uniforms)), over tokens whose tempered score is >= `cutoff` (None: all). This is
    an exact sample of the truncated softmax, and the reference for `kernels.verify`'s sampled mode:
    both consume the same uniforms, so they can be compared exactly.
    """
    scores = target_logits.float() / temperature
    if cutoff is not None:
        scores = scores.masked_fill(scores < cutoff[..., None], float("-inf"))
    choice = (scores + -torch.log(-torch.log(uniforms.float()))).argmax(dim=-1)
    accepted = torch.cumprod(draft_ids == choice[:-1], dim=0).sum()
    return torch.stack([accepted, choice[accepted]])


def match_sampled_accept(draft_ids, target_probs, generator) -> tuple[int, int]:
    """Deterministic draft: sample the target at every slot and keep the draft while it equals the sample.

    Exact: each emitted token is a fresh sample of the target at its position.
    """
    choice = sample(target_probs, generator)
    accepted = int(torch.cumprod(draft_ids == choice[:-1], dim=0).sum())
    return accepted, int(choice[accepted])


def rejection_accept(draft_ids, draft_probs, target_probs, generator) -> tuple[int, int]:
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
    if accepted == n:
        return accepted, int(sample(target_probs[n : n + 1], generator))
    residual = (target_probs[accepted] - draft_probs[accepted]).clamp_min(0)
    if residual.sum() <= 0:  # p == q up to rounding: the residual is undefined, p itself is exact
        residual = target_probs[accepted]
    return accepted, int(sample((residual / residual.sum())[None], generator))


def accept(draft_ids, target_logits, params: SamplingParams, generator=None, draft_probs=None) -> tuple[int, int]:
    """Dispatch to the rule matching the sampling mode and the way the draft was made."""
    if params.greedy:
        return greedy_accept(draft_ids, target_logits)
    target_probs = probabilities(target_logits, params)
    if draft_probs is None:
        return match_sampled_accept(draft_ids, target_probs, generator)
    return rejection_accept(draft_ids, draft_probs, target_probs, generator)
