""""Inside a cycle" for a tree-verified cycle: the draft tree its one drafter pass grew, drawn by
depth, and the target's walk through it (from the cycle's `Block.tree`, `dflash_core.events.TreeCycle`).

Each node is a box in the column of its depth with its token and the drafter's probability of it;
a node's first child (the drafter's best choice after it) stays on its row, so the top row is the
chain a plain DFlash cycle would have verified, and siblings open rows below. The walked path is
filled green, the bonus gold; a walked node that is not its parent's first child is starred (the
chain's draft was wrong there and the tree's sibling was right), and a node off the walk that holds
the target's own token after its parent is outlined dashed (it would have been accepted had the walk
reached it). Hovering a node names its depth, probability and the target's token after it. Below
the tree: the chain's count against the tree's, and the cycle's time against one plain step. All
text is escaped here.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from dflash_core.events import TreeCycle

from ..race.lanes import LABELS
from .render import COLORS, cycle_label
from .tips import visible

COL, BOX_W, BOX_H, ROW, TOP, LEFT = 118, 104, 32, 40, 22, 6  # the drawing's grid, in pixels
TOKEN_CHARS = 11  # a node's token as its box shows it (hover shows it whole)

TREE_CSS = """
.tree-cycle { font: 13px/1.4 ui-sans-serif, system-ui, sans-serif; color: #111; }
.tree-cycle h4 { margin: 10px 0 4px; font-size: 14px; }
.tree-cycle .scroll { overflow-x: auto; }
.tree-cycle svg text { font: 12px ui-monospace, monospace; }
.tree-cycle svg text.q { font: 10px ui-sans-serif, system-ui, sans-serif; fill: #445; }
.tree-cycle svg text.head { font: 11px ui-sans-serif, system-ui, sans-serif; fill: #556; }
.tree-cycle .legend span { display: inline-block; margin-right: 12px; }
.tree-cycle .sw { display: inline-block; width: 12px; height: 12px; vertical-align: -2px; border: 1px solid #667; margin-right: 4px; }
.tree-cycle .bar { display: flex; height: 20px; border-radius: 3px; overflow: hidden; font-size: 11px; }
.tree-cycle .bar > div { display: flex; align-items: center; justify-content: center; overflow: hidden; white-space: nowrap; }
.tree-cycle .barrow { display: grid; grid-template-columns: 15em 1fr 6em; gap: 8px; align-items: center; margin: 3px 0; }
"""

WALK, SAVED, AGREES = "#2b8a3e", "#7048e8", "#2b8a3e"  # strokes: the walk, a sibling's save, an agreeing node
BAR_COLORS = {"draft": "#74c0fc", "verify": "#8ce99a", "other": "#dee2e6", "plain": "#bac8ff"}


def _esc(value) -> str:
    return html.escape(str(value))


def chain_nodes(tree: TreeCycle) -> list[int]:
    """The tree's chain: from the root, each node's first child (its best draft), as deep as the tree goes."""
    first: dict[int, int] = {}
    for node in range(1, len(tree.tokens)):  # a parent's first child has the smallest number among them
        first.setdefault(tree.parents[node], node)
    chain = [0]
    while chain[-1] in first:
        chain.append(first[chain[-1]])
    return chain


def chain_kept(tree: TreeCycle) -> int:
    """Drafts the chain of first choices alone would have kept: its nodes while each holds the target's token."""
    chain = chain_nodes(tree)
    kept = 0
    while kept + 1 < len(chain) and tree.tokens[chain[kept + 1]] == tree.targets[chain[kept]]:
        kept += 1
    return kept


def _rows(tree: TreeCycle) -> tuple[list[int], int]:
    """(each node's row, the bonus's row): a first child keeps its parent's row, every later child
    opens a new one below; the bonus comes first among the last walked node's children."""
    children: list[list[int]] = [[] for _ in tree.tokens]
    for node in range(1, len(tree.tokens)):
        children[tree.parents[node]].append(node)
    last = tree.path[-1]
    rows = [0] * len(tree.tokens)
    bonus_row, used = 0, 0  # used: the rows opened so far, less one

    def place(node: int, row: int) -> None:  # depth first, so a subtree's rows stay together
        nonlocal bonus_row, used
        rows[node] = row
        for i, kid in enumerate((["bonus"] if node == last else []) + children[node]):
            if i:
                used += 1
            kid_row = row if i == 0 else used
            if kid == "bonus":
                bonus_row = kid_row
            else:
                place(kid, kid_row)

    place(0, 0)
    return rows, bonus_row


def _short(text: str) -> str:
    shown = visible(text)
    return shown if len(shown) <= TOKEN_CHARS else shown[: TOKEN_CHARS - 1] + "…"


def _box(x: int, y: int, text: str, note: str, fill: str, stroke: str, width: float, dash: bool, title: str,
         css: str) -> str:
    dashed = ' stroke-dasharray="5 3"' if dash else ""
    return (
        f'<g class="{css}"><title>{_esc(title)}</title>'
        f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4" fill="{fill}" stroke="{stroke}" '
        f'stroke-width="{width}"{dashed}/>'
        f'<text x="{x + 6}" y="{y + 14}">{_esc(_short(text))}</text>'
        f'<text class="q" x="{x + 6}" y="{y + 27}">{_esc(note)}</text></g>'
    )


def _edge(parent: tuple[int, int], child: tuple[int, int], stroke: str, width: float, dash: bool = False) -> str:
    (px, py), (cx, cy) = parent, child
    x0, y0, x1, y1 = px + BOX_W, py + BOX_H / 2, cx, cy + BOX_H / 2
    mid = x0 + (x1 - x0) / 2
    dashed = ' stroke-dasharray="4 3"' if dash else ""
    return (f'<path d="M{x0} {y0} H{mid} V{y1} H{x1}" fill="none" stroke="{stroke}" stroke-width="{width}"'
            f"{dashed}/>")


def tree_svg(tree: TreeCycle, position: int, text_of: Callable[[int], str]) -> str:
    """The tree drawn: nodes by depth (slot 0 at `position` in the first column), edges parent to child."""
    rows, bonus_row = _rows(tree)
    walked = set(tree.path)
    chain = set(chain_nodes(tree))
    depth_of_bonus = tree.depths[tree.path[-1]] + 1
    depths = max(max(tree.depths), depth_of_bonus) + 1
    width = LEFT + depths * COL
    height = TOP + (max(max(rows), bonus_row) + 1) * ROW

    def at(depth: int, row: int) -> tuple[int, int]:
        return LEFT + depth * COL, TOP + row * ROW

    heads = "".join(
        f'<text class="head" x="{LEFT + d * COL}" y="12">{"slot 0" if d == 0 else f"depth {d}"} · pos {position + d}</text>'
        for d in range(depths)
    )
    edges, boxes = [], []
    for node in range(len(tree.tokens)):
        depth, token = tree.depths[node], tree.tokens[node]
        xy = at(depth, rows[node])
        target = text_of(tree.targets[node])
        if node == 0:
            title = f"slot 0: {text_of(token)!r}, the token committed last; the target's token after it: {target!r}"
            boxes.append(_box(*xy, text_of(token), "slot 0", "#e9ecef", "#667", 1, False, title, "node root"))
            continue
        parent = tree.parents[node]
        on_walk = node in walked
        saved = on_walk and node not in chain
        agrees = not on_walk and token == tree.targets[parent]
        q = tree.probs[node]
        title = (f"node {node} · depth {depth} · draft {text_of(token)!r} · drafter q = {q:.3f} · "
                 f"the target's token after it: {target!r}")
        if on_walk:
            fill, stroke, width_, css = COLORS["accepted"], SAVED if saved else WALK, 2.5, "node walked"
            title += " · accepted: the target's own token here" + (
                " (a sibling: the drafter's first choice at this depth was wrong)" if saved else "")
        elif parent == tree.path[-1]:
            fill, stroke, width_, css = COLORS["rejected"], "#c92a2a", 1, "node rejected"
            title += " · rejected: the target chose the bonus instead"
        else:
            fill, stroke, width_, css = "#fff", AGREES if agrees else "#8a94a6", 1.5 if agrees else 1, "node"
            title += " · off the walk" + (": it holds the target's token after its parent, and would have been "
                                          "accepted had the walk reached it" if agrees else "")
            css += " agrees" if agrees else ""
        note = f"{'★ ' if saved else ''}q {q:.2f}"
        edges.append(_edge(at(tree.depths[parent], rows[parent]), xy, WALK if on_walk else "#adb5bd",
                           2.5 if on_walk else 1))
        boxes.append(_box(*xy, text_of(token), note, fill, stroke, width_, agrees, title, css))
    last = tree.path[-1]
    bonus_xy = at(depth_of_bonus, bonus_row)
    edges.append(_edge(at(tree.depths[last], rows[last]), bonus_xy, "#e67700", 2, dash=True))
    bonus = text_of(tree.bonus_id)
    boxes.append(_box(*bonus_xy, bonus, "bonus", COLORS["bonus"], "#e67700", 2, False,
                      f"bonus {bonus!r}: the target's own token after the last walked node, which no child of it held",
                      "node bonus"))
    return (f'<svg class="tree" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="draft tree">{heads}{"".join(edges)}{"".join(boxes)}</svg>')


def _legend() -> str:
    def swatch(fill: str, stroke: str, label: str, dash: bool = False) -> str:
        style = f"background:{fill};border-color:{stroke}" + (";border-style:dashed" if dash else "")
        return f'<span><i class="sw" style="{style}"></i>{label}</span>'

    return ('<div class="legend">' + swatch(COLORS["accepted"], WALK, "walked: accepted")
            + swatch(COLORS["accepted"], SAVED, "★ walked through a sibling (the chain was wrong here)")
            + swatch(COLORS["rejected"], "#c92a2a", "rejected below the last walked node")
            + swatch("#fff", AGREES, "the target's token after its parent, off the walk", dash=True)
            + swatch(COLORS["bonus"], "#e67700", "bonus (the target's own)") + "</div>")


def _bars(block, plain_step: float | None, before_s: float, host_s: float) -> str:
    """This cycle's draft / verify / other seconds against one plain step."""
    other = max(block.elapsed_s - before_s - block.draft_s - block.verify_s, 0.0)
    parts = [("draft", block.draft_s), ("verify", block.verify_s), ("other", other)]
    scale = max(sum(s for _, s in parts), plain_step or 0.0) or 1.0

    def bar(label: str, cells: list[tuple[str, float]]) -> str:
        divs = "".join(
            f'<div title="{_esc(name)}: {s * 1000:.1f} ms" style="width:{100 * s / scale:.2f}%;'
            f'background:{BAR_COLORS[name if name in BAR_COLORS else "plain"]}">{_esc(name) if s / scale > 0.12 else ""}</div>'
            for name, s in cells if s > 0)
        return (f'<div class="barrow"><div>{_esc(label)}</div><div class="bar">{divs}</div>'
                f"<div>{sum(s for _, s in cells) * 1000:.1f} ms</div></div>")

    out = bar("this tree cycle", parts)
    if plain_step:
        out += bar("one plain decoding step", [("plain", plain_step)])
    cost = f" The cycle cost <b>{sum(s for _, s in parts) / plain_step:.2f}</b> plain steps." if plain_step else ""
    return (f"{out}<div>The target verified every node in one pass; growing the tree and walking it took "
            f"{host_s * 1000:.1f} ms on the host.{cost}</div>")


def tree_cycle_html(view, index: int, text_of: Callable[[int], str], lane: str = "tree",
                    plain_step: float | None = None) -> str:
    """The view of cycle `index` (a valid index) of a tree lane's `view`: its tree, the walk, the
    chain's count against the tree's, and the time split (`plain_step`: seconds per plain step)."""
    block = view.blocks[index]
    tree = block.tree
    nodes = len(tree.tokens) - 1
    n = block.acceptance_length
    per_depth = {}
    for depth in tree.depths[1:]:
        per_depth[depth] = per_depth.get(depth, 0) + 1
    by_depth = ", ".join(f"depth {d}: {c}" for d, c in sorted(per_depth.items()))
    chain = chain_kept(tree)
    gained = block.accepted - chain
    if gained > 0:
        verdict = (f"The chain of first choices alone would have kept <b>{chain}</b>: the tree's siblings gained "
                   f"<b>{gained}</b> token{'s' if gained > 1 else ''} this cycle.")
    else:
        verdict = f"The chain of first choices alone would have kept the same <b>{chain}</b>: no sibling was needed."
    before = view.blocks[index - 1].elapsed_s if index else view.prefill.seconds
    whose = "" if lane == "dflash" else f"{_esc(LABELS[lane])} lane · "
    return (
        f'<style>{TREE_CSS}</style><div class="cycle tree-cycle" id="cycle-{_esc(block.index + 1)}">'
        f"<h4>{whose}Cycle {_esc(block.index + 1)} of {len(view.blocks)} · positions {_esc(block.position)}–"
        f"{_esc(block.position + block.accepted + 1)} · {_esc(cycle_label(block))} → {n} token{'s' if n > 1 else ''}</h4>"
        f"<h4>1 · the tree the drafter's one pass grew, verified by the target in one pass of {nodes + 1} rows</h4>"
        f"<div>{nodes} drafts, best first by the product of their path's probabilities ({by_depth}); the top row "
        f"is the chain a plain DFlash cycle verifies. Each node sees only its ancestors.</div>"
        f'<div class="scroll">{tree_svg(tree, block.position, text_of)}</div>{_legend()}'
        f"<h4>2 · the target's walk</h4><div>From slot 0 the walk follows the child holding the target's own "
        f"token: it kept <b>{block.accepted}</b> draft{'s' if block.accepted != 1 else ''}, then the bonus "
        f"{_esc(repr(text_of(tree.bonus_id)))} → {n} token{'s' if n > 1 else ''} from one target pass. {verdict}</div>"
        f"<h4>3 · where the time went</h4>{_bars(block, plain_step, before, tree.host_s)}</div>"
    )
