"""What a token's hover shows: its block and slot, the drafter's and the target's top-k, and why.

Reads a cycle's explanation (`Block.explain`, a `dflash_core.events.CycleExplanation`, or None
when the run recorded none): `draft_topk[k-1]` is the drafter's distribution for draft slot k,
`target_topk[i]` the target's for the token after slot i (so the token in slot k is scored by row
k-1), and `decision.slots` the verdict for each slot up to the first rejection.
Returns HTML; every piece of model text is escaped here.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from dflash_core.events import CycleExplanation, SlotVerdict

TIP_CSS = """
.tok, .chip { position: relative; }
.tip { display: none; position: absolute; left: 0; top: 1.6em; z-index: 60; min-width: 22em; max-width: 34em;
       background: #fffef6; color: #111; border: 1px solid #8a8f9c; border-radius: 6px; padding: 6px 8px;
       box-shadow: 0 3px 10px rgba(0,0,0,.25); font: 12px/1.35 ui-sans-serif, system-ui, sans-serif;
       white-space: normal; text-decoration: none; opacity: 1; }
.tok:hover > .tip, .chip:hover > .tip { display: block; }
.tip table { border-collapse: collapse; margin-top: 3px; }
.tip td { padding: 0 6px 0 0; font-family: ui-monospace, monospace; white-space: pre; }
.tip .cols { display: flex; gap: 14px; }
.tip .pick { font-weight: 700; }
.tip .why { margin-top: 4px; }
"""


# Probabilities are shown as a trace stores them (rounded to 4 digits by `build_trace`), so a
# replay shows the same numbers as the live run did.
DIGITS = 4


def prob(x) -> float:
    return round(float(x), DIGITS)


# The panes and the strip scroll, which would clip a hover box inside them; on hover the box is
# placed in the viewport instead, under the token (above it near the bottom of the window).
TIP_JS = """
element.addEventListener('mouseover', (event) => {
  const host = event.target.closest('.tok, .chip');
  const tip = host && host.querySelector(':scope > .tip');
  if (!tip) return;
  const box = host.getBoundingClientRect();
  tip.style.position = 'fixed';
  tip.style.left = Math.max(4, Math.min(box.left, window.innerWidth - tip.offsetWidth - 8)) + 'px';
  const height = tip.offsetHeight;
  const below = box.bottom + 4;
  tip.style.top = (below + height > window.innerHeight ? Math.max(4, box.top - height - 4) : below) + 'px';
});
"""


def visible(text: str) -> str:
    """Whitespace made visible, so a space or newline token can be seen in a list."""
    return text.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "␣") if text.strip() == "" else text.replace("\n", "⏎")


def topk_rows(pairs, text_of: Callable[[int], str], pick: int | None = None, k: int = 5) -> str:
    rows = []
    for token, p in list(pairs or [])[:k]:
        cls = ' class="pick"' if token == pick else ""
        rows.append(
            f"<tr{cls}><td>{html.escape(repr(visible(text_of(int(token))))[1:-1])}</td>"
            f"<td>{100 * prob(p):5.1f}%</td></tr>"
        )
    return "<table>" + "".join(rows) + "</table>" if rows else "<i>not recorded</i>"


def slot_decision(explain: CycleExplanation | None, slot: int) -> SlotVerdict | None:
    for entry in explain.decision.slots if explain is not None else ():
        if entry.slot == slot:
            return entry
    return None


def _num(x) -> str:
    return "—" if x is None else f"{prob(x):.3f}"


def _tree_why(block, slot: int, text_of: Callable[[int], str]) -> str:
    """`why` for a tree-verified cycle: slot s holds the walked node at depth s, or the bonus."""
    tree, nodes = block.tree, len(block.tree.tokens) - 1
    if slot > len(block.draft_ids):
        return (f"The target verified a tree of {nodes} drafts in one pass and walked {len(block.draft_ids)} of them; "
                f"no child of the last node walked held its own next token {text_of(tree.bonus_id)!r}: the bonus.")
    node, parent = tree.path[slot], tree.path[slot - 1]
    first = min(n for n in range(1, len(tree.tokens)) if tree.parents[n] == parent)
    how = ("the drafter's first choice here" if node == first else
           f"a sibling: the drafter's first choice here, {text_of(tree.tokens[first])!r}, was not the target's, so a chain "
           "would have stopped")
    return (f"Accepted: node {node} at depth {slot} of this cycle's tree of {nodes} drafts holds the target's own token "
            f"(drafter q = {prob(tree.probs[node])}), {how}.")


def why(block, slot: int, text_of: Callable[[int], str]) -> str:
    """Why the token in `slot` of `block` is what it is, in a sentence (plain text, unescaped)."""
    explain = block.explain
    rule = explain.decision.rule if explain is not None else "greedy"
    accepted = block.accepted
    bonus = repr(text_of(block.bonus_id))
    if block.tree is not None:
        return _tree_why(block, slot, text_of)
    if not block.draft_ids:
        return (f"No drafts this cycle (block size 1, or a block schedule pausing a drafter that was not paying): "
                f"the target decoded {bonus} alone, as plain decoding does.")
    if slot > len(block.draft_ids):
        return f"All {len(block.draft_ids)} drafts were accepted; the target adds its own next token {bonus} (the bonus)."
    verified, drafts = block.verified, len(block.draft_ids)
    if slot > verified and accepted == verified:  # the block schedule's cut, not a rejection
        return (
            f"All {verified} verified drafts were accepted; the target adds its own next token {bonus} (the bonus). "
            f"The block schedule verified {verified} of this cycle's {drafts} drafts: the rest were worth less than "
            "their verify cost."
        )
    if slot > verified:
        return (
            f"Not verified: the block schedule verified {verified} of this cycle's {drafts} drafts, and slot "
            f"{accepted + 1} among them was rejected."
        )
    draft = repr(text_of(block.draft_ids[slot - 1]))
    entry = slot_decision(explain, slot)
    if slot <= accepted:
        if rule == "rejection" and entry:
            return (
                f"Accepted: u = {_num(entry.u)} ≤ p/q = {_num(entry.ratio)} "
                f"(target p = {_num(entry.p)}, drafter q = {_num(entry.q)})."
            )
        if rule == "match":
            return f"Accepted: the target's sampled token here is the draft {draft}."
        return f"Accepted: the draft {draft} is the target's own top choice here."
    if slot == accepted + 1:
        if rule == "rejection" and entry:
            resampled = explain.decision.resampled
            fill = "a token resampled from the residual max(p − q, 0)" if resampled else "its own token"
            return (
                f"Rejected: u = {_num(entry.u)} > p/q = {_num(entry.ratio)} "
                f"(target p = {_num(entry.p)}, drafter q = {_num(entry.q)}); "
                f"the target puts {fill}, {bonus}, here instead (the bonus token)."
            )
        return f"Rejected: the target chose {bonus}, not the draft {draft}; {bonus} is committed as the bonus token."
    return (
        f"Discarded unverified: an earlier slot ({accepted + 1}) was rejected, and every draft after the first "
        "rejection is thrown away (the target's row here assumed the rejected prefix)."
    )


def token_tip(block, slot: int, what: str, text_of: Callable[[int], str], chosen: int) -> str:
    """The hover box for the token `chosen` in `slot` (1..B) of `block`; `what` names its kind."""
    explain = block.explain
    head = f"<b>cycle {html.escape(str(block.index + 1))} · slot {slot}</b> · {html.escape(what)}"
    if explain is None:
        return f'<span class="tip">{head}<div class="why">{html.escape(why(block, slot, text_of))}</div></span>'
    draft_rows, target_rows = explain.draft_topk, explain.target_topk
    draft_pick = block.draft_ids[slot - 1] if slot <= len(block.draft_ids) else None
    cols = []
    if 1 <= slot <= len(draft_rows):
        cols.append(f"<div>drafter top-{len(draft_rows[slot - 1])}{topk_rows(draft_rows[slot - 1], text_of, draft_pick)}</div>")
    if 1 <= slot <= len(target_rows):
        cols.append(f"<div>target top-{len(target_rows[slot - 1])}{topk_rows(target_rows[slot - 1], text_of, chosen)}</div>")
    return (
        f'<span class="tip">{head}<div class="cols">{"".join(cols)}</div>'
        f'<div class="why">{html.escape(why(block, slot, text_of))}</div></span>'
    )


def plain_tip(block, text_of: Callable[[int], str]) -> str:
    """The hover box for a plain-decoding token: the target's own top-k at that step."""
    rows = block.explain.target_topk if block.explain is not None else ()
    table = topk_rows(rows[0], text_of, block.bonus_id) if rows else "<i>not recorded</i>"
    return (
        f'<span class="tip"><b>step {html.escape(str(block.index))}</b> · decoded by the target alone<div>target top-k{table}</div>'
        '<div class="why">Plain decoding: one target pass for this one token.</div></span>'
    )
