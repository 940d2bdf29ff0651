"""The decoding loop: speculative decoding with any drafter, and plain decoding through the same path.

`generate` is a generator of events (see `events.py`): callers stream them (the app), collect
them (`run`), or print them (the CLI). One speculative cycle (`_Decoding.cycle`: draft, verify in
one target forward, keep the accepted prefix and the bonus) is apart from the loop around it,
which cuts the output at a stop token or the limit and turns each cycle into a `Block`. What a
cycle drafts comes from the drafter's session (`drafting.py`): a DFlash block in one pass, the
autoregressive drafter's γ passes, or prompt lookup's copy; the verify and the loop are the same
for all. Without a drafter, or with block size 1, each cycle verifies just the last token, which
is exactly plain autoregressive decoding. With `block_size="auto"` a block schedule (`schedule.py`)
sets how many drafts each cycle drafts, and cuts the draft to the prefix worth its verify cost
before the verify. With `tree_budget=B` a cycle verifies a tree of B drafts grown from the DFlash
pass's per-slot top-k instead of its chain (`tree.py`, `_Decoding.tree_cycle`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Literal, get_args

import torch

from .drafting import Drafter, Proposal, RunSettings, open_session
from .errors import GenerationInputError
from .events import Block, CycleExplanation, CycleTimes, Prefill, StopReason, Summary, TreeCycle
from .explain import explain_cycle
from .models.drafter import DFlashDrafter, method_name
from .models.target import Target
from .sampling import SamplingParams, greedy_ids, make_generator, probabilities, sample
from .schedule import AUTO, BlockSchedule, CostProfile, fixed_draft_costs, measured_costs
from .speed.batch_invariant import MAX_BLOCK, is_batch_invariant
from .tree import ancestor_mask, grow, walk
from .verify import accept

DraftMode = Literal["sample", "argmax"]
DRAFT_MODES: tuple[str, ...] = get_args(DraftMode)


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # kernels are asynchronous: time what actually ran
    return time.perf_counter()


class _Marks:
    """Time marks within one cycle that cost no host sync: CUDA events on a GPU (read after the
    cycle's one sync, when they have all completed), the host clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> list[float]:
        """Seconds between consecutive marks; on CUDA call only after a sync past the last mark."""
        pairs = zip(self.marks, self.marks[1:])
        if self.cuda:
            return [a.elapsed_time(b) / 1000 for a, b in pairs]
        return [b - a for a, b in pairs]


def check_block_size(drafter, block_size: int | str | None) -> int:
    """The (longest) block size a run of `drafter` uses: 1 without a drafter, else the given one or
    the drafter's trained size, which is also the longest block of the schedule ("auto"); raises
    `GenerationInputError` for one the drafter cannot run. Callers check a request with it before
    they start `generate`, which checks the same way."""
    if block_size != AUTO and (isinstance(block_size, bool) or not isinstance(block_size, (int, type(None)))):
        raise GenerationInputError(f"block_size must be a whole number, None or {AUTO!r}, got {block_size!r}")
    if drafter is None:
        return 1
    if block_size is None or block_size == AUTO:
        return drafter.block_size
    if not 1 <= block_size <= drafter.block_size:
        raise GenerationInputError(
            f"block_size {block_size} must be between 1 and the drafter's trained block size {drafter.block_size}"
        )
    return block_size


# Drafters whose each draft is conditioned on the ones before it: a schedule may not take their
# sampled drafts (schedule.py: the choice must not depend on what a draft drew).
SEQUENTIAL_DRAFTS = ("ar", "dflash2")


def check_schedule(drafter, sampling: SamplingParams, draft_mode: str = "sample") -> None:
    """Raises `GenerationInputError` unless `drafter` may run with `block_size="auto"` at `sampling`:
    a block schedule needs the drafter's probabilities, and with sampled drafts q for every slot
    before any is drawn (schedule.py: the choice must not depend on what a draft drew)."""
    method = method_name(drafter)
    if hasattr(drafter, "session"):  # e.g. prompt lookup
        raise GenerationInputError(f'block_size="auto" needs a drafter with probabilities; {method} has none')
    if method in SEQUENTIAL_DRAFTS and not sampling.greedy and draft_mode == "sample":
        raise GenerationInputError(
            f'block_size="auto" with sampled drafts needs a drafter that drafts every slot at once; {method} '
            f'conditions each draft on the ones before it: use draft_mode="argmax" or a fixed block size'
        )


# Drafters that draft every slot in one pass, whose per-slot top-k a tree grows from.
TREE_METHODS = ("dflash", "fusion")


def _method_refusal(drafter) -> str | None:
    """Why `drafter`'s drafting grows no tree, or None when it can."""
    if (method := method_name(drafter)) not in TREE_METHODS:
        return (f"a tree grows from one pass's per-slot top-k, which {method} drafting has no form of (trees need "
                f"one of {TREE_METHODS}; DFlash2 conditions each slot on the one chosen before it)")
    return None


def tree_refusal(target: Target, drafter) -> str | None:
    """Why `drafter` and `target` cannot verify draft trees (`tree_budget`), or None when they can."""
    return _method_refusal(drafter) or target.tree_refusal()


def _check_tree(target: Target, drafter, tree_budget, block_size: int, scheduled: bool, explain: int) -> None:
    """A tree budget, and a run that can verify trees, or a GenerationInputError saying why not."""
    if isinstance(tree_budget, bool) or not isinstance(tree_budget, int) or tree_budget < 0:
        raise GenerationInputError(f"tree_budget must be 0 (the chain) or a number of draft nodes >= 1, got {tree_budget!r}")
    if not tree_budget:
        return
    if (refusal := _method_refusal(drafter)) is not None:
        raise GenerationInputError(f"tree_budget={tree_budget}: {refusal}")
    if block_size < 2:
        raise GenerationInputError(f"tree_budget={tree_budget} needs a block of at least 2 slots, got block_size {block_size}")
    if tree_budget + 1 > MAX_BLOCK and is_batch_invariant(target.model):
        raise GenerationInputError(
            f"tree_budget={tree_budget} verifies {tree_budget + 1} nodes in one forward, and this target computes at "
            f"most {MAX_BLOCK} rows bitwise as one-token steps (batch-invariant, as bfloat16 on a CPU is): use a "
            f"tree_budget of at most {MAX_BLOCK - 1}"
        )
    if scheduled:
        raise GenerationInputError(
            f'tree_budget={tree_budget} and block_size="auto" both choose what a cycle verifies: use one of them'
        )
    if explain:
        raise GenerationInputError(
            f"explain={explain} describes a chain's slots; a tree cycle's record is its Block.tree: use explain=0"
        )
    if (refusal := target.tree_refusal()) is not None:
        raise GenerationInputError(refusal)


def check_inputs(target: Target, prompt_ids, max_new_tokens: int, block_size: int) -> None:
    if len(prompt_ids) == 0:
        raise GenerationInputError("the prompt is empty: give at least one token")
    bad = [t for t in prompt_ids if not 0 <= t < target.vocab_size]
    if bad:
        raise GenerationInputError(f"prompt ids {bad[:5]} are outside the target vocabulary of size {target.vocab_size}")
    if max_new_tokens < 1:
        raise GenerationInputError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    limit = getattr(target.model.config, "max_position_embeddings", None)
    needed = len(prompt_ids) + max_new_tokens + block_size
    if limit is not None and needed > limit:
        raise GenerationInputError(
            f"prompt of {len(prompt_ids)} tokens + {max_new_tokens} new tokens (+{block_size} for the last block) "
            f"exceeds the target's context of {limit} positions; shorten the prompt or lower max_new_tokens"
        )


@dataclass(frozen=True)
class Cycle:
    """What one cycle decided; the loop cuts `committed` to the limit and a stop token."""

    position: int  # slot 0's position (the previous bonus token)
    draft_ids: tuple[int, ...]
    accepted: int
    bonus_id: int
    draft_s: float
    verify_s: float
    explanation: CycleExplanation | None
    draft_passes: int
    verify_len: int  # tokens verified: slot 0 and the first verify_len - 1 of draft_ids (a tree: its nodes)
    tree: TreeCycle | None = None

    @property
    def committed(self) -> list[int]:
        return [*self.draft_ids[: self.accepted], self.bonus_id]


class _Decoding:
    """One run's models and settings, and the state each cycle hands to the next: the bonus token
    (slot 0 of the next block), its position, and the drafting session (`drafting.py`) with what
    its drafter has not seen yet."""

    def __init__(self, target: Target, drafter, capacity: int, block_size: int,
                 sampling: SamplingParams, draft_mode: DraftMode, explain: int, scheduled: bool,
                 costs: CostProfile | None, tree_budget: int = 0):
        self.target, self.block_size, self.sampling, self.explain = target, block_size, sampling, explain
        self.tree_budget = tree_budget
        self.drafter = drafter if drafter is not None and block_size > 1 else None
        self.device = target.device
        self.generator = make_generator(sampling, self.device)
        target.reset(capacity)
        self.session = self.schedule = None
        scheduled = scheduled and self.drafter is not None
        if self.drafter is not None:
            settings = RunSettings(
                target=target, block_size=block_size, sampling=sampling, generator=self.generator,
                sample_drafts=not sampling.greedy and draft_mode != "argmax", capacity=capacity,
                graphs=target.graphs,  # the verify step replays inside target.forward; the draft step in the session
                confidence=scheduled, tree_width=tree_budget,
            )
            self.session = open_session(self.drafter, settings)
        target.tap_layers(self.session.target_layer_ids if self.session is not None else ())
        if scheduled:
            costs = costs or measured_costs(target, block_size)
            if sampling.seed is not None and not sampling.greedy and costs.other_s is None:
                # A seeded run repeats only if its choices never read the clock (schedule.py). The
                # measuring sessions capture no graphs: those are keyed to the run's own cache.
                own = replace(settings, generator=torch.Generator(device=self.device).manual_seed(0), graphs=None)
                costs = fixed_draft_costs(costs, target, self.drafter, lambda: open_session(self.drafter, own))
            self.schedule = BlockSchedule(costs, block_size)
            target.reset(capacity)  # a measurement leaves its context in the cache

    def choose(self, logits: torch.Tensor) -> int:
        if self.sampling.greedy:
            return int(greedy_ids(logits))
        return int(sample(probabilities(logits[None], self.sampling), self.generator))

    def prefill(self, prompt_ids: list[int]) -> Prefill:
        t_start = _clock(self.device)
        ids = torch.tensor([prompt_ids], device=self.device)
        logits, context = self.target.forward(ids, last_logits_only=True)
        bonus = self.choose(logits[-1])
        prefill = Prefill(prompt_len=len(prompt_ids), token_id=bonus, seconds=_clock(self.device) - t_start)
        self.bonus_ids = torch.tensor([bonus], device=self.device)  # kept on the device
        self.start = len(prompt_ids)  # position of the bonus token, the block's slot 0
        if self.session is not None:
            self.session.prefill(prompt_ids, bonus, context)
        return prefill

    def draft(self, length: int | None) -> Proposal:
        """`length` drafts (None: the whole block; 0: none, a plain step)."""
        if length == 0:
            self.session.sit_out()
        if self.session is None or length == 0:
            nothing = torch.empty(0, dtype=torch.long, device=self.device)
            return Proposal(nothing, None, 0, confidence=nothing.float())
        if length is None:  # the whole block: a session need not take a length it is never given
            return self.session.draft(self.bonus_ids, self.start, bool(self.explain))
        return self.session.draft(self.bonus_ids, self.start, bool(self.explain), length)

    def cycle(self) -> Cycle:
        """Draft, verify, accept, and advance the caches to the accepted prefix and the bonus."""
        if self.tree_budget and self.session is not None:
            return self.tree_cycle()
        # One host sync per cycle (the `.tolist()` below): everything before it is queued on the
        # device from host-known shapes, and the timings are read from marks once it has passed.
        t0 = time.perf_counter()
        marks = _Marks(self.device)
        marks.mark()
        length = None if self.schedule is None else self.schedule.draft_length()
        proposal = self.draft(length)
        drafted = draft = proposal.ids
        probs = proposal.probs
        if self.schedule is not None:  # the one host read the schedule adds: the drafter's confidences
            k = self.schedule.choose(proposal.confidence)
            draft, probs = draft[:k], None if probs is None else probs[:k]
        marks.mark()
        block_ids = torch.cat([self.bonus_ids, draft])[None]
        logits, features = self.target.forward(block_ids)
        record = {} if self.explain else None
        # [accepted, bonus], on the device; the rule follows the proposal's q (None: a point mass)
        outcome = accept(draft, logits, self.sampling, self.generator, probs, record)
        marks.mark()
        accepted, bonus, *draft_ids = torch.cat([outcome, drafted]).tolist()  # the cycle's one host sync
        self.bonus_ids = outcome[1:]
        draft_s, verify_s = marks.spans()
        position = self.start
        self.start += accepted + 1
        self.target.crop(self.start)
        if length == 0:  # the drafter sat this cycle out: it takes the token's features next time
            self.session.carry(features)
        elif self.session is not None:
            self.session.advance(accepted, [*draft_ids[:accepted], bonus], features)
        explanation = None
        if self.explain:
            # After the cycle's clocks: the draft/verify/other split is the cycle's own; the
            # explanation's cost still counts in elapsed_s, which is all compute of the run.
            times = CycleTimes(draft_s, verify_s, time.perf_counter() - t0 - draft_s - verify_s)
            explanation = explain_cycle(
                self.explain, sampling=self.sampling, target=self.target, block_ids=block_ids, target_logits=logits,
                record=record, accepted=accepted, bonus=bonus, times=times, drafting=proposal.view,
            )
        if self.schedule is not None:
            self.schedule.judged(block_ids.shape[1] - 1, accepted)
            self.schedule.observe(draft_s if length else 0.0, time.perf_counter() - t0 - draft_s - verify_s)
        return Cycle(position, tuple(draft_ids), accepted, bonus, draft_s, verify_s, explanation, proposal.passes,
                     block_ids.shape[1])

    def tree_cycle(self) -> Cycle:
        """Draft once, grow a tree from each slot's top-k, verify all its nodes in one forward, walk
        it with the target's own tokens, and keep the walked path in both caches (`tree.py`)."""
        device, t0 = self.device, _clock(self.device)
        proposal = self.draft(None)
        top_ids, top_logq = proposal.candidates
        root, top_ids, top_logq = int(self.bonus_ids[0]), top_ids.tolist(), top_logq.tolist()  # the host grows it
        t1 = _clock(device)
        tree = grow(root, top_ids, top_logq, self.tree_budget)
        mask, depths = ancestor_mask(tree, device), torch.tensor(tree.depths, device=device)
        t2 = _clock(device)
        logits, features = self.target.forward_tree(torch.tensor([tree.tokens], device=device), depths, mask)
        if self.sampling.greedy:
            choices = greedy_ids(logits)
        else:  # one independent draw per node: the walk reads each one at most once
            choices = sample(probabilities(logits, self.sampling), self.generator)
        choices = choices.tolist()
        t3 = _clock(device)
        path, bonus = walk(tree, choices)
        position, drafts = self.start, [tree.tokens[node] for node in path[1:]]
        self.target.keep_path(position, path)
        self.start += len(path)
        self.bonus_ids = torch.tensor([bonus], device=device)
        # The walked rows first, then padding up to the block (the last row again), as a chain hands
        # over its verified block: with graphs or compiled steps the next draft step then has the
        # shape captured for whole blocks (the session keeps only the walked rows otherwise).
        rows = torch.tensor(path + path[-1:] * (self.block_size - len(path)), device=device)
        self.session.advance(len(drafts), [*drafts, bonus], None if features is None else features.index_select(1, rows))
        record = TreeCycle(tokens=tree.tokens, parents=tree.parents, depths=tree.depths,
                           probs=tuple(math.exp(q) for q in tree.logq), targets=tuple(choices), path=tuple(path),
                           host_s=(t2 - t1) + (_clock(device) - t3))
        return Cycle(position, tuple(drafts), len(drafts), bonus, t1 - t0, t3 - t2, None, proposal.passes, len(tree),
                     record)


@torch.inference_mode()
def generate(
    target: Target,
    prompt_ids: list[int],
    drafter: DFlashDrafter | Drafter | None = None,
    *,
    max_new_tokens: int = 128,
    block_size: int | str | None = None,
    sampling: SamplingParams = SamplingParams(),
    stop_ids: Iterable[int] = (),
    draft_mode: DraftMode = "sample",
    explain: int = 0,
    costs: CostProfile | None = None,
    tree_budget: int = 0,
) -> Iterator[Prefill | Block | Summary]:
    """Decode after `prompt_ids`, yielding `Prefill`, one `Block` per cycle, then `Summary`.

    drafter: None (plain decoding), a `DFlashDrafter` (DFlash, DFlash2, or the autoregressive
    drafter when its config says so), or any `drafting.Drafter`, e.g. `PromptLookup`. Each Block
    says how many drafter passes its draft took (`draft_passes`) and their time (`draft_s`).
    block_size: tokens verified per cycle at most (default: the drafter's size; 1 = plain), or
    "auto": each cycle drafts as many slots as recent cycles verified, plus a few (at most the
    drafter's block), and verifies the prefix worth its cost (`schedule.py`); each Block's
    `draft_ids` are the drafts drafted, its `verify_len` how many tokens were verified.
    costs: with "auto", the verify cost per length (`schedule.CostProfile`); default: measured
    once for this target, thread count and block size, on first use (a few dozen verifies).
    draft_mode: how draft tokens are chosen when sampling: "sample" (drawn at the same temperature,
    speculative rejection sampling) or "argmax" (target sampled per slot, drafts kept while they
    match). Greedy decoding always drafts the argmax. Both are exact.
    explain: 0 = off; k > 0 puts in every `Block.explain` what the cycle saw and decided, with top-k
    lists of size k (`explain.py`), from the cycle's own tensors. Outputs are the same either way.
    tree_budget: 0 = verify the drafter's chain; B > 0 = verify a tree of B drafts grown best-first
    from the one DFlash pass's per-slot top-k, at most block_size - 1 deep (`tree.py`); each Block
    then carries its `tree`. Lossless at greedy and exact when sampling, like the chain.
    """
    scheduled = block_size == AUTO
    block_size = check_block_size(drafter, block_size)
    if draft_mode not in DRAFT_MODES:
        raise GenerationInputError(f"draft_mode must be one of {DRAFT_MODES}, got {draft_mode!r}")
    if scheduled and drafter is not None:
        check_schedule(drafter, sampling, draft_mode)
    if isinstance(explain, bool) or not isinstance(explain, int) or explain < 0:
        raise GenerationInputError(f"explain must be 0 (off) or a top-k size >= 1, got {explain!r}")
    _check_tree(target, drafter, tree_budget, block_size, scheduled, explain)
    prompt_ids = [int(t) for t in prompt_ids]
    room = max(block_size, tree_budget + 1)  # the last verify's rows: a block, or a tree's nodes
    check_inputs(target, prompt_ids, max_new_tokens, room)
    stop_ids = frozenset(int(t) for t in stop_ids)
    decoding = _Decoding(target, drafter, len(prompt_ids) + max_new_tokens + room, block_size, sampling,
                         draft_mode, explain, scheduled, costs, tree_budget)
    prefill = decoding.prefill(prompt_ids)
    # Compute time only: a consumer may hold this generator suspended (the app interleaves two
    # runs), and that wait must not count against either side.
    compute_s = prefill.seconds
    yield prefill

    output = [prefill.token_id]
    blocks: list[Block] = []
    stop_reason: StopReason = "stop_token" if prefill.token_id in stop_ids else "max_new_tokens"
    # Like the reference, DFlash runs one more cycle when a cycle ends exactly at the limit: it
    # emits nothing, but keeps tau and the per-cycle trace comparable with published runs.
    cycle_limit = len(prompt_ids) + max_new_tokens + (1 if decoding.drafter is not None else 0)
    while decoding.start + 1 < cycle_limit and stop_reason != "stop_token":
        t0 = time.perf_counter()
        cycle = decoding.cycle()
        new_ids = cycle.committed[: max_new_tokens - len(output)]
        for i, token in enumerate(new_ids):
            if token in stop_ids:
                new_ids, stop_reason = new_ids[: i + 1], "stop_token"
                break
        output.extend(new_ids)
        compute_s += time.perf_counter() - t0
        event = Block(
            index=len(blocks),
            position=cycle.position,
            draft_ids=cycle.draft_ids,
            accepted=cycle.accepted,
            bonus_id=cycle.bonus_id,
            committed_ids=tuple(new_ids),
            draft_s=cycle.draft_s,
            verify_s=cycle.verify_s,
            elapsed_s=compute_s,
            draft_passes=cycle.draft_passes,
            verify_len=cycle.verify_len,
            explain=cycle.explanation,
            tree=cycle.tree,
        )
        blocks.append(event)
        yield event

    yield Summary(
        output_ids=tuple(output),
        prompt_len=len(prompt_ids),
        block_size=block_size,
        stop_reason=stop_reason,
        method=method_name(decoding.drafter),
        block_schedule=AUTO if decoding.schedule is not None else "fixed",
        tree_budget=tree_budget if decoding.drafter is not None else 0,
        prefill=prefill,
        blocks=tuple(blocks),
        total_s=compute_s,
    )


def run(*args, **kwargs) -> Summary:
    """`generate` to completion; returns its summary."""
    for event in generate(*args, **kwargs):
        pass
    return event
