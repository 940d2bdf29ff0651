"""The decoding loop: DFlash speculative decoding, and plain decoding through the same path.

`generate` is a generator of events (see `events.py`): callers stream them (the app), collect
them (`run`), or print them (the CLI). Without a drafter, or with block size 1, each cycle
verifies just the last token, which is exactly plain autoregressive decoding.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Literal, get_args

import torch

from .drafter import DFlashDrafter, static_slots
from .errors import GenerationInputError
from .events import Block, Prefill, StopReason, Summary
from .explain import explain_cycle
from .sampling import SamplingParams, make_generator, probabilities, sample
from .target import Target
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


@torch.inference_mode()
def generate(
    target: Target,
    prompt_ids: list[int],
    drafter: DFlashDrafter | None = None,
    *,
    max_new_tokens: int = 128,
    block_size: int | None = None,
    sampling: SamplingParams = SamplingParams(),
    stop_ids: Iterable[int] = (),
    draft_mode: DraftMode = "sample",
    explain: int = 0,
) -> Iterator[Prefill | Block | Summary]:
    """Decode after `prompt_ids`, yielding `Prefill`, one `Block` per cycle, then `Summary`.

    block_size: tokens verified per cycle (default: the drafter's trained size; 1 = plain).
    draft_mode: how draft tokens are chosen when sampling: "sample" (drawn at the same temperature,
    speculative rejection sampling) or "argmax" (target sampled per slot, drafts kept while they
    match). Greedy decoding always drafts the argmax. Both are exact.
    explain: 0 = off; k > 0 puts in every `Block.explain` what the cycle saw and decided, with top-k
    lists of size k (`explain.py`), from the cycle's own tensors. Outputs are the same either way.
    """
    if drafter is None:
        block_size = 1
    elif block_size is None:
        block_size = drafter.block_size
    if not 1 <= block_size <= (drafter.block_size if drafter else 1):
        raise GenerationInputError(
            f"block_size {block_size} must be between 1 and the drafter's trained block size {drafter.block_size}"
        )
    if draft_mode not in DRAFT_MODES:
        raise GenerationInputError(f"draft_mode must be one of {DRAFT_MODES}, got {draft_mode!r}")
    if isinstance(explain, bool) or not isinstance(explain, int) or explain < 0:
        raise GenerationInputError(f"explain must be 0 (off) or a top-k size >= 1, got {explain!r}")
    prompt_ids = [int(t) for t in prompt_ids]
    check_inputs(target, prompt_ids, max_new_tokens, block_size)
    stop_ids = frozenset(int(t) for t in stop_ids)
    use_drafter = drafter is not None and block_size > 1
    sample_drafts = not sampling.greedy and draft_mode != "argmax"
    device = target.device
    generator = make_generator(sampling, device)

    def choose(logits: torch.Tensor) -> int:
        return int(logits.argmax()) if sampling.greedy else int(sample(probabilities(logits[None], sampling), generator))

    target.reset(len(prompt_ids) + max_new_tokens + block_size)
    target.tap_layers(drafter.target_layer_ids if use_drafter else ())
    graphs = target.graphs  # the verify step replays inside target.forward; the draft step here
    draft_cache = None
    if use_drafter:
        # A static drafter cache for graphs: its last block's padding rows reach 2 blocks past the end.
        draft_cache = drafter.new_cache(len(prompt_ids) + max_new_tokens + 2 * block_size if graphs else None)

    def draft_step(bonus_ids, context, positions):
        block = torch.full((1, block_size), drafter.mask_token_id, device=device)
        block[0, :1] = bonus_ids
        hidden = drafter(target.embed(block).to(drafter.dtype), context.to(drafter.dtype), positions, cache=draft_cache)
        return drafter.draft_logits(hidden[0, 1:], target.head, anchor_ids=bonus_ids)

    t_start = _clock(device)
    logits, context = target.forward(torch.tensor([prompt_ids], device=device), last_logits_only=True)
    bonus = choose(logits[-1])
    prefill = Prefill(prompt_len=len(prompt_ids), token_id=bonus, seconds=_clock(device) - t_start)
    # Compute time only: a consumer may hold this generator suspended (the app interleaves two
    # runs), and that wait must not count against either side.
    compute_s = prefill.seconds
    yield prefill

    output = [bonus]
    bonus_ids = torch.tensor([bonus], device=device)  # slot 0 of the next block, kept on the device
    fresh = len(prompt_ids)  # leading rows of `context` that are new context (with graphs, rejected slots follow)
    blocks: list[Block] = []
    stop_reason: StopReason = "stop_token" if bonus in stop_ids else "max_new_tokens"
    start = len(prompt_ids)  # position of the bonus token, the block's slot 0
    # Like the reference, DFlash runs one more cycle when a cycle ends exactly at the limit: it
    # emits nothing, but keeps tau and the per-cycle trace comparable with published runs.
    cycle_limit = len(prompt_ids) + max_new_tokens + (1 if use_drafter else 0)
    while start + 1 < cycle_limit and stop_reason != "stop_token":
        # One host sync per cycle (the `.tolist()` below): everything before it is queued on the
        # device from host-known shapes, and the timings are read from marks once it has passed.
        t0 = time.perf_counter()
        marks = _Marks(device)
        marks.mark()
        draft = torch.empty(0, dtype=torch.long, device=device)
        draft_probs = None
        if use_drafter:
            drafter.before_draft(start)
            injected = fresh
            if graphs is None:
                positions = torch.arange(draft_cache.length, start + block_size, device=device)[None]
                draft_logits = draft_step(bonus_ids, context, positions)
            else:
                positions = static_slots(draft_cache.length, injected, context.shape[1], block_size, device)[None]
                if context.shape[1] == block_size:  # every cycle after the first: the one captured shape
                    tag = ("draft", drafter, draft_cache.capacity)
                    draft_logits = graphs(tag, draft_step, bonus_ids, context, positions)
                else:
                    draft_logits = draft_step(bonus_ids, context, positions)
                draft_cache.commit(injected)
            draft, draft_probs = drafter.propose(draft_logits, sampling, generator, sample_drafts, target.vocab_size)
        marks.mark()

        block_ids = torch.cat([bonus_ids, draft])[None]
        logits, features = target.forward(block_ids)
        record = {} if explain else None
        outcome = accept(draft, logits, sampling, generator, draft_probs, record)  # [accepted, bonus], on the device
        marks.mark()
        accepted, bonus, *draft_ids = torch.cat([outcome, draft]).tolist()  # the cycle's one host sync
        bonus_ids = outcome[1:]
        draft_s, verify_s = marks.spans()
        start += accepted + 1
        target.crop(start)
        if use_drafter:
            fresh = accepted + 1
            # With graphs the whole block goes on, its rejected rows as padding: one shape every cycle.
            context = features if graphs is not None else features[:, :fresh]

        new_ids = [*draft_ids[:accepted], bonus][: max_new_tokens - len(output)]
        for i, token in enumerate(new_ids):
            if token in stop_ids:
                new_ids, stop_reason = new_ids[: i + 1], "stop_token"
                break
        output.extend(new_ids)
        now = time.perf_counter()
        compute_s += now - t0
        info = None
        if explain:
            # After the cycle's clocks: the draft/verify/other split is the cycle's own; the
            # explanation's cost still counts in elapsed_s, which is all compute of the run.
            info = explain_cycle(
                explain,
                sampling=sampling,
                target=target,
                block_ids=block_ids,
                target_logits=logits,
                record=record,
                accepted=accepted,
                bonus=bonus,
                times={"draft_s": draft_s, "verify_s": verify_s, "other_s": now - t0 - draft_s - verify_s},
                drafting=(drafter, draft_cache, injected, draft_logits, draft_probs)
                if use_drafter
                else None,
            )
            compute_s += time.perf_counter() - now
        event = Block(
            index=len(blocks),
            position=start - accepted - 1,
            draft_ids=tuple(draft_ids),
            accepted=accepted,
            bonus_id=bonus,
            committed_ids=tuple(new_ids),
            draft_s=draft_s,
            verify_s=verify_s,
            elapsed_s=compute_s,
            explain=info,
        )
        blocks.append(event)
        yield event

    yield Summary(
        output_ids=tuple(output),
        prompt_len=len(prompt_ids),
        block_size=block_size,
        stop_reason=stop_reason,
        prefill=prefill,
        blocks=tuple(blocks),
        total_s=compute_s,
    )


def run(*args, **kwargs) -> Summary:
    """`generate` to completion; returns its summary."""
    for event in generate(*args, **kwargs):
        pass
    return event
