"""Replay a recorded race from its trace file (`dflash-trace/2`, or a `/1` one), with no model and no torch.

The trace holds every lane's events (prefill, every block with its compute clock, the summary)
and the text of every token they name, so the replay rebuilds the engine's own events and runs
them through the same race, renderers and charts as a live run: the colours, the draft strip,
the summary and every explanation view come out as they did live. Token text comes from the
trace's `"tokens"` table (and its `"pieces"`, the live panes' exact text, when present).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from dflash_core.events import Block, CycleExplanation, Prefill, Summary, TreeCycle
from dflash_core.lossless import Verdict
from dflash_core.trace import RUNS, TraceError, validate_trace

from ..race.report import RaceReport, first_difference, race_report
from ..race.thinking import Thinking, recorded_thinking

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / "assets" / "traces"
BLOCK_FIELDS = [f.name for f in fields(Block)]


class ReplayError(ValueError):
    """A trace that cannot be replayed; the message says why."""


@dataclass(frozen=True)
class Recording:
    """Every lane of a recorded race, as the engine's events, and how to name their tokens."""

    name: str
    settings: dict
    runs: dict[str, Summary]  # by lane, in the order of `RUNS`; dflash and plain always
    tokens: dict[int, str]
    pieces: dict[str, list[str]]  # lane -> the live pane's text per output token, when recorded
    recorded_report: RaceReport | None = None  # the race's report as shown live (its lossless verdict too)
    thinking: Thinking | None = None  # the template's thinking switch as raced, where it has one

    @property
    def dflash(self) -> Summary:
        return self.runs["dflash"]

    @property
    def plain(self) -> Summary:
        return self.runs["plain"]

    def text_of(self, token_id: int) -> str:
        return self.tokens.get(int(token_id), f"<{int(token_id)}>")

    @property
    def block_size(self) -> int:
        return self.dflash.block_size

    @property
    def temperature(self) -> float:
        return float(self.settings.get("temperature", 0.0) or 0.0)

    def events(self, lane: str):
        """The lane's events in the order the engine yielded them."""
        summary = self.runs[lane]
        yield summary.prefill
        yield from summary.blocks
        yield summary

    def report(self) -> RaceReport:
        """The race's report, recomputed from the recorded events; the lossless verdict (which
        needed the model) and the stop flag come from the recorded report, when there is one."""
        recorded = self.recorded_report
        verdict, stopped = (None, False) if recorded is None else (recorded.lossless, recorded.stopped)
        lanes = {} if recorded is None else recorded.lanes
        verdicts = {name: Verdict(lane.lossless, position=lane.first_difference)
                    for name, lane in lanes.items() if lane.lossless is not None and name != "dflash"}
        return race_report(self.dflash, self.plain, self.temperature, self.block_size, verdict, stopped=stopped,
                           lanes=self.runs, verdicts=verdicts)

    def label(self) -> str:
        prompt = " ".join(str(self.settings.get("prompt", "")).split())
        return f"{self.name}: T={self.temperature:g}, block {self.block_size} · {_short(prompt)}"


def shipped_traces() -> list[tuple[Path, str]]:
    """(path, label) of the recorded traces that ship with the app, in the order of
    assets/traces/index.json (every other *.json after them, by name)."""
    if not SHIPPED.is_dir():
        return []
    listed: list[tuple[Path, str]] = []
    try:
        index = json.loads((SHIPPED / "index.json").read_text(encoding="utf-8"))
        for entry in index["traces"]:
            prompt = " ".join(str(entry["prompt"]).split())
            label = f"{entry['category']}, T={float(entry['temperature']):g}: {_short(prompt)}"
            listed.append((SHIPPED / Path(str(entry["file"])).name, label))
    except (OSError, ValueError, KeyError, TypeError):
        listed = []
    known = {path.name for path, _ in listed}
    others = [(path, path.stem) for path in sorted(SHIPPED.glob("*.json")) if path.name not in known | {"index.json"}]
    return [(path, label) for path, label in listed if path.is_file()] + others


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "…"


def load_trace(path) -> Recording:
    """Read and check a trace file with the engine's validator (which never executes anything
    from it); raises `ReplayError` with one clear message per fault, naming the file by its name
    only (never the folder it sits in on the server)."""
    if path is None or str(path).strip() == "":
        raise ReplayError("no trace chosen: pick a recorded run or upload a trace file (.json)")
    path = Path(path)
    try:
        data = validate_trace(path)
    except TraceError as exc:
        raise ReplayError(f"{path.name}: {str(exc).replace(str(path), path.name)}") from None
    runs = data["runs"]
    missing = [lane for lane in ("dflash", "plain") if lane not in runs]
    if missing:
        raise ReplayError(f"{path.name} holds no {' and no '.join(missing)} run: a race replay needs DFlash and plain decoding")
    tokens = {int(k): v for k, v in data["tokens"].items()}
    summaries = {lane: _summary(runs[lane], lane) for lane in RUNS if lane in runs}
    recording = Recording(path.stem, data["settings"], summaries, tokens, data.get("pieces", {}),
                          thinking=recorded_thinking(data))
    if "report" not in data:
        return recording
    try:
        recorded = RaceReport.from_dict(data["report"])
    except (TypeError, ValueError) as exc:
        raise ReplayError(f"{path.name}: trace.{exc}") from None
    _check_verdict(recorded, recording, path.name)
    return replace(recording, recorded_report=recorded)


def _check_verdict(recorded: RaceReport, recording: Recording, name: str) -> None:
    """The recorded lossless verdict must say what the recorded outputs show."""
    verdict = recorded.lossless
    if verdict is None:
        return
    d, p = recording.dflash.output_ids, recording.plain.output_ids
    differ = first_difference(d, p)
    if verdict.kind == "identical" and differ is not None:
        raise ReplayError(f"{name}: trace.report.lossless says identical, but the outputs differ at token {differ}")
    if verdict.kind != "identical" and (differ is None or verdict.position != differ):
        where = "they are identical" if differ is None else f"they first differ at token {differ}"
        raise ReplayError(f"{name}: trace.report.lossless says {verdict.kind} at token {verdict.position}, but {where}")


def _summary(run: dict, lane: str) -> Summary:
    prefill = Prefill(int(run["prompt_len"]), int(run["prefill"]["token_id"]), float(run["prefill"]["seconds"]))
    blocks = []
    for raw in run["blocks"]:
        values = {name: raw[name] for name in BLOCK_FIELDS if name in raw}
        values["draft_ids"] = tuple(int(t) for t in raw["draft_ids"])
        values["committed_ids"] = tuple(int(t) for t in raw["committed_ids"])
        if raw.get("explain") is not None:
            values["explain"] = CycleExplanation.from_dict(raw["explain"])
        if raw.get("tree") is not None:
            values["tree"] = TreeCycle.from_dict(raw["tree"])
        blocks.append(Block(**values))
    return Summary(
        output_ids=tuple(int(t) for t in run["output_ids"]),
        prompt_len=int(run["prompt_len"]),
        block_size=int(run["block_size"]),
        stop_reason=run.get("stop_reason", "max_new_tokens"),
        prefill=prefill,
        blocks=tuple(blocks),
        total_s=float(run["total_s"]),
        method=str(run.get("method") or lane),  # traces before dflash-trace/2 name no method
        block_schedule=run.get("block_schedule", "fixed"),  # traces before the block schedule name none
        tree_budget=int(run.get("tree_budget", 0)),
    )


class RecordedPieces:
    """Pane text per token for a replay, with the `extend(ids)` interface of `TokenPieces`."""

    def __init__(self, recording: Recording, lane: str):
        self.recording = recording
        self.recorded = recording.pieces.get(lane) or []  # checked by validate_trace; else "tokens"
        self.final = list(recording.runs[lane].output_ids)

    def extend(self, ids) -> list[str]:
        ids = [int(i) for i in ids]
        if self.recorded and ids == self.final[: len(ids)] and len(self.recorded) == len(self.final):
            return list(self.recorded[: len(ids)])
        return [self.recording.text_of(i) for i in ids]
