"""The doctor's report: one typed `Check` per question, and the `Report` that holds them.

Each check has a status (PASS, WARN, FAIL, or SKIP where it does not apply), a one-line summary
with the numbers behind it, an explanation in plain words for someone new to speculative
decoding, the cause it names when it warns or fails, and its figures as JSON-ready values. The
CLI prints `Report.lines()`; `Report.to_dict()` is the JSON file and what an app renders.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

Status = Literal["PASS", "WARN", "FAIL", "SKIP"]
STATUSES: tuple[Status, ...] = ("PASS", "WARN", "FAIL", "SKIP")
REPORT_FORMAT = "dflash-doctor/1"


@dataclass(frozen=True)
class Check:
    """One check's verdict."""

    id: str  # stable key, e.g. "wiring.layer_shift"
    title: str  # a few words, e.g. "target_layer_ids probe"
    status: Status
    summary: str  # one line with the numbers behind the status
    explanation: str  # what the check looks at and what its result means, in plain words
    cause: str | None = None  # the cause it names when it warns or fails, in a few words
    numbers: dict = field(default_factory=dict)  # the figures, JSON-ready

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def line(self) -> str:
        """`STATUS  title: summary`, the CLI's line for this check."""
        return f"{self.status:<4}  {self.title}: {self.summary}"


def skipped(id: str, title: str, why: str, explanation: str) -> Check:
    """A check that does not apply here, with the reason as its summary."""
    return Check(id, title, "SKIP", why, explanation)


@dataclass(frozen=True)
class Report:
    """Every check of one doctor run, and what was diagnosed (target, drafter, settings, prompts)."""

    pair: dict
    checks: tuple[Check, ...]

    @property
    def status(self) -> Status:
        """The worst status among the checks (SKIP counts as PASS)."""
        found = {c.status for c in self.checks}
        return "FAIL" if "FAIL" in found else "WARN" if "WARN" in found else "PASS"

    @property
    def causes(self) -> list[str]:
        """The causes named by the checks that failed, then by those that warned."""
        return [c.cause for s in ("FAIL", "WARN") for c in self.checks if c.status == s and c.cause]

    def check(self, id: str) -> Check:
        """The check with this id (KeyError naming the ids there are)."""
        for c in self.checks:
            if c.id == id:
                return c
        raise KeyError(f"no check {id!r}; the report has {[c.id for c in self.checks]}")

    def lines(self) -> list[str]:
        """The report as the CLI prints it: one line per check, then the verdict."""
        counts = {s: sum(c.status == s for c in self.checks) for s in STATUSES}
        verdict = f"{self.status}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        if self.causes:
            verdict += "; causes: " + "; ".join(self.causes)
        return [c.line() for c in self.checks] + [verdict]

    def to_dict(self) -> dict:
        return {"format": REPORT_FORMAT, "status": self.status, "causes": self.causes, "pair": self.pair,
                "checks": [asdict(c) for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
