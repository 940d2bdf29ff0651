"""One live race of a model pair, with no Gradio: the lanes' `generate` runs raced against each
other (`race.py`), their snapshots, then a typed result (lossless verdict, report, trace).

A lane is one named decoder of the same prompt with the same target (today DFlash and plain
decoding); what is kept per lane is kept by name, so a race of more lanes adds entries, not code.
Takes and gives only plain data: on ZeroGPU it runs in a GPU worker process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dflash_core.events import Summary
from dflash_core.lossless import Verdict
from dflash_core.lossless import compare as lossless_check
from dflash_core.trace import build_trace, settings_of

from .control import Control
from .race import Snapshot, race
from .report import RaceReport, race_report
from .tokens import TokenPieces

EXPLAIN_TOP_K = 5  # every cycle is explained (top-5 of drafter and target) for the views and the trace


@dataclass(frozen=True)
class Lane:
    """One decoder in a race: the target instance it decodes with (each lane holds its own KV
    caches) and its drafter (None: plain decoding, one token per step)."""

    target: object
    drafter: object | None = None
    block_size: int = 1


def pair_lanes(pair, block_size: int) -> dict[str, Lane]:
    """The lanes a pair races: its drafter at `block_size` on its target, and plain decoding on the
    pair's second target."""
    return {"dflash": Lane(pair.target, pair.drafter, block_size), "plain": Lane(pair.plain)}


@dataclass(frozen=True)
class RaceResult:
    """A finished (or stopped) race."""

    summaries: dict[str, Summary]  # by lane: the engine's summary, or one over what was shown
    verdict: Verdict | None  # the lossless check of a greedy race that ran to its end
    report: RaceReport
    trace: dict  # the dflash-trace/1 dict, with the panes' exact text per token under "pieces"


class RaceSession:
    """One race of `pair` on one prompt; `snapshots()` runs it, `result()` sums it up."""

    def __init__(self, pair, device, prompt: str | None, prompt_ids: list[int], max_new_tokens: int,
                 block_size: int, sampling):
        self.pair, self.device = pair, device
        self.prompt, self.prompt_ids = prompt, prompt_ids
        self.max_new_tokens, self.block_size, self.sampling = max_new_tokens, block_size, sampling
        self.lanes = pair_lanes(pair, block_size)
        self.pieces = {name: TokenPieces(pair.tokenizer) for name in self.lanes}
        self.text_of = single_token_text(pair.tokenizer)
        self.last: Snapshot | None = None  # the newest snapshot

    def snapshots(self, stop: Callable[[], bool] | None = None, control: Control | None = None) -> Iterator[Snapshot]:
        """The race's snapshots until both lanes have finished on screen, or until `stop()`.

        control: Pause / Step; it is reset for this run, a newer run of its viewer ends this one,
        and its viewer names tokens with this pair's tokenizer.
        """
        from dflash_core import generate  # torch only for a live race

        if control is not None:
            run = control.reset()
            control.viewer.text_of = self.text_of
            outer_stop = stop or _never
            stop = lambda: outer_stop() or control.superseded(run)  # noqa: E731  (a newer run ends this one)
        common = {"max_new_tokens": self.max_new_tokens, "sampling": self.sampling, "stop_ids": self.pair.stop_ids,
                  "explain": EXPLAIN_TOP_K}
        events = {
            name: generate(lane.target, self.prompt_ids, lane.drafter, block_size=lane.block_size, **common)
            for name, lane in self.lanes.items()
        }
        with self.pair.lock:  # a pair's targets hold the KV caches of one race at a time
            for self.last in race(
                events["dflash"], events["plain"], dflash_block_size=self.lanes["dflash"].block_size,
                stop=stop or _never, control=control,
            ):
                yield self.last

    def result(self) -> RaceResult | None:
        """The race's verdict, report and trace, from its last snapshot; None when it stopped
        before every lane had a token."""
        how = "stopped" if self.last.stopped else "running"
        summaries = {name: view.as_summary(how) for name, view in self.last.lanes.items()}
        if any(summary is None for summary in summaries.values()):
            return None
        d, p = summaries["dflash"], summaries["plain"]
        verdict = None
        if self.sampling.greedy and not self.last.stopped:
            verdict = lossless_check(self.lanes["plain"].target, self.prompt_ids, d.output_ids, p.output_ids)
        report = race_report(d, p, self.sampling.temperature, self.block_size, verdict, stopped=self.last.stopped)
        spec = self.pair.spec
        trace = build_trace(
            settings=settings_of(
                self.prompt, self.prompt_ids, self.max_new_tokens, self.block_size, self.sampling,
                target_dtype=self.pair.target.dtype, drafter_dtype=self.pair.drafter.dtype, explain=EXPLAIN_TOP_K,
            ),
            pair={"id": spec.id, "target": spec.target, "drafter": spec.drafter,
                  "trained_block_size": self.pair.trained_block_size, "chat_template": self.pair.chat_template},
            runs=summaries,
            vocab_size=self.pair.target.vocab_size,
            text_of=self.text_of,
            device=self.device,
            report=report.to_dict(),
        )
        # The panes' exact text per token: a replay shows it as it was shown live (a byte-level
        # token that completes a character decodes differently on its own).
        trace["pieces"] = {name: self.pieces[name].extend(summary.output_ids) for name, summary in summaries.items()}
        return RaceResult(summaries, verdict, report, trace)


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
