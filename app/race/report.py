"""The numbers a finished race reports: speedup, tau, tokens/s, TTFT and the lossless check.

Times are each lane's own compute clock (see `interleave.py`), so a speedup is the one a benchmark
running the decoders separately would measure. The top-level numbers are DFlash's against plain
decoding; `lanes` holds one `LaneReport` per lane raced (the autoregressive drafter and prompt
lookup when the visitor added them). `RaceReport` is typed for the app's own code; `to_dict` gives
the JSON the `compare` endpoint returns and a trace stores, `from_dict` reads it back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import get_args

from dflash_core import Summary
from dflash_core.lossless import Verdict, VerdictKind, first_difference
from dflash_core.trace import RUNS

__all__ = ["LaneReport", "RaceReport", "first_difference", "lane_report", "race_report", "seconds_per_token"]


@dataclass(frozen=True)
class LaneReport:
    """One lane of a race, beside plain decoding; field names are the JSON keys."""

    method: str  # what drafted: dflash, dflash2, ar, lookup or plain (`dflash_core.models.drafter.method_name`)
    tau: float
    speedup: float  # plain seconds per token over this lane's
    tok_s: float
    ttft_s: float
    tokens: int
    seconds: float
    cycles: int
    block_size: int
    draft_passes_per_cycle: float  # drafter forward passes: 1 for DFlash, B-1 for the AR drafter, 0 for lookup
    draft_ms_per_cycle: float
    identical: bool | None  # None: not checked (sampling, or stopped at different lengths)
    first_difference: int | None
    lossless: str | None  # the verdict's kind (identical / near_tie / diverged) where it was checked

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data, where: str) -> LaneReport:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object, got {type(data).__name__}")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ValueError(f"{where} lacks {', '.join(missing)}")
        for name, check in _LANE_FIELDS.items():
            check(data[name], f"{where}.{name}")
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class RaceReport:
    """The summary of one race; field names are the JSON keys."""

    stopped: bool
    tau: float
    speedup: float
    identical: bool | None  # None: not checked (sampling, or stopped at different lengths)
    first_difference: int | None
    # identical / near_tie (rounding of a tie, with where and by how much) / diverged (a bug)
    lossless: Verdict | None
    dflash_tok_s: float
    plain_tok_s: float
    dflash_ttft_s: float
    plain_ttft_s: float
    dflash_tokens: int
    plain_tokens: int
    dflash_s: float
    plain_s: float
    cycles: int
    block_size: int
    temperature: float
    acceptance_histogram: list[int]
    per_position_acceptance: list[float]
    lanes: dict[str, LaneReport] = field(default_factory=dict)  # every lane raced, by name (none in older traces)

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["lossless"] = None if self.lossless is None else self.lossless.to_dict()
        data["lanes"] = {name: lane.to_dict() for name, lane in self.lanes.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> RaceReport:
        """A report as `to_dict` wrote it (a trace's `"report"`), every field checked for its type
        and range; raises ValueError naming the field and what is wrong with it."""
        if not isinstance(data, dict):
            raise ValueError(f"report must be an object, got {type(data).__name__}")
        # Traces recorded before the stop flag and the verdict existed lack them.
        values = {"stopped": False, "lossless": None, "lanes": {}, **data}
        missing = [f.name for f in fields(cls) if f.name not in values]
        if missing:
            raise ValueError(f"report lacks {', '.join(missing)}")
        for name, check in _REPORT_FIELDS.items():
            check(values[name], f"report.{name}")
        verdict = values["lossless"]
        if verdict is not None:
            verdict = verdict_from_dict(verdict)
        if not isinstance(values["lanes"], dict) or not set(values["lanes"]) <= set(RUNS):
            raise ValueError(f"report.lanes must map some of the lanes {', '.join(RUNS)} to their reports")
        lanes = {name: LaneReport.from_dict(lane, f"report.lanes.{name}") for name, lane in values["lanes"].items()}
        return cls(**{f.name: values[f.name] for f in fields(cls)} | {"lossless": verdict, "lanes": lanes})


def verdict_from_dict(data) -> Verdict:
    """A lossless verdict as `Verdict.to_dict` wrote it, every field checked; ValueError naming the bad one."""
    if not isinstance(data, dict):
        raise ValueError(f"report.lossless must be an object, got {type(data).__name__}")
    known = {f.name for f in fields(Verdict)}
    values = {k: v for k, v in data.items() if k in known}
    if "kind" not in values:
        raise ValueError("report.lossless lacks its kind")
    for name, check in _VERDICT_FIELDS.items():
        if name in values:
            check(values[name], f"report.lossless.{name}")
    return Verdict(**values)


def _kind(*types, low=None, high=None, optional=False):
    """A check of one field: one of `types` (bool never counts as a number), finite, within bounds."""

    def check(value, where: str) -> None:
        if value is None and optional:
            return
        number = any(t in (int, float) for t in types)
        ok = isinstance(value, types) and not (number and isinstance(value, bool) and bool not in types)
        if ok and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                ok = math.isfinite(value) and (low is None or value >= low) and (high is None or value <= high)
            except OverflowError:
                ok = False
        if not ok:
            names = " or ".join(t.__name__ for t in types)
            if low is not None:
                names += f" >= {low}" if high is None else f" in [{low}, {high}]"
            shown = f"a {type(value).__name__}" if isinstance(value, (list, dict)) else f"{value!r:.40}"
            raise ValueError(f"{where} must be {names}{' or null' if optional else ''}, got {shown}")

    return check


def _list_of(item):
    def check(value, where: str) -> None:
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list, got {type(value).__name__}")
        for i, x in enumerate(value):
            item(x, f"{where}[{i}]")

    return check


_REAL = _kind(int, float, low=0)
_COUNT = _kind(int, low=0)
_REPORT_FIELDS = {
    "stopped": _kind(bool), "tau": _REAL, "speedup": _REAL, "identical": _kind(bool, optional=True),
    "first_difference": _kind(int, low=0, optional=True), "dflash_tok_s": _REAL, "plain_tok_s": _REAL,
    "dflash_ttft_s": _REAL, "plain_ttft_s": _REAL, "dflash_tokens": _COUNT, "plain_tokens": _COUNT,
    "dflash_s": _REAL, "plain_s": _REAL, "cycles": _COUNT, "block_size": _kind(int, low=1), "temperature": _REAL,
    "acceptance_histogram": _list_of(_COUNT), "per_position_acceptance": _list_of(_kind(int, float, low=0, high=1)),
}
_LANE_FIELDS = {
    "method": _kind(str), "tau": _REAL, "speedup": _REAL, "tok_s": _REAL, "ttft_s": _REAL, "tokens": _COUNT,
    "seconds": _REAL, "cycles": _COUNT, "block_size": _kind(int, low=1), "draft_passes_per_cycle": _REAL,
    "draft_ms_per_cycle": _REAL, "identical": _kind(bool, optional=True),
    "first_difference": _kind(int, low=0, optional=True),
    "lossless": lambda value, where: None if value is None or value in get_args(VerdictKind) else _bad_kind(value, where),
}
_VERDICT_FIELDS = {
    "kind": lambda value, where: None if value in get_args(VerdictKind) else _bad_kind(value, where),
    "position": _kind(int, low=0, optional=True), "dflash_token": _kind(int, low=0, optional=True),
    "plain_token": _kind(int, low=0, optional=True), "top2_margin": _kind(int, float, optional=True),
    "gap": _kind(int, float, optional=True), "tolerance": _kind(int, float, optional=True), "dtype": _kind(str),
}


def _bad_kind(value, where: str):
    raise ValueError(f"{where} must be one of {', '.join(get_args(VerdictKind))}, got {value!r:.40}")


def seconds_per_token(summary: Summary) -> float:
    return summary.total_s / len(summary.output_ids) if summary.output_ids else 0.0


def _checked(lane: Summary, plain: Summary, temperature: float, stopped: bool) -> bool:
    """Whether a lane's output must equal plain decoding's: only greedy decoding must give the same
    tokens (sampled runs legitimately differ), and a stopped race only where both reached the same length."""
    return temperature == 0.0 and not (stopped and len(lane.output_ids) != len(plain.output_ids))


def _speedup(lane: Summary, plain: Summary) -> float:
    spt = seconds_per_token(lane)
    return round(seconds_per_token(plain) / spt, 4) if spt > 0 else 0.0


def lane_report(lane: Summary, plain: Summary, temperature: float, verdict: Verdict | None = None,
                stopped: bool = False) -> LaneReport:
    """One lane's numbers beside plain decoding's; `verdict` as in `race_report`."""
    checked = _checked(lane, plain, temperature, stopped)
    diff = first_difference(lane.output_ids, plain.output_ids)
    cycles = len(lane.blocks)
    return LaneReport(
        method=lane.method,
        tau=round(lane.tau, 4),
        speedup=_speedup(lane, plain),
        tok_s=round(lane.tokens_per_s, 3),
        ttft_s=round(lane.ttft_s, 4),
        tokens=len(lane.output_ids),
        seconds=round(lane.total_s, 4),
        cycles=cycles,
        block_size=lane.block_size,
        draft_passes_per_cycle=round(lane.draft_passes / cycles, 4) if cycles else 0.0,
        draft_ms_per_cycle=round(1000 * lane.draft_s / cycles, 4) if cycles else 0.0,
        identical=(diff is None) if checked else None,
        first_difference=diff if checked else None,
        lossless=verdict.kind if checked and verdict is not None else None,
    )


def race_report(
    dflash: Summary, plain: Summary, temperature: float, block_size: int, verdict: Verdict | None = None,
    stopped: bool = False, lanes: dict[str, Summary] | None = None, verdicts: dict[str, Verdict] | None = None,
) -> RaceReport:
    """The summary of a race (its `to_dict` is the last update of the `compare` API).

    verdict: the engine's lossless check of a greedy race (`dflash_core.lossless.compare`).
    stopped: the race was cut short, so the outputs are prefixes; they are compared for the
    lossless check only when both sides reached the same length.
    lanes: every lane's summary by name, DFlash and plain included (default: those two);
    verdicts: the lossless checks of the other drafted lanes, by name.
    """
    lanes = lanes or {"dflash": dflash, "plain": plain}
    verdicts = {"dflash": verdict, **(verdicts or {})}
    checked = _checked(dflash, plain, temperature, stopped)
    diff = first_difference(dflash.output_ids, plain.output_ids)
    return RaceReport(
        stopped=stopped,
        tau=round(dflash.tau, 4),
        speedup=_speedup(dflash, plain),
        identical=(diff is None) if checked else None,
        first_difference=diff if checked else None,
        lossless=verdict if checked else None,
        dflash_tok_s=round(dflash.tokens_per_s, 3),
        plain_tok_s=round(plain.tokens_per_s, 3),
        dflash_ttft_s=round(dflash.ttft_s, 4),
        plain_ttft_s=round(plain.ttft_s, 4),
        dflash_tokens=len(dflash.output_ids),
        plain_tokens=len(plain.output_ids),
        dflash_s=round(dflash.total_s, 4),
        plain_s=round(plain.total_s, 4),
        cycles=len(dflash.blocks),
        block_size=block_size,
        temperature=temperature,
        acceptance_histogram=dflash.acceptance_histogram,
        per_position_acceptance=[round(x, 4) for x in dflash.per_position_acceptance],
        lanes={name: lane_report(summary, plain, temperature, verdicts.get(name), stopped)
               for name, summary in lanes.items()},
    )
