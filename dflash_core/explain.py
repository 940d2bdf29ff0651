"""The opt-in explanation of one decoding cycle: what the drafter saw and proposed, what the target
thought of it, why each slot was kept or rejected, cache lengths and the cycle's time split.

`explain_cycle` builds an `events.CycleExplanation` from tensors the cycle already holds (no
extra forward pass); docs/design.md §4 gives the terms, `CycleExplanation.to_dict` the trace's
JSON form. A top-k list reports the sampling distribution (`distribution`). A DFlash2 cycle also
carries its selector's walk (`events.SelectorPath`): each slot's candidates and the one chosen.
"""

from __future__ import annotations

import torch

from .events import CacheLengths, CycleExplanation, CycleTimes, Decision, Injected, SelectorPath, SlotVerdict, TopK
from .sampling import SamplingParams, probabilities


def _topk_lists(probs: torch.Tensor, k: int, chosen: list[int | None]) -> tuple[TopK, ...]:
    """Rows of `probs` [n, V] as ((id, prob), ...) of their k most likely ids.

    chosen[i] is the token the cycle decided at row i (a draft, an accepted token, the bonus) or
    None. `topk` and `argmax` break exact ties differently, so among ids tied in probability the
    chosen one is listed first: the list then agrees with the decision it explains.
    """
    if probs.shape[0] == 0:  # a cycle with nothing drafted (prompt lookup found no match)
        return ()
    k = min(k, probs.shape[-1])
    values, ids = torch.topk(probs, k, dim=-1)
    picks = [chosen[row] if row < len(chosen) else None for row in range(probs.shape[0])]
    index = torch.tensor([[pick or 0] for pick in picks], device=probs.device)
    picked_p = probs.gather(-1, index)[:, 0].tolist()
    rows = []
    for row_ids, row_p, pick, p in zip(ids.tolist(), values.tolist(), picks, picked_p):
        pairs = [(i, q) for i, q in zip(row_ids, row_p) if i != pick]
        if pick is not None:
            at = next((j for j, (_, q) in enumerate(pairs) if q <= p), len(pairs))
            pairs = pairs[:at] + [(pick, p)] + pairs[at:]
        rows.append(tuple(pairs[:k]))
    return tuple(rows)


def distribution(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """What a top-k list reports: the sampling distribution, or the softmax of the raw logits when greedy."""
    return logits.float().softmax(dim=-1) if sampling.greedy else probabilities(logits, sampling)


def explain_cycle(
    k: int,
    *,
    sampling: SamplingParams,
    target,
    block_ids: torch.Tensor,
    target_logits: torch.Tensor,
    record: dict,
    accepted: int,
    bonus: int,
    times: CycleTimes,
    drafting,
) -> CycleExplanation:
    """The explanation of one cycle, called once the cycle has committed (target cache cropped).

    block_ids: [1, B] the verified block (slot 0, then the B-1 drafts).
    target_logits: [B, V] the target's logits at the block slots.
    record: what `verify.accept` left (sampling distribution, samples, uniforms); empty when greedy.
    drafting: the cycle's `drafting.DraftView`, or None for plain decoding.
    """
    draft = block_ids[0, 1:]
    n = draft.shape[0]
    position = target.cache_length - accepted - 1  # slot 0's position: the cache now ends at the bonus
    draft_probs = drafting.probs() if drafting is not None else None
    cache = drafting.cache if drafting is not None else None
    injected = drafting.injected if drafting is not None else 0
    if sampling.greedy:
        rule, target_probs = "greedy", target_logits.float().softmax(dim=-1)
    else:
        rule = "rejection" if "u" in record else "match"
        target_probs = record["target_probs"]
    slots = []
    checked = min(accepted + 1, n)  # up to and including the first rejected slot
    if checked:
        rows = torch.arange(checked, device=draft.device)
        ids = draft[:checked]
        p = target_probs[rows, ids].tolist()
        q = draft_probs[rows, ids].tolist()
        if rule == "greedy":
            target_ids = target_logits[:checked].argmax(dim=-1).tolist()
        elif rule == "match":
            target_ids = record["choice"][:checked].tolist()
        else:  # the rejection rule has no target token per slot; the rejected one is replaced by the bonus
            target_ids = [None] * checked
            if accepted < n:
                target_ids[accepted] = bonus
        u = record["u"][:checked].tolist() if rule == "rejection" else [None] * checked
        for i, draft_id in enumerate(ids.tolist()):
            ratio = p[i] / q[i] if rule == "rejection" and q[i] > 0 else None
            slots.append(SlotVerdict(i + 1, draft_id, target_ids[i], p[i], q[i], ratio, u[i], i < accepted))
    # Row i of the target's scores decided the token after slot i: the accepted drafts, then the bonus.
    decided = draft[:accepted].tolist() + [bonus]
    return CycleExplanation(
        slot0_id=int(block_ids[0, 0]),
        mask_id=drafting.mask_id if drafting else None,
        positions=tuple(range(position, position + n + 1)),
        injected=Injected(injected, tuple(drafting.target_layers) if drafting else ()),
        draft_topk=_topk_lists(draft_probs, k, draft.tolist()) if drafting else (),
        target_topk=_topk_lists(target_probs, k, decided),
        decision=Decision(rule, tuple(slots), rule == "rejection" and accepted < n),
        cache=CacheLengths(
            target_before=position,
            target_after=target.cache_length,
            drafter_before=cache.length - injected if cache is not None else 0,
            drafter_after=cache.length if cache is not None else 0,
        ),
        time=times,
        path=_selector_path(drafting.path()) if drafting is not None and drafting.path is not None else None,
    )


def _selector_path(walk) -> SelectorPath:
    """A DFlash2 cycle's walk (`drafting.selector_walk`) as host values."""
    candidates, probs, chosen = walk
    return SelectorPath(tuple(map(tuple, candidates.tolist())), tuple(map(tuple, probs.tolist())), tuple(chosen.tolist()))
