"""HTML for the race panes: colored tokens, the per-block draft strip, the legend, the stats and the
summary (with a row per lane when more than DFlash and plain decoding raced).

Token kinds come from the engine's events by position (a block's committed ids are its accepted
draft tokens followed by the target's bonus token), never by searching decoded text. Every piece
of model text is HTML-escaped here, the only place that turns text into markup. A pane and a strip
draw their newest tokens and blocks, and hover boxes for the newest of those, within the byte
budgets of `budget.py`, and say how many earlier ones they left out.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from ..race.interleave import SideView
from ..race.lanes import COLORS as LANE_COLORS
from ..race.lanes import LABELS
from ..race.report import RaceReport
from .budget import PANE_BYTES, PANE_TIPS_BYTES, STRIP_BYTES, STRIP_TIPS_BYTES, first_within
from .tips import plain_tip, token_tip

COLORS = {
    "accepted": "#b7ebc0",  # draft token the target kept
    "bonus": "#ffd98a",  # the target's own token at the end of a block
    "first": "#ffd98a",  # first token, from the prefill: also the target's own
    "plain": "#d6e4ff",  # plain decoding: every token is the target's own
    "rejected": "#f6b8b8",  # draft token the target threw away
    "unverified": "#eef0f3",  # draft token a block schedule left out of the verify (dashed outline)
}
_UNVERIFIED = "outline:1px dashed #8a94a6;outline-offset:-1px"  # drawn inside the chip: no layout shift
BOUNDARY = "#5a6b8c"
DIFF = "#d11a2a"
# A pane's tokens are styled by class, not inline: a 512-token pane is redrawn every frame, and the
# inline style was about half of each token's bytes.
TOKEN_CSS = "".join(f".tok-{kind} {{ background: {color}; }}\n" for kind, color in COLORS.items()) + f"""
.tok {{ border-radius: 3px; padding: 1px 0; }}
.tok-start {{ border-left: 2px solid {BOUNDARY}; padding-left: 1px; margin-left: 1px; }}
"""
# The strip's chips are styled by class for the same reason: 40 rows of a block-8 race took 80 KB
# with the style inline, most of a running frame, and a click on Stop waited behind its drawing.
STRIP_CSS = "".join(f".chip-{kind} {{ background: {color}; }}\n" for kind, color in COLORS.items()) + f"""
.chip {{ border-radius: 3px; padding: 0 2px; margin-right: 2px; }}
.chip-bonus {{ margin-right: 0; margin-left: 6px; }}
.chip-rejected {{ text-decoration: line-through; opacity: 0.55; }}
.chip-rejected.chip-cut {{ opacity: 1; }}
.chip-unverified {{ {_UNVERIFIED}; color: #555; }}
.strip-rows {{ font-family: ui-monospace, monospace; font-size: 12px; max-height: 14em; overflow: auto;
  display: flex; flex-direction: column-reverse; }}
.strip-list > div {{ white-space: nowrap; }}
.strip-head {{ color: #556; display: inline-block; min-width: 17em; }}
"""

# A scrolling box whose one child is laid out column-reverse opens scrolled to its end: every frame
# redraws a pane and a strip, and their newest tokens and rows stay in view (`.strip-rows` too).
_PANE = (
    "font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:14px;line-height:1.9;"
    "white-space:pre-wrap;word-break:break-word;min-height:7em;max-height:26em;overflow-y:auto;"
    "display:flex;flex-direction:column-reverse;"
    "padding:8px;border:1px solid #ccd;border-radius:6px;background:#fff;color:#111"
)
# Column-reverse packs a short text at the box's bottom: the text's box grows to fill the pane, and
# the text starts at its top.
_PANE_TEXT = "flex:1 0 auto"


@dataclass(frozen=True)
class TokenMark:
    """How one output token is drawn."""

    kind: str
    block: int | None  # None for the prefill token
    slot: int | None
    block_start: bool
    rejected: tuple[int, ...] = ()  # drafts this bonus token replaced (bonus tokens only)


def lane_marks(view: SideView) -> list[TokenMark]:
    """A drafting lane's tokens: the prefill's, then per block its accepted drafts and its bonus."""
    marks = [TokenMark("first", None, None, True)] if view.prefill else []
    for block in view.blocks:
        for i, _ in enumerate(block.committed_ids):
            accepted = i < block.accepted
            marks.append(
                TokenMark(
                    "accepted" if accepted else "bonus",
                    block.index,
                    i + 1,  # slot 0 is the previous bonus token; committed token i sits in slot i+1
                    i == 0,
                    () if accepted else tuple(block.draft_ids[block.accepted :]),
                )
            )
    return marks


def plain_marks(view: SideView) -> list[TokenMark]:
    return [TokenMark("plain", i, None, False) for i in range(view.num_tokens)]


class Tips(Sequence):
    """A pane's hover boxes in output order, each built when it is read: a pane draws those of
    its newest tokens only, so the others are never built."""

    def __init__(self, makers: list[Callable[[], str]]):
        self._makers = makers

    def __len__(self) -> int:
        return len(self._makers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [make() for make in self._makers[i]]
        return self._makers[i]()


def _constant(text: str) -> Callable[[], str]:
    return lambda: text


def lane_tips(view: SideView, text_of: Callable[[int], str]) -> Tips:
    """Hover boxes for a drafting lane's tokens, in output order (see `tips.py`)."""
    makers = [_constant('<span class="tip"><b>first token</b> · from the prefill: the target\'s own</span>')] if view.prefill else []
    for block in view.blocks:
        for i, token in enumerate(block.committed_ids):
            what = "accepted draft token" if i < block.accepted else "bonus token (the target's own)"
            makers.append(partial(token_tip, block, i + 1, what, text_of, token))
    return Tips(makers)


def plain_tips(view: SideView, text_of: Callable[[int], str]) -> Tips:
    makers = [_constant('<span class="tip"><b>first token</b> · from the prefill</span>')] if view.prefill else []
    for block in view.blocks:
        makers.extend(partial(plain_tip, block, text_of) for _ in block.committed_ids)
    return Tips(makers)


def _title(mark: TokenMark, position: int, text_of: Callable[[int], str], diff: bool, lane: str) -> str:
    if mark.block is None:
        parts = ["first token (from the prefill, the target's own)"]
    elif mark.kind == "plain":
        parts = [f"token {position}, decoded by the target alone"]
    else:
        what = "accepted draft token" if mark.kind == "accepted" else "bonus token (the target's own)"
        parts = [f"cycle {mark.block + 1}, slot {mark.slot}: {what}"]
        if mark.rejected:
            parts.append(f"drafter proposed {text_of(mark.rejected[0])!r} here (rejected)")
    if diff:
        parts.append(f"first position where {lane} and plain decoding differ")
    return "; ".join(parts)


def tokens_html(
    marks: list[TokenMark],
    pieces: list[str],
    text_of: Callable[[int], str],
    diff_at: int | None = None,
    tips: Sequence[str] | None = None,
    lane: str = "DFlash",
) -> str:
    """One span per token; `pieces[i]` is the decoded text of token i, `tips[i]` its hover box
    (already escaped HTML from `tips.py`; without one the browser's title tooltip is used);
    `lane` names the pane's lane where the first difference is outlined.

    The newest tokens are drawn within PANE_BYTES, and hover boxes go to the newest of them
    within PANE_TIPS_BYTES (read from `tips` only for those); a line says how many earlier
    tokens were left out."""
    if not marks:
        return f'<div class="dflash-pane" style="{_PANE}"><div style="{_PANE_TEXT};color:#889">waiting for tokens…</div></div>'
    count = min(len(marks), len(pieces))
    spans, left, tips_left = [], PANE_BYTES, PANE_TIPS_BYTES if tips else 0
    for i in range(count - 1, -1, -1):
        tip = tips[i] if tips_left and i < len(tips) else ""
        tip_bytes = len(tip.encode())
        if tip_bytes > tips_left:  # this token and every earlier one keep their one-line title
            tip, tip_bytes, tips_left = "", 0, 0
        tips_left -= tip_bytes
        span = _token_span(marks[i], pieces[i], i, text_of, diff_at, lane, tip)
        left -= len(span.encode()) - tip_bytes
        if left < 0:
            break
        spans.append(span)
    skipped = count - len(spans)
    more = f'<div style="color:#889">… {skipped} earlier tokens not drawn</div>' if skipped else ""
    return f'<div class="dflash-pane" style="{_PANE}"><div style="{_PANE_TEXT}">{more}{"".join(reversed(spans))}</div></div>'


def _token_span(mark: TokenMark, piece: str, i: int, text_of, diff_at: int | None, lane: str, tip: str) -> str:
    """Token i's span, with its hover box `tip`, or without one ("") its title; its colour and block
    bar come from its classes (`TOKEN_CSS`)."""
    kind = f"tok tok-{mark.kind}" + (" tok-start" if mark.block_start and mark.kind != "plain" else "")
    style = f' style="outline:2px solid {DIFF}"' if i == diff_at else ""
    data = (
        ""
        if mark.block is None
        else f' data-block="{_text(mark.block)}"' + ("" if mark.slot is None else f' data-slot="{_text(mark.slot)}"')
    )
    hover = "" if tip else f' title="{html.escape(_title(mark, i, text_of, i == diff_at, lane), quote=True)}"'
    return f'<span class="{kind}"{data}{hover}{style}>{html.escape(piece)}{tip}</span>'


# The rows the strip's box (14em) shows without scrolling. A running race's strip draws no more:
# the next frame redraws the box within a fraction of a second, so older rows could not be scrolled
# to and read, and the browser draws a frame in the time its HTML takes (`view/frames.py`).
RUNNING_STRIP_ROWS = 8
STRIP_ROWS = 40  # a paused or finished race's strip: the box scrolls


def draft_strip_html(view: SideView, text_of: Callable[[int], str], last: int = STRIP_ROWS, tips: bool = False) -> str:
    """Per block: what the drafter proposed, accepted in green, rejected in red, then the bonus; a
    scheduled block's drafts past those verified (`Block.verified`) are outlined, not verified.

    tips: give each chip its hover box (top-k and verdict) instead of a title. The newest of the
    last `last` blocks are drawn within STRIP_BYTES (a block's drafts in order, with a count of
    those that did not fit, and always its bonus), hover boxes to the newest chips within
    STRIP_TIPS_BYTES.
    """
    # A lookup lane's first cycles may find no match: the strip shows once any block has drafts (a
    # tree lane's blocks hold their walked drafts only, but every one verified a tree).
    if not any(block.draft_ids or block.tree is not None for block in view.blocks):
        return ""
    rows = []
    left, tips_left = STRIP_BYTES, STRIP_TIPS_BYTES if tips else 0
    for block in reversed(view.blocks[-last:]):
        row, left, tips_left = _strip_row(block, text_of, left, tips_left)
        if row is None:
            break
        rows.append(row)
    skipped = len(view.blocks) - len(rows)
    more = f'<div style="color:#889">… {skipped} earlier blocks in the trace download</div>' if skipped else ""
    cut = any(block.verified < len(block.draft_ids) for block in view.blocks)
    kinds = "accepted / rejected / not verified / bonus; kept / verified" if cut else "accepted / rejected / bonus"
    return (
        f'<details class="draft-strip" open><summary>Drafts per block ({kinds})</summary>'
        f'<div class="strip-rows"><div class="strip-list">{more}'
        f"{''.join(reversed(rows))}</div></div></details>"
    )


def cycle_label(block) -> str:
    """What a cycle committed, in words: "3 drafts: 2 kept + 1 bonus" (a schedule's cut named too)."""
    if block.tree is not None:  # its draft_ids are the walked path; the tree held every verified draft
        return f"tree of {len(block.tree.tokens) - 1} drafts: {block.accepted} kept + 1 bonus"
    drafts, verified = len(block.draft_ids), block.verified
    if not drafts:
        return "no drafts: 1 bonus"
    if not verified:  # a schedule drafted, then found no draft worth its verify
        return f"{drafts} draft{'s' if drafts > 1 else ''}, none verified: 1 bonus"
    checked = f"{verified} of {drafts} drafts verified" if verified < drafts else f"{drafts} draft{'s' if drafts > 1 else ''}"
    return f"{checked}: {block.accepted} kept + 1 bonus"


def _strip_row(block, text_of, left: int, tips_left: int) -> tuple[str | None, int, int]:
    """(the block's row, or None when not even its label and bonus fit in `left` bytes; the bytes
    and the hover-box bytes left after it)."""

    def tip(slot: int, what: str, chosen: int) -> str:
        nonlocal tips_left
        box = token_tip(block, slot, what, text_of, chosen) if tips_left else ""
        if len(box.encode()) > tips_left:  # this chip and every older one keep their title
            box, tips_left = "", 0
        tips_left -= len(box.encode())
        return box

    bonus_slot = block.accepted + 1
    bonus_tip = tip(bonus_slot, "bonus token", block.bonus_id)
    bonus = _chip(block, bonus_slot, block.bonus_id, "bonus", text_of, bonus_tip, "bonus token")
    head = f'<div><span class="strip-head">#{_text(block.index + 1)} · {html.escape(cycle_label(block))}</span>'
    left -= len(head.encode()) + len(bonus.encode()) - len(bonus_tip.encode()) + len("</div>")
    if left < 0:
        return None, 0, tips_left

    def chips():
        for k, token in enumerate(block.draft_ids):
            kind = "accepted" if k < block.accepted else "rejected" if k < block.verified else "unverified"
            what = "draft token not verified" if kind == "unverified" else f"{kind} draft token"
            box = tip(k + 1, what, block.bonus_id if k == block.accepted else token)
            yield _chip(block, k + 1, token, kind, text_of, box, what), len(box.encode())

    drawn = first_within(chips(), lambda chip: len(chip[0].encode()) - chip[1], left)
    left -= sum(len(chip.encode()) - box_bytes for chip, box_bytes in drawn)
    cut = len(block.draft_ids) - len(drawn)
    more = f'<span style="color:#889;margin:0 4px">… {cut} more drafts not drawn</span>' if cut else ""
    return f"{head}{''.join(chip for chip, _ in drawn)}{more}{bonus}</div>", 0 if cut else left, tips_left


def _chip(block, slot: int, token: int, kind: str, text_of, tip: str, what: str) -> str:
    """One chip of the strip: a draft in `slot` (accepted or rejected), or the bonus token; its look
    comes from its classes (`STRIP_CSS`): the draft the target replaced (`chip-cut`) is drawn fully,
    the rejected ones after it faded."""
    cut = " chip-cut" if kind == "rejected" and slot == block.accepted + 1 else ""
    hover = "" if tip else f' title="{html.escape(f"cycle {block.index + 1}, slot {slot}: {what}", quote=True)}"'
    return (
        f'<span class="chip chip-{kind}{cut}" data-block="{_text(block.index)}" data-slot="{slot}"{hover}>'
        f'{html.escape(_visible(text_of(token)))}{tip}</span>'
    )


def _visible(text: str) -> str:
    # Whitespace-only drafts would be invisible chips; show them as symbols.
    return text.replace("\n", "⏎").replace(" ", "␣") if text.strip() == "" else text.replace("\n", "⏎")


def legend_html() -> str:
    items = [
        ("accepted", "accepted draft token"),
        ("bonus", "bonus token (the target's own)"),
        ("rejected", "rejected draft token (in the strip)"),
        ("unverified", "draft not verified (the scheduled block's cut)"),
        ("plain", "plain decoding"),
    ]
    chips = "".join(
        f'<span style="background:{COLORS[k]};{_UNVERIFIED if k == "unverified" else ""};border-radius:3px;'
        f'padding:1px 6px;margin-right:10px">{label}</span>'
        for k, label in items
    )
    return (
        f'<div class="legend" style="font-size:13px">{chips}'
        f'<span style="border-left:2px solid {BOUNDARY};padding-left:4px;margin-right:10px">block boundary</span>'
        f'<span style="outline:2px solid {DIFF};padding:0 4px">first difference</span>'
        ' <span style="color:#667">(hover a token for its block and slot)</span></div>'
    )


def side_stats_html(view: SideView, label: str) -> str:
    state = "done" if view.done else ("running" if view.prefill else "waiting")
    return (
        f'<div class="side-stats" style="font-size:14px"><b>{html.escape(label)}</b> · {state} · '
        f'<span class="elapsed">{_text(view.elapsed_s, ".2f")} s</span> · '
        f'<span class="ntok">{view.num_tokens} tokens</span> · '
        f'<span class="toks">{_text(view.tokens_per_s, ".1f")} tok/s</span></div>'
    )


def _text(value, spec: str = "") -> str:
    """`value` as escaped HTML text, formatted with `spec` when it is a number. A report from a
    trace file is checked field by field when it is read; this escapes whatever reaches the page
    anyway (a value of the wrong type is shown as text, never as markup)."""
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return html.escape(format(value, spec))
    return html.escape(str(value))


def _ms(seconds) -> str:
    return _text(seconds * 1000, ".0f") if isinstance(seconds, (int, float)) else _text(seconds)


def _lane_lossless(lane) -> str:
    if lane.identical is None:
        return "not checked"
    if lane.identical:
        return '<span style="color:#127a2a">identical ✓</span>'
    if lane.lossless == "near_tie":
        return f'<span style="color:#9a6700">near-tie at token {_text(lane.first_difference)}</span>'
    return f'<span style="color:{DIFF}">✗ differs at token {_text(lane.first_difference)}</span>'


def _lanes_table(report: RaceReport) -> str:
    """One row per lane raced: the numbers that compare the methods, on each lane's own clock."""
    head = ("lane", "tau", "drafter passes / cycle", "draft ms / cycle", "tok/s", "speedup", "same output as plain")
    rows = []
    for name, lane in report.lanes.items():
        cells = (
            f'<span style="color:{LANE_COLORS.get(name, "#111")};font-weight:600">{html.escape(LABELS.get(name, name))}</span>',
            _text(lane.tau, ".2f") if name != "plain" else "1",
            _text(lane.draft_passes_per_cycle, ".2g") if name != "plain" else "–",
            _text(lane.draft_ms_per_cycle, ".1f") if name != "plain" else "–",
            _text(lane.tok_s, ".1f"),
            f"{_text(lane.speedup, '.2f')}×",
            _lane_lossless(lane) if name != "plain" else "–",
        )
        rows.append("<tr>" + "".join(f'<td style="padding:2px 10px">{c}</td>' for c in cells) + "</tr>")
    header = "".join(f'<th style="padding:2px 10px;text-align:left;color:#667;font-weight:500">{h}</th>' for h in head)
    return (
        f'<table class="lanes-table" style="font-size:14px;border-collapse:collapse;margin:4px 0">'
        f"<tr>{header}</tr>{''.join(rows)}</table>"
    )


def summary_html(report: RaceReport | None, note: str = "") -> str:
    if report is None:
        return f'<div class="race-summary" style="color:#667">{html.escape(note) or "Run a prompt to start the race."}</div>'
    verdict = report.lossless
    if report.identical is None and report.stopped:
        lossless = "not checked (stopped before both sides reached the same length)"
    elif report.identical is None:
        lossless = "not checked (sampling: outputs may differ by design)"
    elif report.identical is True:
        lossless = '<span style="color:#127a2a">identical ✓</span>'
    elif verdict and verdict.kind == "near_tie":
        lossless = (
            f'<span style="color:#9a6700">near-tie at token {_text(verdict.position)}</span> '
            f'(target top-2 margin {_text(verdict.top2_margin, ".3g")}; {_text(verdict.dtype)} rounding, not a bug)'
        )
    else:
        lossless = (
            f'<span style="color:{DIFF}">✗ BUG: differ at token {_text(report.first_difference)}</span> '
            "where the target's choice was clear (outlined in both panes)"
        )
    cells = [
        ("speedup", f"{_text(report.speedup, '.2f')}×"),
        ("tau (mean acceptance length)", _text(report.tau, ".2f")),
        ("DFlash tok/s", _text(report.dflash_tok_s, ".1f")),
        ("plain tok/s", _text(report.plain_tok_s, ".1f")),
        ("TTFT DFlash / plain", f"{_ms(report.dflash_ttft_s)} / {_ms(report.plain_ttft_s)} ms"),
        ("lossless check (temperature 0)", lossless),
    ]
    body = "".join(
        f'<div style="padding:4px 10px"><div style="color:#667;font-size:12px">{k}</div>'
        f'<div style="font-size:18px">{v}</div></div>'
        for k, v in cells
    )
    extra = f'<div style="color:#667;font-size:12px">{html.escape(note)}</div>' if note else ""
    table = _lanes_table(report) if len(report.lanes) > 2 else ""
    return f'<div class="race-summary" style="display:flex;flex-wrap:wrap;gap:6px">{body}</div>{table}{extra}'
