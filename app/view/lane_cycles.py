""""Inside a cycle" for every lane kind: which view lays out a lane's cycle (`lane_cycle_html`), the
views of the two lanes that do not draft in one pass, and the scheduled block's.

The AR drafter drafts token by token: one forward of its own per draft, each reading the token the
pass before proposed, with the target's features injected as for DFlash. Prompt lookup runs no
model: it copies the tokens that followed the latest earlier occurrence of the context's last
n-gram, found again here from the recorded context (`dflash_core.ngram`, the engine's own search),
and the view names where that occurrence is: in the prompt or in the text generated so far. Both
then show the target's verdict per slot, the kept prefix and the bonus, and the cycle's time beside
a plain decoding step. The scheduled block's cycle is DFlash's pass with a choice before the verify:
how many of its drafts are worth verifying (`dflash_core.schedule`); its view shows what was drafted,
the drafter's chance for each, what was verified, and a paused drafter's plain steps. Every view
stays within CYCLE_BYTES, as `cycle_view.py`'s do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dflash_core import DEFAULT_NGRAM_SIZES, find_match

from ..race.lanes import LABELS
from .budget import CYCLE_BYTES, first_within
from .cycle_view import (
    _MARKUP_BYTES,
    CYCLE_CSS,
    SPLIT_COLORS,
    _bar,
    _caches,
    _cycle_times,
    _esc,
    _index,
    _injected,
    _slots,
    _slots_grid,
    _tok,
    cycle_html,
    mean_cycle_s,
    plain_step_s,
)
from .render import COLORS, cycle_label
from .tips import topk_rows

SNIPPET_BEFORE = 6  # context tokens drawn before a lookup match
SNIPPET_COPIED = 15  # copied tokens drawn after it (a crafted trace may hold a thousand)


def lane_cycle_html(snap, lane: str, index, text_of: Callable[[int], str], prompt_ids=()) -> str:
    """The view of cycle `index` of `lane` in the race snapshot `snap` (None: nothing raced yet);
    `prompt_ids`: the prompt the race decoded (prompt lookup searches it)."""
    if snap is None:
        return cycle_html(None, None, None, text_of, lane=lane)
    view = snap.lanes.get(lane)
    if view is None:
        return (f'<style>{CYCLE_CSS}</style><div class="cycle" style="color:#667">The {_esc(LABELS[lane])} lane is not '
                "in this race: add it under “Also race”, or pick a lane that raced.</div>")
    if lane == "ar" and view.blocks:
        return ar_cycle_html(view, snap.plain, snap.lanes.get("dflash"), index, text_of)
    if lane == "lookup" and view.blocks:
        return lookup_cycle_html(view, snap.plain, index, text_of, prompt_ids)
    if lane == "scheduled" and view.blocks:
        return scheduled_cycle_html(view, snap.plain, index, text_of)
    return cycle_html(view, snap.plain, index, text_of, snap.lanes.get("ar"), lane)


def _head(lane: str, block, last: int, positions: list[int]) -> str:
    verified = block.verified  # the drafts a block schedule left unverified hold no position in the verify
    n = block.acceptance_length
    end = positions[0] + verified + (1 if block.accepted == verified else 0)
    return (
        f'<style>{CYCLE_CSS}</style><div class="cycle" id="cycle-{_esc(block.index + 1)}">'
        f"<h4>{_esc(LABELS[lane])} lane · Cycle {_esc(block.index + 1)} of {last + 1} · positions "
        f"{_esc(positions[0])}–{_esc(end)} · {cycle_label(block)} → {n} token{'s' if n > 1 else ''}</h4>"
    )


def _positions(block) -> list[int]:
    explain = block.explain
    drafts = len(block.draft_ids)
    return list(explain.positions if explain is not None else range(block.position, block.position + drafts + 1))


def _verdict_and_end(view, index: int, positions: list[int], text_of, first: str, fixed: int,
                     ranked: bool = True, steps: tuple[str, str, str] = ("3, 4 · ", "4 · ", "5 · ")) -> str:
    """Steps 3 to 5: the target's verdict per slot (the first row headed `first`, with the drafter's
    top-3 unless not `ranked`), the kept prefix and the bonus, within what is left of CYCLE_BYTES
    after `fixed` bytes. `steps` numbers the verdict's heading, its row and the prefix's heading."""
    block = view.blocks[index]
    slots = first_within(_slots(view, index, positions, text_of, ranked), lambda slot: slot.bytes,
                         CYCLE_BYTES - fixed - _MARKUP_BYTES)
    kept = [slot.accepted for slot in slots if slot.accepted]
    kept_text = " ".join(kept) or "(none)"
    if len(kept) < block.accepted:
        kept_text += f" … and {block.accepted - len(kept)} more"
    n = block.acceptance_length
    verdict = f"{steps[1]}target's verdict"
    return (
        f"<h4>{steps[0]}the target's verdict on each draft, all in one target pass</h4>"
        f"{_slots_grid(slots, block, first, verdict)}"
        f"<h4>{steps[2]}accepted prefix and bonus</h4><div>{kept_text} + bonus "
        f"{_tok(text_of(block.bonus_id), COLORS['bonus'])}"
        f" → {n} token{'s' if n > 1 else ''} from one target pass.</div>"
    )


def _time_bars(view, plain, index: int, lane: str, draft_name: str, extra=None) -> str:
    """This cycle's draft / verify / other time against one plain decoding step (and `extra`, a
    (label, parts) bar)."""
    draft_s, verify_s, other_s = _cycle_times(view, index)
    step = plain_step_s(plain)
    parts = [(draft_name, draft_s, SPLIT_COLORS["draft"]), ("verify", verify_s, SPLIT_COLORS["verify"]),
             ("other", other_s, SPLIT_COLORS["other"])]
    scale = max(draft_s + verify_s + other_s, step or 0.0, sum(s for _, s, _ in extra[1]) if extra else 0.0) or 1.0
    bars = _bar(f"this {LABELS[lane]} cycle", parts, scale)
    if step:
        bars += _bar("one plain decoding step", [("plain step", step, SPLIT_COLORS["plain"])], scale)
    if extra:
        bars += _bar(extra[0], extra[1], scale)
    n = view.blocks[index].acceptance_length
    cost = (f"<div>This cycle cost {(draft_s + verify_s + other_s) / step:.2f} plain steps and committed {n} "
            f"token{'s' if n > 1 else ''}.</div>") if step else ""
    return bars + cost


def ar_cycle_html(view, plain, dflash, index, text_of: Callable[[int], str]) -> str:
    """Cycle `index` of the AR drafter lane (`view`; None or out of range: the latest): its passes one
    draft at a time, each with its top-3, then the target's verdict, the caches and the time, beside
    DFlash's one pass when DFlash raced."""
    last = len(view.blocks) - 1
    index = _index(index, last)
    block = view.blocks[index]
    explain = block.explain
    positions = _positions(block)
    drafts = len(block.draft_ids)
    passes = block.draft_passes or drafts
    head = _head("ar", block, last, positions)
    if not drafts:
        return head + "<div>Block size 1: nothing is drafted, every cycle is a plain step.</div></div>"
    rows = explain.draft_topk if explain is not None else ()
    reads = [explain.slot0_id if explain is not None and explain.slot0_id is not None else None, *block.draft_ids]

    def column(i: int) -> tuple[str, str, str, str]:
        read = reads[i]
        reading = _tok(text_of(read), COLORS["bonus"] if i == 0 else None) if read is not None else "the last token"
        draft = block.draft_ids[i]
        top = topk_rows(rows[i], text_of, draft, k=3) if i < len(rows) else _tok(text_of(draft))
        return (f"<th>pass {i + 1}</th>", f"<td>{reading}</td>", f"<td>{_esc(positions[i])}</td>", f"<td>{top}</td>")

    intro = (f"<h4>1 · the drafter drafts token by token: {passes} forward pass{'es' if passes != 1 else ''} of its "
             "own, one per draft</h4><div>Pass 1 reads the token committed last (slot 0); each later pass reads the "
             "draft the pass before it proposed, so the passes run one after another.</div>")
    injected = f"<h4>2 · target features injected into every drafter layer</h4><div>{_injected(explain)}</div>"
    mean = mean_cycle_s(dflash)
    draft_s = _cycle_times(view, index)[0]
    if mean is not None:
        cycles, _, d_draft, d_verify, d_other = mean
        extra = (f"a DFlash cycle (1 pass, measured, mean of {cycles})",
                 [("1× draft", d_draft, SPLIT_COLORS["draft"]), ("verify", d_verify, SPLIT_COLORS["verify"]),
                  ("other", d_other, SPLIT_COLORS["other"])])
        against = (f" DFlash's drafter proposed all its slots in <b>1</b> pass: {1000 * d_draft:.1f} ms per cycle on "
                   "average here.")
    else:
        extra, against = None, " A block-diffusion drafter (DFlash) proposes every slot in one pass."
    time = (f"<h4>7 · where the time went</h4>{_time_bars(view, plain, index, 'ar', f'{passes}× draft', extra)}"
            f"<div>{passes} drafter passes took {1000 * draft_s:.1f} ms ({1000 * draft_s / passes:.1f} ms each)."
            f"{against}</div>")
    tail = f"<h4>6 · caches kept</h4><div>{_caches(explain)}</div>{time}</div>"
    fixed = sum(len(part.encode()) for part in (head, intro, injected, tail)) + _MARKUP_BYTES
    budget = (CYCLE_BYTES - fixed) // 2  # half for the passes, half for the verdict grid
    columns = first_within((column(i) for i in range(drafts)), lambda cells: sum(len(c.encode()) for c in cells),
                           budget)
    left = drafts - len(columns)
    table = '<table class="grid">' + "".join(
        f"<tr><th>{label}</th>{''.join(cells[k] for cells in columns)}</tr>"
        for k, label in enumerate(("", "reads", "at position", "proposes: its top-3"))) + "</table>"
    more = f'<div style="color:#889">… {left} more passes not drawn</div>' if left > 0 else ""
    verdict = _verdict_and_end(view, index, positions, text_of, "3 · the drafter's pass for this slot: top-3",
                               fixed + budget)
    return f"{head}{intro}{table}{more}{injected}{verdict}{tail}"


def lookup_cycle_html(view, plain, index, text_of: Callable[[int], str], prompt_ids=()) -> str:
    """Cycle `index` of the prompt-lookup lane (`view`; None or out of range: the latest): where in the
    context it found the n-gram it copied from and what it copied (found again from the prompt and
    the tokens committed before the cycle), then the target's verdict and the time. No model runs."""
    last = len(view.blocks) - 1
    index = _index(index, last)
    block = view.blocks[index]
    positions = _positions(block)
    head = _head("lookup", block, last, positions)
    search = ("<h4>1 · the search: no model, the context is searched for its own end</h4>"
              f"{_search(view, index, text_of, prompt_ids)}")
    draft_s = _cycle_times(view, index)[0]
    time = (f"<h4>6 · where the time went</h4>{_time_bars(view, plain, index, 'lookup', 'search')}"
            f"<div>No drafter pass: the search took {1000 * draft_s:.2f} ms, and the target's one pass verified the "
            "copied tokens.</div></div>")
    fixed = sum(len(part.encode()) for part in (head, search, time))
    verdict = _verdict_and_end(view, index, positions, text_of, "3 · copied from the context", fixed, ranked=False)
    return f"{head}{search}{verdict}{time}"


def _search(view, index: int, text_of, prompt_ids) -> str:
    """Where the cycle's drafts were copied from: the context's last n tokens, their earlier
    occurrence (in the prompt or in the output, by position) and the tokens that followed it."""
    block = view.blocks[index]
    if view.prefill is None or not prompt_ids:
        return ("<div>The prompt of this run is not on hand: the place the drafts were copied from cannot be "
                "shown.</div>")
    output = [view.prefill.token_id]
    for earlier in view.blocks[:index]:
        output.extend(earlier.committed_ids)
    context = [*prompt_ids, *output]
    match = find_match(context, DEFAULT_NGRAM_SIZES, max(view.block_size - 1, 1))
    sizes = ", ".join(str(n) for n in DEFAULT_NGRAM_SIZES)
    if match is None:
        if block.draft_ids:
            return ("<div>The search of this run's context gives no match, yet the cycle drafted: it was recorded "
                    "with other settings.</div>")
        tail = " ".join(_tok(text_of(t)) for t in context[-DEFAULT_NGRAM_SIZES[0]:])
        return (f"<div>The context ends with {tail}. Neither its last {sizes.replace(', 1', ' nor 1')} tokens occur "
                "earlier in the prompt or the output, so there is nothing to copy: the cycle verifies the bonus "
                "alone, as a plain decoding step does.</div>")
    if tuple(match.tokens) != tuple(block.draft_ids):
        return ("<div>The search of this run's context finds other tokens than the cycle drafted: it was recorded "
                "with other settings.</div>")
    prompt_len = len(prompt_ids)
    at = (f"position {match.start}" if match.n == 1 else f"positions {match.start}–{match.start + match.n - 1}")
    where = (f"in the prompt, at {at} of its {prompt_len}" if match.start + match.n <= prompt_len else
             f"in the text generated so far, at {at} (output token {match.start - prompt_len + 1})"
             if match.start >= prompt_len else f"across the end of the prompt, at {at}")
    tail = " ".join(_tok(text_of(t), COLORS["first"]) for t in context[-match.n:])
    before = context[max(0, match.start - SNIPPET_BEFORE):match.start]
    shown = list(match.tokens[:SNIPPET_COPIED])
    snippet = (("… " if match.start > SNIPPET_BEFORE else "")
               + " ".join(_tok(text_of(t)) for t in before) + " "
               + " ".join(_tok(text_of(t), COLORS["first"]) for t in context[match.start:match.start + match.n]) + " "
               + " ".join(_tok(text_of(t), COLORS["accepted"]) for t in shown)
               + (f" … and {len(match.tokens) - len(shown)} more" if len(match.tokens) > len(shown) else ""))
    return (
        f"<div>The context (prompt and output) ends with the {match.n}-gram {tail}. Its latest earlier occurrence "
        f"followed by tokens to copy is {where}. The drafts are the {len(match.tokens)} token"
        f"{'s' if len(match.tokens) != 1 else ''} that followed it there (n-grams of {sizes} tokens are tried, longest "
        f"first):</div><div style=\"margin:4px 0\">{snippet}</div>"
    )


def scheduled_cycle_html(view, plain, index, text_of: Callable[[int], str]) -> str:
    """Cycle `index` of the scheduled lane (`view`; None or out of range: the latest): how many drafts the
    schedule drafted and how many it verified, with the drafter's probability for each draft and the
    chance that every draft up to it is kept (what the schedule weighs against the verify's cost),
    then the target's verdict on the verified ones and the time. A paused cycle is a plain step."""
    last = len(view.blocks) - 1
    index = _index(index, last)
    block = view.blocks[index]
    positions = _positions(block)
    head = _head("scheduled", block, last, positions)
    drafts, verified = len(block.draft_ids), block.verified
    bonus = _tok(text_of(block.bonus_id), COLORS["bonus"])
    time = (f"<h4>where the time went</h4>{_time_bars(view, plain, index, 'scheduled', 'draft')}"
            f"<div>The schedule learns these costs from the run's own cycles: a verify of more tokens costs more "
            "here, and a draft costs its pass whatever is kept.</div></div>")
    if not drafts:
        choice = ("<h4>1 · the schedule's choice: no draft</h4><div>The schedule paused the drafter: the best verify "
                  "it could buy in the cycles before was still slower than a plain decoding step. So no drafter pass "
                  f"ran, and the target's pass over the last token decoded {bonus} alone, as plain decoding does. The "
                  "drafter takes the features of the paused positions when it drafts again.</div>")
        return f"{head}{choice}{time}"
    fixed = sum(len(part.encode()) for part in (head, time)) + _MARKUP_BYTES
    weighed, weighed_bytes = _schedule_table(block, text_of, (CYCLE_BYTES - fixed) // 2)
    choice = (f"<h4>1 · the schedule's choice: {drafts} draft{'s' if drafts > 1 else ''} in one pass, "
              f"{verified} verified</h4><div>The drafter proposed {drafts} slots in one pass (DFlash's: the noisy "
              "block, the injected features); the schedule asks for a few more than the most it verified in recent "
              "cycles (the whole block at first). It then verified the first k drafts, the k with the most expected "
              "tokens per second: 1 (the bonus) + the chances kept up to slot k, over the cycle's cost with a verify "
              "of k + 1 tokens. The chances below are the drafter's own; the schedule scales them by how often the "
              f"run's earlier drafts were kept.</div>{weighed}")
    if not verified:
        verdict = (f"<h4>2 · the target's pass</h4><div>No draft was worth its verify: the target verified slot 0 "
                   f"alone and decoded {bonus}, as a plain step does. The drafter's pass was spent.</div>")
    else:
        shown = replace(view, blocks=(*view.blocks[:index], replace(block, draft_ids=block.draft_ids[:verified]),
                                      *view.blocks[index + 1:]))
        verdict = _verdict_and_end(shown, index, positions, text_of, "the drafter's pass: top-3",
                                   fixed + weighed_bytes + len(choice.encode()), steps=("2 · ", "the ", "3 · "))
    return f"{head}{choice}{verdict}{time}"


def _schedule_table(block, text_of: Callable[[int], str], budget: int) -> tuple[str, int]:
    """(the per-draft table: draft, the drafter's probability for it, the chance that it and every
    draft before it are kept, verified or not; its bytes), its columns within `budget` bytes."""
    rows = block.explain.draft_topk if block.explain is not None else ()
    chance = 1.0

    def column(k: int) -> tuple[str, str, str, str, str]:
        nonlocal chance
        draft = block.draft_ids[k]
        p = next((float(q) for token, q in (rows[k] if k < len(rows) else ()) if token == draft), None)
        chance = chance * p if p is not None and chance is not None else None
        checked = ('<td style="color:#127a2a">✓ verified</td>' if k < block.verified
                   else '<td style="color:#667">not verified</td>')
        return (f"<th>slot {k + 1}</th>", f"<td>{_tok(text_of(draft))}</td>", f"<td>{_percent(p)}</td>",
                f"<td>{_percent(chance)}</td>", checked)

    columns = first_within((column(k) for k in range(len(block.draft_ids))),
                           lambda cells: sum(len(c.encode()) for c in cells), budget)
    left = len(block.draft_ids) - len(columns)
    table = ('<table class="grid"><tr><th></th>' + "".join(c[0] for c in columns) + "</tr>"
             + "".join(f"<tr><th>{label}</th>{''.join(c[i] for c in columns)}</tr>" for i, label in (
                 (1, "draft"), (2, "drafter's probability"), (3, "chance kept up to here"), (4, "the schedule")))
             + "</table>" + (f'<div style="color:#889">… {left} more drafts not drawn</div>' if left > 0 else ""))
    return table, len(table.encode())


def _percent(p: float | None) -> str:
    if p is None:
        return "—"  # the draft is not in the recorded top-k (or the run recorded none)
    return "&lt;0.1%" if p < 0.001 else f"{100 * p:.1f}%"
