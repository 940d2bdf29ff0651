"""One live race of a model pair, with no Gradio: the lanes' `generate` runs raced against each
other (`interleave.py`), their snapshots, then a typed result (lossless verdict, report, trace).

A lane is one named decoder of the same prompt with the same target: DFlash and plain decoding
always, and DFlash with the per-cycle block schedule, DFlash verifying draft trees, the pair's
DFlash2, input-fusion and autoregressive drafters and prompt lookup when the visitor adds them (`LANES`).
What is kept per lane is kept by name. Takes and gives only plain data: on ZeroGPU it runs in a
GPU worker process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property, partial

from dflash_core.events import Summary
from dflash_core.loading import describe_template
from dflash_core.lossless import Verdict
from dflash_core.lossless import compare as lossless_check
from dflash_core.trace import RUNS as LANES
from dflash_core.trace import build_trace, settings_of

from .control import Control
from .interleave import Snapshot, race
from .lanes import DRAFTER_LANES, TREE_BUDGET
from .report import RaceReport, race_report
from .request import RaceRequest
from .tokens import TokenPieces

EXPLAIN_TOP_K = 5  # every cycle is explained (top-5 of drafter and target) for the views and the trace
# How often a race waiting for its pair (another race, the doctor, a lane step compiling) looks
# again, and lets its streamer notice Stop or a visitor who left.
WAIT_POLL_S = 0.5


@dataclass(frozen=True)
class Lane:
    """One decoder in a race: the target instance it decodes with (each lane holds its own KV
    caches) and its drafter (None: plain decoding, one token per step). scheduled: the block
    schedule picks each cycle's verified length, block_size being the longest. tree_budget: the
    draft nodes of the tree each cycle verifies (0: the drafter's chain)."""

    target: object
    drafter: object | None = None
    block_size: int = 1
    scheduled: bool = False
    tree_budget: int = 0

    @property
    def block_argument(self) -> int | str:
        """What `generate` takes as its block_size for this lane."""
        return "auto" if self.scheduled else self.block_size


def pair_lanes(pair, block_size: int, names=("dflash", "plain"), tree_budget: int = TREE_BUDGET,
               compiled: dict | None = None) -> dict[str, Lane]:
    """The lanes `names` of a pair, in the order of `LANES`: its DFlash drafter at `block_size`, the
    same drafter with the block schedule (up to its trained size), the same drafter verifying
    trees of `tree_budget` drafts at `block_size`, its DFlash2, input-fusion and
    autoregressive drafters (`pair.lane_drafters`, each at most at its trained size), prompt
    lookup, and plain decoding, each on a target instance of its own (`LoadedPair.lane_target`).
    compiled: {lane: its compiled target} for every lane (`pairs/compiled.py`), the lanes of the
    pair's drafter then drafting with their compiled twins of it."""
    from dflash_core import PromptLookup  # torch only for a live race

    def lane(name: str) -> Lane:
        target = compiled[name] if compiled else pair.lane_target(name)
        drafter = pair.compiled.drafter_of(name) if compiled else pair.drafter
        if name == "dflash":
            return Lane(target, drafter, block_size)
        if name == "scheduled":
            return Lane(target, drafter, pair.drafter.block_size, scheduled=True)
        if name == "tree":
            return Lane(target, drafter, block_size, tree_budget=tree_budget)
        if name in DRAFTER_LANES:
            drafter = pair.lane_drafters[name]
            return Lane(target, drafter, min(block_size, drafter.block_size))
        if name == "lookup":
            return Lane(target, PromptLookup(block_size=block_size), block_size)
        return Lane(target)

    return {name: lane(name) for name in LANES if name in names}


TREE_BLOCK = ("The tree lane grows its drafts below slot 0 of a block: it needs a block size of at least 2, "
              "got {block_size}.")
SCHEDULED_SAMPLING = (
    "{label}'s drafter ({method}) conditions each draft on the ones before it, so the scheduled block lane "
    "races it at temperature 0 only (the schedule must not depend on what a sampled draft drew)."
)


def check_race(req: RaceRequest, pair) -> None:
    """Raises `GenerationInputError` for what the loaded `pair` cannot race, by the engine's own
    checks (the ones `generate` runs): a block size past its drafter's trained one, a scheduled
    lane its drafter cannot run at the request's sampling, and a tree lane its target or drafter cannot verify."""
    from dflash_core import check_block_size, check_schedule, method_name, tree_refusal  # torch only for a live race
    from dflash_core.errors import GenerationInputError

    check_block_size(pair.drafter, req.block_size)
    if "scheduled" in req.lanes:
        try:
            check_schedule(pair.drafter, req.sampling)
        except GenerationInputError:
            raise GenerationInputError(
                SCHEDULED_SAMPLING.format(label=pair.spec.label, method=method_name(pair.drafter))) from None
    if "tree" in req.lanes:
        if req.block_size < 2:
            raise GenerationInputError(TREE_BLOCK.format(block_size=req.block_size))
        if (refusal := tree_refusal(pair.lane_target("tree"), pair.drafter)) is not None:
            raise GenerationInputError(f"The tree lane cannot race {pair.spec.label}: {refusal}.")


@dataclass(frozen=True)
class RaceResult:
    """A finished (or stopped) race; its trace is built when first read."""

    summaries: dict[str, Summary]  # by lane: the engine's summary, or one over what was shown
    verdict: Verdict | None  # the lossless check of a greedy race that ran to its end
    report: RaceReport
    # Building the trace of a long race takes a tenth of a second or more: a stopped race shows
    # its report first, and its trace is built after.
    build: Callable[[], dict] = field(repr=False)

    @cached_property
    def trace(self) -> dict:
        """The dflash-trace/2 dict, with the panes' exact text per token under "pieces"."""
        return self.build()


class RaceSession:
    """One race of `pair` on one prompt; `snapshots()` runs it, `result()` sums it up."""

    def __init__(self, pair, device, req: RaceRequest, prompt_ids: list[int]):
        """req: checked against the pair (`check_race`); its `thinking` is how `prompt_ids` went through the chat template,
        which the trace records beside the drafter's trained setting."""
        self.pair, self.device = pair, device
        self.thinking = pair.thinking(req.thinking)
        self.prompt, self.prompt_ids = req.prompt, prompt_ids
        self.max_new_tokens, self.block_size, self.sampling = req.max_new_tokens, req.block_size, req.sampling
        self.req = req
        self.choose_lanes()
        self.pieces = {name: TokenPieces(pair.tokenizer) for name in self.lanes}
        self.text_of = single_token_text(pair.tokenizer)
        self.last: Snapshot | None = None  # the newest snapshot
        # While the race waits for its pair: the lane step compiling (`LoadedPair.busy_with`), or "" for another run.
        self.waiting: str | None = None

    def choose_lanes(self) -> None:
        """The lanes, on the pair's compiled steps where every step they take is compiled now, and
        `steps`, which steps they run and why."""
        req = self.req
        compiled, self.steps = self.pair.compiled_lanes(req.lanes, req.block_size,
                                                        len(self.prompt_ids) + req.max_new_tokens, req.tree_budget)
        self.lanes = pair_lanes(self.pair, req.block_size, req.lanes, req.tree_budget, compiled)

    def snapshots(self, stop: Callable[[], bool] | None = None, control: Control | None = None) -> Iterator[Snapshot]:
        """The race's snapshots until every lane has finished on screen, or until `stop()`.

        control: Pause / Step; it is reset for this run, a newer run of its viewer ends this one,
        and its viewer names tokens with this pair's tokenizer.

        While another run holds the pair (a race, the doctor, a lane step compiling), the snapshots
        are idle ones with no lanes and `waiting` says which; a stop then ends the race before it
        begins (`last` stays None).
        """
        from dflash_core import generate  # torch only for a live race

        if control is not None:
            run = control.reset()
            control.viewer.text_of = self.text_of
            outer_stop = stop or _never
            stop = lambda: outer_stop() or control.superseded(run)  # noqa: E731  (a newer run ends this one)
        common = {"max_new_tokens": self.max_new_tokens, "sampling": self.sampling, "stop_ids": self.pair.stop_ids}
        try:
            # A pair's targets hold the KV caches of one race at a time. Waiting for them yields idle
            # snapshots, so that the page can say why and Stop ends the wait.
            with self.pair.queued():
                while not self.pair.lock.acquire(timeout=WAIT_POLL_S):
                    if (stop or _never)():
                        return
                    self.waiting = self.pair.busy_with() or ""
                    yield Snapshot({}, 0.0, False, idle=True)
            try:
                if self.waiting is not None:  # steps may have compiled meanwhile: the lanes take them if they now can
                    self.waiting = None
                    self.choose_lanes()
                # A tree cycle's record is its `Block.tree`; the engine explains chains only.
                events = {
                    name: generate(lane.target, self.prompt_ids, lane.drafter, block_size=lane.block_argument,
                                   explain=0 if lane.tree_budget else EXPLAIN_TOP_K, tree_budget=lane.tree_budget, **common)
                    for name, lane in self.lanes.items()
                }
                block_sizes = {name: lane.block_size for name, lane in self.lanes.items()}
                for self.last in race(events, block_sizes=block_sizes, stop=stop or _never, control=control):
                    yield self.last
            finally:
                self.pair.lock.release()
        finally:
            if control is not None:
                control.done(run)

    def result(self) -> RaceResult | None:
        """The race's verdict, report and trace, from its last snapshot; None when it stopped
        before every lane had a token."""
        from dflash_core import method_name  # torch only for a live race

        how = "stopped" if self.last.stopped else "running"
        summaries = {name: view.as_summary(how) for name, view in self.last.lanes.items()}
        if any(summary is None for summary in summaries.values()):
            return None
        # A stopped lane's summary is one over what was shown: it names what drafted, as the engine's does.
        summaries = {name: summary if self.last.lanes[name].done else replace(
            summary, method=method_name(self.lanes[name].drafter),
            block_schedule="auto" if self.lanes[name].scheduled else "fixed", tree_budget=self.lanes[name].tree_budget)
            for name, summary in summaries.items()}
        d, p = summaries["dflash"], summaries["plain"]
        verdicts = {}
        if self.sampling.greedy and not self.last.stopped:
            plain_target = self.lanes["plain"].target
            verdicts = {name: lossless_check(plain_target, self.prompt_ids, summary.output_ids, p.output_ids)
                        for name, summary in summaries.items() if name != "plain"}
        report = race_report(d, p, self.sampling.temperature, self.block_size, verdicts.get("dflash"),
                             stopped=self.last.stopped, lanes=summaries, verdicts=verdicts)
        return RaceResult(summaries, verdicts.get("dflash"), report, partial(self._trace, summaries, report))

    def _trace(self, summaries: dict[str, Summary], report: RaceReport) -> dict:
        spec, thinking = self.pair.spec, self.thinking
        trace = build_trace(
            settings=settings_of(
                self.prompt, self.prompt_ids, self.max_new_tokens, self.block_size, self.sampling,
                target_dtype=self.pair.target.dtype, drafter_dtype=self.pair.drafter.dtype, explain=EXPLAIN_TOP_K,
                **({"thinking": thinking.used} if thinking.used is not None else {}),
            ),
            pair={"id": spec.id, "target": spec.target, "drafter": spec.drafter,
                  "trained_block_size": self.pair.trained_block_size,
                  "chat_template": describe_template(self.pair.tokenizer, thinking.args),
                  **({"trained_thinking": thinking.trained} if thinking.trained is not None else {}),
                  **{f"{name}_drafter": getattr(spec, f"{name}_drafter") for name in DRAFTER_LANES if name in self.lanes}},
            runs=summaries,
            vocab_size=self.pair.target.vocab_size,
            text_of=self.text_of,
            device=self.device,
            report=report.to_dict(),
        )
        # The panes' exact text per token: a replay shows it as it was shown live (a byte-level
        # token that completes a character decodes differently on its own).
        trace["pieces"] = {name: self.pieces[name].extend(summary.output_ids) for name, summary in summaries.items()}
        return trace


def _never() -> bool:
    return False


def single_token_text(tokenizer) -> Callable[[int], str]:
    """Text of one token on its own (for draft tokens, which are not part of the output text)."""
    memo: dict[int, str] = {}

    def text_of(token_id: int) -> str:
        if token_id not in memo:
            memo[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return memo[token_id]

    return text_of
