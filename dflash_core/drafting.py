"""The one drafter interface of the decoding loop: what a method proposes each cycle, and how.

`generate` (decoding.py) takes any drafter and opens one `DraftSession` per run (`open_session`):

- a DFlash or DFlash2 drafter, or DFlash's input-fusion ablation (`DFlashDrafting`): the whole
  block of B-1 drafts in one pass;
- the autoregressive drafter with the same KV injection, a `DFlashDrafter` whose config says
  `autoregressive` (`ARDrafting`): one causal pass per draft, B-1 passes per cycle;
- any object with a `session(run)` method, e.g. `prompt_lookup.PromptLookup` (no model).

Each cycle the loop asks the session for a `Proposal` (the draft ids on the device, the
distribution q they were sampled from or None for deterministic drafts, and the drafter passes it
took), verifies it in one target forward, and hands the session the outcome (`advance`). The verify
rule follows q: None is a point mass (the match rule), rows of q the rejection rule (verify.py).
Without a drafter no session is opened and each cycle verifies only the last token: plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from .explain import distribution
from .models.dflash2 import PathScores
from .models.drafter import DrafterCache, static_slots
from .sampling import SamplingParams
from .schedule import draft_confidence


@dataclass(frozen=True)
class RunSettings:
    """What a session may read of the run that opens it."""

    target: object  # the `Target`
    block_size: int  # tokens verified per cycle at most: slot 0 and up to block_size - 1 drafts
    sampling: SamplingParams
    generator: torch.Generator | None
    sample_drafts: bool  # draw drafts from q (rejection rule) rather than take its argmax
    capacity: int  # positions the run may reach
    graphs: object | None  # the target's `StepGraphs`, when its verify replays from CUDA graphs
    confidence: bool = False  # proposals carry the drafter's confidence per draft (a block schedule reads it)
    tree_width: int = 0  # proposals carry each slot's top-k of this size (tree verification, `tree.py`)


@dataclass(frozen=True)
class DraftView:
    """What an explanation reports of a cycle's drafting (explain.py)."""

    mask_id: int | None
    target_layers: tuple[int, ...]
    injected: int  # new context positions fed into the drafter this cycle
    cache: DrafterCache | None  # the drafter's cache after the cycle (its lengths are read)
    probs: Callable[[], torch.Tensor]  # [n, V] the distribution each draft was the draw or mode of
    # DFlash2: [n, K] candidates, [n, K] the selector's distribution along the walked path, [n] the
    # chosen candidate per slot (`selector_walk`); None for other drafters.
    path: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


@dataclass(frozen=True)
class Proposal:
    ids: torch.Tensor  # [n] draft target ids on the device, 0 <= n <= block_size - 1
    probs: torch.Tensor | None  # [n, V] q when the drafts were sampled from it; None: deterministic drafts
    passes: int  # drafter forward passes this proposal took
    view: DraftView | None = None  # filled when the run explains its cycles
    confidence: torch.Tensor | None = None  # [n] when the run asks: `schedule.draft_confidence`
    # When the run grows trees: each slot's top-k target ids [n, k] and their log-probabilities [n, k]
    # under the drafter, best first, from the same pass as `ids`.
    candidates: tuple[torch.Tensor, torch.Tensor] | None = None


class DraftSession(Protocol):
    """One run's drafting state. `target_layer_ids`: the target layers whose features it reads."""

    target_layer_ids: tuple[int, ...]

    def prefill(self, prompt_ids: list[int], bonus: int, context) -> None:
        """After the prefill: the prompt, its first new token, the prompt's target features."""

    def draft(self, bonus_ids: torch.Tensor, start: int, explain: bool, length: int | None = None) -> Proposal:
        """The drafts after the bonus token `bonus_ids` [1] (on the device) at position `start`:
        `length` of them (a block schedule's choice, 1 to block_size - 1), or block_size - 1 when None."""

    def advance(self, accepted: int, committed: list[int], features) -> None:
        """After the verify: drafts kept, the tokens the cycle added (kept drafts, then the new bonus),
        and the target features of the verified block."""

    def sit_out(self) -> None:
        """Before the verify of a cycle that drafts nothing (a paused block schedule)."""

    def carry(self, features) -> None:
        """After that verify: the target features of its one token, for the next draft to take with
        the ones the drafter has not seen yet."""


class Drafter(Protocol):
    """A drafter without a model of this engine's kind (e.g. prompt lookup)."""

    block_size: int

    def session(self, run: RunSettings) -> DraftSession: ...


def open_session(drafter, run: RunSettings) -> DraftSession:
    """The session of `drafter` for one run (see the module doc for the kinds)."""
    if hasattr(drafter, "session"):
        return drafter.session(run)
    if getattr(drafter, "autoregressive", False):
        return ARDrafting(drafter, run)
    return DFlashDrafting(drafter, run)


class _InjectedContext:
    """What both model drafters share: the target features the drafter has not seen yet, kept
    between cycles, and the drafter's own cache of their keys and values."""

    def __init__(self, drafter, run: RunSettings, cache: DrafterCache):
        self.drafter, self.run, self.cache = drafter, run, cache
        self.target_layer_ids = tuple(drafter.target_layer_ids)
        self.padded = False  # whether `context` carries a verified block's rejected rows as padding

    def prefill(self, prompt_ids, bonus, context) -> None:
        self.context, self.fresh = context, len(prompt_ids)

    def advance(self, accepted, committed, features) -> None:
        self.fresh = accepted + 1
        self.context = features if self.padded else features[:, : self.fresh]

    def sit_out(self) -> None:
        # The features not seen yet may be a graphed verify's outputs, which this cycle's verify
        # overwrites; and without the padding a verified block leaves (a static step pads its input).
        self.context = self.context[:, : self.fresh].clone()

    def carry(self, features) -> None:
        self.context = torch.cat([self.context, features[:, :1]], dim=1)
        self.fresh += 1

    def choose(self, logits):
        """(draft ids, their q or None) from draft logits, as the run's sampling settings say."""
        run = self.run
        return self.drafter.propose(logits, run.sampling, run.generator, run.sample_drafts, run.target.vocab_size)

    def confidence(self, logits, probs) -> torch.Tensor | None:
        """The drafter's confidence per draft where the run asks for it (a block schedule), else None."""
        run = self.run
        return draft_confidence(self.drafter, logits, probs, run.sampling, run.target.vocab_size) if run.confidence else None

    def candidates(self, logits) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each slot's top-k (target ids, log-probabilities) where the run grows trees, else None."""
        width = self.run.tree_width
        if not width:
            return None
        logq = torch.log_softmax(logits.float(), dim=-1)
        top = torch.topk(logq, min(width, logq.shape[-1]), dim=-1)
        return self.drafter.to_target_ids(top.indices), top.values

    def view(self, logits, probs, ids) -> DraftView:
        drafter, run = self.drafter, self.run

        def draft_probs():
            # Argmax drafts: report the distribution they were the mode of.
            if probs is not None:
                return probs
            return distribution(drafter.full_logits(logits, run.target.vocab_size), run.sampling)

        path = (lambda: selector_walk(logits, ids, run.sampling)) if isinstance(logits, PathScores) else None
        return DraftView(drafter.mask_token_id, self.target_layer_ids, self.fresh, self.cache, draft_probs, path)


def selector_walk(path: PathScores, ids: torch.Tensor, sampling: SamplingParams):
    """The walk a DFlash2 selector took to draft `ids` [n]: (candidates [n, K], the distribution
    over them each slot drew from or took the mode of [n, K], the chosen index per slot [n]), on the
    device. A slot's candidates are distinct (its top-k), so its draft names the one chosen."""
    chosen = (path.candidates == ids[:, None]).int().argmax(dim=-1)
    previous = torch.cat([chosen.new_zeros(1), chosen[:-1]])
    rows = path.scores[torch.arange(chosen.shape[0], device=chosen.device), previous]
    return path.candidates, distribution(rows, sampling), chosen


class DFlashDrafting(_InjectedContext):
    """A block-diffusion drafter: `[bonus, mask x (B-1)]` in one pass, every slot at once."""

    def __init__(self, drafter, run: RunSettings):
        # A static drafter cache for graphs: its last block's padding rows reach 2 blocks past the end.
        cache = drafter.new_cache(run.capacity + run.block_size if run.graphs is not None else None)
        super().__init__(drafter, run, cache)
        self.padded = run.graphs is not None  # with graphs the whole block goes on: one shape every cycle
        if self.padded:
            drafter.draft_head(run.target.head)  # built outside the steps a backend may compile

    def step(self, bonus_ids, context, positions) -> torch.Tensor:
        drafter, target = self.drafter, self.run.target
        # The block is the slot-0 token and a mask per draft: its length is the positions past the context.
        block = torch.full((1, positions.shape[1] - context.shape[1]), drafter.mask_token_id, device=target.device)
        block[0, :1] = bonus_ids
        hidden = drafter(target.embed(block).to(drafter.dtype), context.to(drafter.dtype), positions, cache=self.cache)
        return drafter.draft_logits(hidden[0, 1:], target.head, anchor_ids=bonus_ids)

    def draft(self, bonus_ids, start, explain, length=None) -> Proposal:
        drafter, cache, context, injected = self.drafter, self.cache, self.context, self.fresh
        device, graphs = self.run.target.device, self.run.graphs
        B = self.run.block_size if length is None else length + 1
        drafter.before_draft(start)
        if graphs is None:
            positions = torch.arange(cache.length, start + B, device=device)[None]
            logits = self.step(bonus_ids, context, positions)
        else:
            positions = static_slots(cache.length, injected, context.shape[1], B, device)[None]
            if context.shape[1] == B == self.run.block_size:  # whole blocks after the first: the captured shape
                logits = graphs(("draft", drafter, cache.capacity), self.step, bonus_ids, context, positions)
            else:
                logits = self.step(bonus_ids, context, positions)
            cache.commit(injected)
        ids, probs = self.choose(logits)
        return Proposal(ids, probs, 1, self.view(logits, probs, ids) if explain else None, self.confidence(logits, probs),
                        self.candidates(logits))


class ARDrafting(_InjectedContext):
    """The autoregressive drafter with the same KV injection: B-1 causal passes, one draft each.

    Pass j feeds the token at `start + j` (the bonus, then its own drafts) as the only query; it
    attends to the injected context before `start` and to the tokens of the passes before it, whose
    keys and values stay in the drafter cache until the cycle ends (then cut back to the context).
    Its q per slot is conditioned on the drafts before it, which is what the rejection rule needs.
    """

    def __init__(self, drafter, run: RunSettings):
        # Dynamic cache only: each pass is its own shape-one step, outside any CUDA graph.
        super().__init__(drafter, run, drafter.new_cache())

    def draft(self, bonus_ids, start, explain, length=None) -> Proposal:
        drafter, cache, target = self.drafter, self.cache, self.run.target
        features = self.context.to(drafter.dtype)
        token, drafts, dists, all_logits = bonus_ids, [], [], []
        for j in range(self.run.block_size - 1 if length is None else length):
            positions = torch.arange(cache.length, start + j + 1, device=target.device)[None]
            hidden = drafter(target.embed(token[None]).to(drafter.dtype), features, positions, cache=cache)
            cache.commit(1)  # this pass's token: the next passes attend to it
            logits = drafter.draft_logits(hidden[0, -1:], target.head)
            token, q = self.choose(logits)
            drafts.append(token)
            dists.append(q)
            all_logits.append(logits)
            features = features[:, :0]  # the context went in with the first pass
        cache.crop(start)  # keep the context; the tokens are redrafted after the verify
        ids, logits = torch.cat(drafts), torch.cat(all_logits)
        probs = None if dists[0] is None else torch.cat(dists)
        view = self.view(logits, probs, ids) if explain else None
        return Proposal(ids, probs, len(drafts), view, self.confidence(logits, probs))
