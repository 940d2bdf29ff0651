"""The "Why this tau?" panel: the acceptance doctor's report (`dflash_core.doctor.Report`) as HTML.

A verdict in plain words (what lowers tau, or that nothing found does), then one row per check: a
status badge, the check's title and its summary with the numbers, the cause it names highlighted,
and what the check looks at under a <details>. Before a run the panel says what the doctor does,
while it runs its progress lines, and where it cannot run here the way to run it elsewhere.

Every text is HTML-escaped: summaries quote values and error messages read from a drafter's files.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the report is read duck-typed: the engine's doctor imports torch
    from dflash_core.doctor import Report

# status -> (badge colour, what it means, in words)
STATUS_STYLE = {
    "PASS": ("#127a2a", "nothing wrong found"),
    "WARN": ("#9a6700", "worth a look"),
    "FAIL": ("#c62828", "lowers tau"),
    "SKIP": ("#6b7280", "does not apply to this pair"),
}
CAUSE_STYLE = "background:#fff4d6;color:#5c3d00;border-radius:4px;padding:2px 6px"
PANEL_STYLE = "font-size:15px;line-height:1.45;max-width:980px"
MUTED = "color:#667;font-size:13px"

TAU_IN_WORDS = (
    "tau is how many tokens each DFlash cycle commits: the drafted tokens the target accepted, plus one "
    "of its own. 1.0 means no draft was ever accepted; the drafter's block size is the most it can be. "
    "It depends on the text (what is easy to guess is accepted more), so a race's tau on its one prompt "
    "and the doctor's on its few differ."
)
WHAT_IT_DOES = (
    "The output of DFlash is always the target's own, so when a drafter is set up wrong nothing breaks: "
    "only tau drops, silently. The acceptance doctor looks for the usual reasons: drafter files that "
    "disagree with the target, a quantized drafter, the wrong chat template, target layers read one "
    "off, RoPE read from the wrong place. It decodes {prompts} prompts ({tokens} new tokens each) "
    "several times, once per probe, so it takes a while on a CPU; no race runs meanwhile."
)


def _e(text) -> str:
    return html.escape(str(text))


def intro_html(prompts: int, max_new_tokens: int) -> str:
    """The panel before any run: what tau is and what the doctor will do."""
    return (
        f'<div class="doctor" style="{PANEL_STYLE}"><p style="margin:0 0 6px">{_e(TAU_IN_WORDS)}</p>'
        f'<p style="margin:0;{MUTED}">{_e(WHAT_IT_DOES.format(prompts=prompts, tokens=max_new_tokens))}</p></div>'
    )


def progress_html(lines: list[str], elapsed_s: float) -> str:
    """The panel while the doctor works: its progress lines so far, the newest last."""
    items = "".join(f"<li>{_e(line)}</li>" for line in lines)
    return (
        f'<div class="doctor doctor-running" style="{PANEL_STYLE}">'
        f"<b>The doctor is at work</b> ({elapsed_s:.0f} s)…"
        f'<ol style="margin:6px 0 0;{MUTED}">{items}</ol></div>'
    )


def notice_html(message: str, command: str | None = None) -> str:
    """The panel where the doctor cannot run here: why, and the command that runs it elsewhere."""
    shown = f'<pre style="white-space:pre-wrap;margin:6px 0 0"><code>{_e(command)}</code></pre>' if command else ""
    return f'<div class="doctor doctor-notice" style="{PANEL_STYLE}"><p style="margin:0">{_e(message)}</p>{shown}</div>'


def _badge(status: str) -> str:
    colour, meaning = STATUS_STYLE.get(status, STATUS_STYLE["SKIP"])
    return (
        f'<span class="doctor-badge" title="{_e(meaning)}" style="display:inline-block;min-width:44px;'
        f"text-align:center;font-size:12px;font-weight:700;color:white;background:{colour};"
        f'border-radius:4px;padding:1px 6px;margin-right:8px">{_e(status)}</span>'
    )


def _tau(report: Report) -> float | None:
    for check in report.checks:
        if check.id == "acceptance":
            return check.numbers.get("tau")
    return None


def verdict_html(report: Report) -> str:
    """The headline: what lowers tau (the causes, failures first), or that the checks found nothing."""
    status, causes, tau = report.status, report.causes, _tau(report)
    prompts = len((report.pair or {}).get("prompts", []))
    on = f"the doctor's {prompts} prompts" if prompts else "the doctor's prompts"
    measured = f"tau {tau:.2f} on {on}. " if isinstance(tau, (int, float)) else ""
    if status == "FAIL":
        headline = "Found what lowers tau:"
    elif status == "WARN":
        headline = "Nothing clearly wrong, but worth a look:"
    else:
        headline = ("Nothing found that lowers tau: the drafter is wired and run as it was trained, so a "
                    "higher tau would take a better-trained drafter.")
    listed = "".join(f'<li style="margin:2px 0"><span class="doctor-cause" style="{CAUSE_STYLE}">{_e(c)}</span></li>'
                     for c in causes)
    colour = STATUS_STYLE[status][0]
    return (
        f'<div class="doctor-verdict" data-status="{_e(status)}" style="border-left:5px solid {colour};'
        f'padding:4px 10px;margin-bottom:8px">{_badge(status)}<b>{_e(measured)}{_e(headline)}</b>'
        + (f'<ul style="margin:4px 0 0">{listed}</ul>' if listed else "")
        + "</div>"
    )


def check_html(check) -> str:
    """One check: badge, title and summary; its cause highlighted; its explanation folded."""
    cause = (f'<div style="margin:3px 0 0 60px">Cause: <span class="doctor-cause" style="{CAUSE_STYLE}">'
             f"{_e(check.cause)}</span></div>") if check.cause and check.status in ("WARN", "FAIL") else ""
    return (
        f'<div class="doctor-check" data-check="{_e(check.id)}" data-status="{_e(check.status)}" '
        f'style="padding:5px 0;border-top:1px solid #e5e7eb">'
        f"<div>{_badge(check.status)}<b>{_e(check.title)}</b>: {_e(check.summary)}</div>{cause}"
        f'<details style="margin:2px 0 0 60px"><summary style="cursor:pointer;{MUTED}">What this checks</summary>'
        f'<p style="margin:4px 0">{_e(check.explanation)}</p></details></div>'
    )


def legend_html() -> str:
    return f'<div style="{MUTED};margin:4px 0 6px">' + " · ".join(
        f"<b>{status}</b>: {_e(meaning)}" for status, (_, meaning) in STATUS_STYLE.items()) + "</div>"


def report_html(report: Report, title: str = "", note: str = "", command: str = "") -> str:
    """The whole report: `title` (the pair), verdict, legend, every check in the doctor's order, then
    `note` (how it was run) and `command` (the full run from a shell)."""
    checks = "".join(check_html(c) for c in report.checks)
    footer = f'<p style="margin:8px 0 0;{MUTED}">{_e(note)}</p>' if note else ""
    if command:
        footer += f'<pre style="white-space:pre-wrap;margin:4px 0 0;font-size:12px"><code>{_e(command)}</code></pre>'
    return (
        f'<div class="doctor doctor-report" style="{PANEL_STYLE}">'
        + (f'<div style="{MUTED}">{_e(title)}</div>' if title else "")
        + verdict_html(report) + f'<p style="margin:0;{MUTED}">{_e(TAU_IN_WORDS)}</p>' + legend_html()
        + checks + footer + "</div>"
    )
