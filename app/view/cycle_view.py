""""Inside a cycle": one cycle of a one-pass drafting lane (DFlash, DFlash2, input fusion) laid out in
the order it happens, from its explanation.

1 the noisy block the drafter sees (slot-0 token, then mask slots, with positions); 2 the target
features injected into every drafter layer (fused at its input, for input fusion); 3 the drafter's
single pass proposing every slot (its top-3 per slot; for DFlash2, each slot's candidates with the
path its selector walked through them); 4 the target's verdict per slot (its own top-3); 5 the accepted prefix and the
bonus token; 6 the cache lengths kept; 7 the cycle's time split against one plain decoding step,
beside an autoregressive drafter's cycle: measured when the race has an AR lane, else estimated
from DFlash's pass. All text is escaped here. The view (also the cycle picker's answer) stays
within CYCLE_BYTES: its slots are drawn in order until the budget is spent, the others counted.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dflash_core.events import CycleExplanation

from ..race.lanes import LABELS
from .budget import CYCLE_BYTES, first_within
from .render import COLORS, cycle_label
from .tips import prob, slot_decision, topk_rows, visible, why
from .tree_view import tree_cycle_html

PATH_SHOWN = 6  # a DFlash2 slot's candidates drawn, in the head's order (the one walked to always is)

CYCLE_CSS = """
.cycle { font: 13px/1.4 ui-sans-serif, system-ui, sans-serif; color: #111; }
.cycle h4 { margin: 10px 0 4px; font-size: 14px; }
.cycle table.grid { border-collapse: collapse; }
.cycle table.grid td, .cycle table.grid th { border: 1px solid #d5d8e0; padding: 3px 6px; vertical-align: top; }
.cycle table.grid th { background: #f3f5f9; text-align: left; font-weight: 600; white-space: nowrap; }
.cycle .mask { color: #777; background: #eceff4; border-radius: 3px; padding: 0 4px; font-family: ui-monospace, monospace; }
.cycle .tk { font-family: ui-monospace, monospace; border-radius: 3px; padding: 0 3px; white-space: pre; }
.cycle table.grid table td { font-family: ui-monospace, monospace; padding: 0 4px 0 0; border: 0; white-space: pre; }
.cycle .pick { font-weight: 700; }
.cycle table.grid table tr.walk td { font-weight: 700; background: #fcc2d7; }
.cycle table.grid table td.rank { color: #667; }
.cycle .bar { display: flex; height: 20px; border-radius: 3px; overflow: hidden; font-size: 11px; color: #111; }
.cycle .bar > div { display: flex; align-items: center; justify-content: center; overflow: hidden; white-space: nowrap; }
.cycle .barrow { display: grid; grid-template-columns: 15em 1fr 6em; gap: 8px; align-items: center; margin: 3px 0; }
"""

SPLIT_COLORS = {"draft": "#74c0fc", "verify": "#8ce99a", "other": "#dee2e6", "plain": "#bac8ff"}


def _esc(value) -> str:
    """A number from a trace as HTML text (a trace is validated when read; this is the second guard)."""
    return html.escape(str(value))


def _tok(text: str, color: str | None = None) -> str:
    style = f' style="background:{color}"' if color else ""
    return f'<span class="tk"{style}>{html.escape(visible(text))}</span>'


def _cycle_times(view, index: int) -> tuple[float, float, float]:
    """(draft, verify, other) seconds of cycle `index`: recorded split, else from the clocks."""
    block = view.blocks[index]
    if block.explain is not None:
        split = block.explain.time
        return split.draft_s, split.verify_s, split.other_s
    before = view.blocks[index - 1].elapsed_s if index else view.prefill.seconds
    return block.draft_s, block.verify_s, max(block.elapsed_s - before - block.draft_s - block.verify_s, 0.0)


def plain_step_s(plain) -> float | None:
    """Mean seconds per plain decoding step shown so far."""
    if plain is None or plain.prefill is None or not plain.blocks:
        return None
    return (plain.blocks[-1].elapsed_s - plain.prefill.seconds) / len(plain.blocks)


def _bar(label: str, parts: list[tuple[str, float, str]], scale: float) -> str:
    total = sum(s for _, s, _ in parts)
    cells = "".join(
        f'<div title="{html.escape(name)}: {s * 1000:.1f} ms" style="width:{100 * s / scale:.2f}%;background:{color}">'
        f"{html.escape(name) if s / scale > 0.12 else ''}</div>"
        for name, s, color in parts
        if s > 0
    )
    return (
        f'<div class="barrow"><div>{html.escape(label)}</div><div class="bar">{cells}</div>'
        f"<div>{total * 1000:.1f} ms</div></div>"
    )


@dataclass(frozen=True)
class _Slot:
    """What one slot adds to the view: its noisy-block cells (slot, position, drafter input; none
    for the bonus column), its grid cells (head, position, drafter, verdict, committed) and its
    chip in the accepted prefix (empty unless accepted)."""

    noisy: tuple[str, str, str] | None
    grid: tuple[str, str, str, str, str]
    accepted: str

    @property
    def bytes(self) -> int:
        return sum(len(part.encode()) for part in (*(self.noisy or ()), *self.grid, self.accepted))


def cycle_html(dflash, plain, index, text_of: Callable[[int], str], ar=None, lane: str = "dflash") -> str:
    """The view of cycle `index` of `lane` (None, not a whole number or past the end: the latest
    shown), whose view is `dflash`; `ar`: the AR drafter lane's view, when the race has one (its
    measured cycles go beside this one)."""
    style = f"<style>{CYCLE_CSS}</style>"
    if dflash is None or not dflash.blocks:
        return style + f'<div class="cycle" style="color:#667">No {_esc(LABELS[lane])} cycle yet: start a race or a replay.</div>'
    if dflash.blocks[-1].tree is not None:  # a tree-verified lane: its cycles are drawn as their trees
        return tree_cycle_html(dflash, _index(index, len(dflash.blocks) - 1), text_of, lane, plain_step_s(plain))
    if not dflash.blocks[0].draft_ids:
        return style + '<div class="cycle" style="color:#667">Block size 1: nothing is drafted, every cycle is a plain step.</div>'
    last = len(dflash.blocks) - 1
    index = _index(index, last)
    block = dflash.blocks[index]
    explain = block.explain
    drafts = len(block.draft_ids)
    positions = list(explain.positions if explain is not None else range(block.position, block.position + drafts + 1))
    n = block.acceptance_length
    note = (
        ""
        if explain is not None
        else '<p style="color:#a61e4d">This run was recorded without explanations: top-k lists, injection and caches are not available.</p>'
    )
    whose = "" if lane == "dflash" else f"{_esc(LABELS[lane])} lane · "
    # The bonus column (every draft kept) lies one position past the block: the range shown covers it.
    end = positions[0] + drafts + (1 if block.accepted == drafts else 0)
    head = (
        f'{style}<div class="cycle" id="cycle-{_esc(block.index + 1)}">'
        f"<h4>{whose}Cycle {_esc(block.index + 1)} of {last + 1} · positions {_esc(positions[0])}–{_esc(end)} · "
        f"{cycle_label(block)} → {n} token{'s' if n > 1 else ''}</h4>{note}"
    )
    fused = lane == "fusion"
    how = "fused once at the drafter's input" if fused else "injected into every drafter layer"
    injected = f"<h4>2 · target features {how}</h4><div>{_injected(explain, fused)}</div>"
    bonus = (f" + bonus {_tok(text_of(block.bonus_id), COLORS['bonus'])}"
             f" → {n} token{'s' if n > 1 else ''} from one target pass.</div>")
    tail = (f"<h4>6 · caches kept</h4><div>{_caches(explain)}</div>"
            f"<h4>7 · where the time went</h4>{_time_split(dflash, plain, index, ar, lane)}</div>")
    walk_note = _path_note(explain.path if explain is not None else None)
    fixed = sum(len(part.encode()) for part in (head, injected, bonus, tail, walk_note)) + _MARKUP_BYTES
    slots = first_within(_slots(dflash, index, positions, text_of), lambda slot: slot.bytes, CYCLE_BYTES - fixed)
    accepted = [slot.accepted for slot in slots if slot.accepted]
    accepted_text = " ".join(accepted) or "(none)"
    if len(accepted) < block.accepted:
        accepted_text += f" … and {block.accepted - len(accepted)} more"
    proposes = ("the drafter's single pass ranks each slot's candidates, its selector walks one path through them"
                if walk_note else "the drafter's single pass proposes every slot")
    return (
        f"{head}<h4>1 · the noisy block the drafter sees</h4>{_noisy_block(explain, slots, drafts + 1)}{injected}"
        f"<h4>3, 4 · {proposes}; the target's verdict on each</h4>"
        f"{_slots_grid(slots, block)}{walk_note}"
        f"<h4>5 · accepted prefix and bonus</h4><div>{accepted_text}{bonus}{tail}"
    )


# The headings, table and row markup around the slots' cells, and the notes of slots left out.
_MARKUP_BYTES = 1_000


def _index(index, last: int) -> int:
    """The cycle asked for, or the latest when `index` is None, not a whole number, or out of range."""
    try:
        index = int(index)
    except (TypeError, ValueError, OverflowError):  # None, NaN, inf, text: the picker sent something else
        return last
    return index if 0 <= index <= last else last


def _slots(view, index: int, positions: list[int], text_of, ranked: bool = True) -> Iterator[_Slot]:
    """Every slot of the cycle's view, built one at a time: 0 (the last bonus), each draft, and
    a bonus column when every draft was kept. ranked=False: each draft alone, not the drafter's
    top-3 (a copied token has no ranking)."""
    block = view.blocks[index]
    drafts = len(block.draft_ids)
    for s in range(drafts + 1 + (1 if block.accepted == drafts else 0)):
        noisy = None
        if s <= drafts:
            if s == 0:
                slot0 = block.explain.slot0_id if block.explain is not None else None
                text = text_of(slot0) if slot0 is not None else _slot0_text(view, index, text_of)
                given = f"<td>{_tok(text, COLORS['bonus'])}</td>"
            else:
                given = '<td><span class="mask">[MASK]</span></td>'
            noisy = (f"<th>{s}</th>", f"<td>{_esc(positions[s])}</td>", given)
        position = f"<td>{_esc(positions[s] if s < len(positions) else positions[-1] + 1)}</td>"
        head = f"<th>slot {s}" + (" (bonus)" if s == drafts + 1 else "") + "</th>"
        chip = _tok(text_of(block.draft_ids[s - 1]), COLORS["accepted"]) if 1 <= s <= block.accepted else ""
        yield _Slot(noisy, (head, position, *_slot_cells(block, s, text_of, ranked)), chip)


def _left_out(slots: list[_Slot], total: int) -> str:
    missing = total - len(slots)
    return f'<div style="color:#889">… {missing} more slots not drawn</div>' if missing > 0 else ""


def _noisy_block(explain: CycleExplanation | None, slots: list[_Slot], size: int) -> str:
    """Slot 0's token, then a mask in every other slot, with their positions."""
    noisy = [slot.noisy for slot in slots if slot.noisy is not None]
    mask_id = explain.mask_id if explain is not None else None
    mask_note = (
        f'<div style="color:#555">slot 0 is the token committed last; slots 1..{size - 1} hold mask_id {int(mask_id)}.</div>'
        if mask_id is not None
        else ""
    )
    return (
        '<table class="grid"><tr><th>slot</th>' + "".join(cells[0] for cells in noisy) + "</tr>"
        "<tr><th>position</th>" + "".join(cells[1] for cells in noisy) + "</tr>"
        f"<tr><th>drafter input</th>{''.join(cells[2] for cells in noisy)}</tr></table>"
        f"{_left_out(noisy, size)}{mask_note}"
    )


def _injected(explain: CycleExplanation | None, fused: bool = False) -> str:
    if explain is None:
        return "Not recorded for this run (record with explanations on to see the injected positions and layers)."
    layers = ", ".join(str(x) for x in explain.injected.target_layers)
    where = ("and fed <b>once</b>, at the drafter's input, where the block's own tokens enter (the paper's "
             "ablation of KV injection: its layers never see the target's features in their keys and values)"
             if fused else "and injected as extra keys and values into <b>every</b> drafter layer (the drafter's "
             "cache keeps the earlier ones)")
    return (
        f"{explain.injected.positions} new context position(s) (the tokens committed by the previous cycle) "
        f"from target layers [{layers}], concatenated, fused by <code>fc</code> + <code>hidden_norm</code>, "
        f"{where}."
    )


def _path_note(path) -> str:
    """What the DFlash2 selector did over the whole block, under the grid."""
    if path is None:
        return ""
    left = sum(1 for chosen in path.chosen if chosen != 0)
    top = len(path.candidates[0]) if path.candidates else 0
    return (
        f"<div style=\"color:#444\">Each slot keeps the LM head's top {top} "
        "candidates (#1 is the head's first choice). The selector scores every pair of neighbouring "
        "candidates and walks one path, slot by slot: a slot's percentages are its edges out of the "
        f"candidate walked to before it. Here the walk left the head's first choice in <b>{left}</b> of "
        f"{len(path.chosen)} slots.</div>"
    )


def _slots_grid(slots: list[_Slot], block, first: str | None = None, verdict: str = "4 · target's verdict") -> str:
    """One column per slot (and one for the bonus when every draft was kept): the drafter's top-3
    (its row headed `first`, else by the drafter's kind), the target's verdict with its top-3 (its
    row headed `verdict`), and what was committed."""
    drafts = len(block.draft_ids)
    head = "".join(slot.grid[0] for slot in slots)
    pos_row = "".join(slot.grid[1] for slot in slots)
    walked = block.explain is not None and block.explain.path is not None
    if first is None:
        first = "3 · the selector's path: each slot's candidates" if walked else "3 · drafter's one pass: top-3"
    rows = [f"<tr><th>{label}</th>{''.join(slot.grid[2 + i] for slot in slots)}</tr>" for i, label in enumerate(
        (first, f"{verdict}: its top-3", "committed")
    )]
    total = drafts + 1 + (1 if block.accepted == drafts else 0)
    return (f'<table class="grid"><tr><th></th>{head}</tr><tr><th>position</th>{pos_row}</tr>{"".join(rows)}</table>'
            f"{_left_out(slots, total)}")


def _slot_cells(block, s: int, text_of, ranked: bool = True) -> tuple[str, str, str]:
    """(drafter, verdict, committed) cells of slot `s` (ranked=False: the draft alone, no top-3)."""
    if s == 0:
        return ('<td style="color:#667">known (last bonus)</td>', '<td style="color:#667">context</td>',
                '<td style="color:#667">kept</td>')
    explain = block.explain
    drafts = len(block.draft_ids)
    draft_id = block.draft_ids[s - 1] if s <= drafts else None
    draft_rows = explain.draft_topk if explain is not None and ranked else ()
    path = explain.path if explain is not None else None
    if path is not None and s <= min(drafts, len(path.chosen)):
        drafter = f"<td>{_path_cell(path, s - 1, text_of)}</td>"
    elif s <= min(drafts, len(draft_rows)):
        drafter = f"<td>{topk_rows(draft_rows[s - 1], text_of, draft_id, k=3)}</td>"
    elif draft_id is not None:
        drafter = f"<td>{_tok(text_of(draft_id))}</td>"
    else:
        drafter = '<td style="color:#667">no slot</td>'
    target_rows = explain.target_topk if explain is not None else ()
    chosen = block.bonus_id if s == block.accepted + 1 else draft_id
    table = topk_rows(target_rows[s - 1], text_of, chosen, k=3) if s - 1 < len(target_rows) else ""
    if s <= block.accepted:
        mark = '<b style="color:#127a2a">✓ accepted</b>'
        committed = f"<td>{_tok(text_of(draft_id), COLORS['accepted'])}</td>"
    elif s == block.accepted + 1:
        mark = '<b style="color:#b8860b">★ bonus</b>' if s > drafts else '<b style="color:#c92a2a">✗ rejected</b>'
        committed = f"<td>{_tok(text_of(block.bonus_id), COLORS['bonus'])} bonus</td>"
    else:
        mark = '<span style="color:#888">— discarded</span>'
        committed = '<td style="color:#888">—</td>'
    entry = slot_decision(explain, s)
    detail = ""
    if entry is not None and entry.u is not None:
        shown = (("p", entry.p), ("q", entry.q), ("u", entry.u))
        values = " ".join(f"{name}={prob(value):.3f}" for name, value in shown if value is not None)
        detail = f'<div style="font-size:11px;color:#444">{values}</div>'
    verdict = f'<td title="{html.escape(why(block, s, text_of), quote=True)}">{mark}{table}{detail}</td>'
    return drafter, verdict, committed


def _path_cell(path, row: int, text_of) -> str:
    """Slot `row + 1`'s candidates in the head's order (#1 its first choice), each with the selector's
    probability after the candidate walked to before; the one walked to is highlighted (and drawn
    even when it ranks past PATH_SHOWN)."""
    candidates, probs, chosen = path.candidates[row], path.probs[row], path.chosen[row]
    shown = [i for i in range(min(len(candidates), PATH_SHOWN))]
    if chosen >= PATH_SHOWN:
        shown.append(chosen)
    rows = []
    for i in shown:
        walk = ' class="walk"' if i == chosen else ""
        skipped = "<tr><td>…</td></tr>" if i == chosen and chosen > PATH_SHOWN else ""
        rows.append(f'{skipped}<tr{walk}><td class="rank">#{i + 1}</td>'
                    f"<td>{html.escape(repr(visible(text_of(int(candidates[i]))))[1:-1])}</td>"
                    f"<td>{100 * prob(probs[i]):5.1f}%</td><td>{'◀ walked' if i == chosen else ''}</td></tr>")
    more = len(candidates) - len(shown)
    tail = f'<div style="font-size:11px;color:#889">… {more} more not drawn</div>' if more > 0 else ""
    return "<table>" + "".join(rows) + "</table>" + tail


def _caches(explain: CycleExplanation | None) -> str:
    if explain is None:
        return "Not recorded for this run."
    cache = explain.cache
    return (
        f"target KV cache {_esc(cache.target_before)} → {_esc(cache.target_after)} positions (cropped to the "
        f"accepted prefix); drafter cache {_esc(cache.drafter_before)} → {_esc(cache.drafter_after)}."
    )


def mean_cycle_s(view) -> tuple[int, float, float, float, float] | None:
    """(cycles, drafter passes, draft, verify, other seconds) per cycle of a lane shown so far, means;
    None before its first cycle (or without the lane)."""
    if view is None or not view.blocks or view.prefill is None:
        return None
    n = len(view.blocks)
    draft = sum(b.draft_s for b in view.blocks) / n
    verify = sum(b.verify_s for b in view.blocks) / n
    cycle = (view.blocks[-1].elapsed_s - view.prefill.seconds) / n
    return n, sum(b.draft_passes for b in view.blocks) / n, draft, verify, max(cycle - draft - verify, 0.0)


def _time_split(dflash, plain, index: int, ar=None, lane: str = "dflash") -> str:
    """Bars of this cycle's draft / verify / other time, one plain step, and an autoregressive
    drafter's cycle: the AR lane's measured mean when it races, else an estimate (one of DFlash's
    passes per slot, the rest as DFlash's)."""
    block = dflash.blocks[index]
    drafts = len(block.draft_ids)
    draft_s, verify_s, other_s = _cycle_times(dflash, index)
    step = plain_step_s(plain)
    cycle = draft_s + verify_s + other_s
    measured = mean_cycle_s(ar)
    if measured is not None:
        cycles, passes, ar_draft, ar_verify, ar_other = measured
        ar_label = f"AR drafter, {passes:.3g} passes (measured, mean of {cycles} cycles)"
        ar_parts = [(f"{passes:.3g}× draft", ar_draft, SPLIT_COLORS["draft"]), ("verify", ar_verify, SPLIT_COLORS["verify"]),
                    ("other", ar_other, SPLIT_COLORS["other"])]
    else:
        ar_label = f"AR drafter, {drafts} passes (estimate)"
        ar_parts = [(f"{drafts}× draft", drafts * draft_s, SPLIT_COLORS["draft"]), ("verify", verify_s, SPLIT_COLORS["verify"]),
                    ("other", other_s, SPLIT_COLORS["other"])]
    scale = max(cycle, step or 0.0, sum(s for _, s, _ in ar_parts)) or 1.0
    rest = [("verify", verify_s, SPLIT_COLORS["verify"]), ("other", other_s, SPLIT_COLORS["other"])]
    bars = _bar(f"this {LABELS[lane]} cycle", [("draft", draft_s, SPLIT_COLORS["draft"]), *rest], scale)
    if step:
        bars += _bar("one plain decoding step", [("plain step", step, SPLIT_COLORS["plain"])], scale)
    bars += _bar(ar_label, ar_parts, scale)
    n = block.acceptance_length
    per_plain = (
        f". This cycle cost {cycle / step:.2f} plain steps and committed {n} token{'s' if n > 1 else ''}" if step else ""
    )
    if measured is not None:
        ar_text = (f"the autoregressive drafter racing beside it took <b>{passes:.3g}</b> passes per cycle, "
                   f"{1000 * ar_draft:.1f} ms of drafting against DFlash's {1000 * draft_s:.1f} ms here")
    else:
        ar_text = f"an autoregressive (EAGLE-style) drafter would need <b>{drafts}</b> passes, one per slot"
    return (
        f"{bars}<div>The block-diffusion drafter proposed all {drafts} slots in <b>1</b> pass; {ar_text}{per_plain}.</div>"
    )


def _slot0_text(view, index: int, text_of) -> str:
    """Slot 0 is the token committed last before this cycle (the prefill's token for cycle 0)."""
    if index == 0:
        return text_of(view.prefill.token_id)
    previous = view.blocks[index - 1]
    return text_of(previous.committed_ids[-1] if previous.committed_ids else previous.bonus_id)
