"""The "How it works" tab: a short explanation with the diagrams under assets/howto/.

The words are the engine's and the trace's (slot 0, mask slots, `draft_topk`, `target_topk`,
bonus token, tau, `injected`, the `greedy` / `match` / `rejection` rules), so what a student reads
here is what the hover boxes, the "inside a cycle" view and a downloaded trace call things.
The SVGs are inlined: they are this repository's own files, not user input.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

DIAGRAMS = Path(__file__).resolve().parents[2] / "assets" / "howto"

SECTIONS = [
    (
        "plain-vs-speculative",
        "1. Plain vs speculative decoding",
        "A language model pays one full forward pass of the <b>target</b> per token. Speculative decoding "
        "lets a cheap <b>drafter</b> guess the next few tokens; the target checks all the guesses in one pass, "
        "keeps the longest prefix it agrees with and adds one token of its own, the <b>bonus token</b>. "
        "A cycle verifies a block of <b>B</b> slots: slot 0 is the last committed token, slots 1..B-1 the drafts.",
    ),
    (
        "block-diffusion-drafter",
        "2. The block-diffusion drafter",
        "DFlash's drafter is a small stack of transformer layers that sees the block as the target will: "
        "slot 0 (<code>slot0_id</code>) and B-1 mask slots (<code>mask_id</code>). With no causal order inside "
        "the block it fills every mask slot in <b>one pass</b>: one denoising step of block diffusion. An "
        "autoregressive drafter (EAGLE-style) needs one pass per slot. Hover a token or open "
        "<i>Inside a cycle</i> to see the drafter's <code>draft_topk</code> for each slot.",
    ),
    (
        "kv-injection",
        "3. KV injection of target features",
        "The drafter has no embedding table or LM head of its own, and it does not re-read the text: hidden "
        "states from a few target layers (<code>target_layers</code>) are concatenated, fused by <code>fc</code> "
        "and <code>hidden_norm</code>, and fed into <b>every</b> drafter layer as extra keys and values. Each "
        "cycle only the positions committed by the previous cycle are new (<code>injected.positions</code>); "
        "the drafter's cache keeps the rest.",
    ),
    (
        "verification",
        "4. Verification, and why it is lossless",
        "The target runs once over the whole block; row i of <code>target_topk</code> is its distribution for "
        "the token after slot i. Greedy: drafts are kept while they equal the target's argmax. Sampling: "
        "each draft is accepted with probability min(1, p/q), and the first rejected slot is resampled from "
        "the residual. Either way the output has exactly the distribution plain decoding of the target has: "
        "at temperature 0 the race's panes are token for token identical.",
    ),
    (
        "tau-speedup",
        "5. tau and speedup",
        "<b>tau</b> is the mean acceptance length per cycle with the bonus counted (1 for plain decoding, at "
        "most B). Speed comes from tau against the cost of a cycle: the speedup model under the race uses the "
        "run's own measured draft, verify and plain-step times.",
    ),
    (
        "chain-vs-tree",
        "6. Chain vs tree",
        "A cycle verifies one path: each slot's argmax, the <b>chain</b>. The drafter's one pass scored every "
        "candidate of every slot, so a <b>tree</b> can take each slot's top few instead, grown best first up to a "
        "budget of drafts and verified in the same single target pass (each node sees only its ancestors). The "
        "walk follows the target's own token, so it is as lossless as the chain, and a sibling keeps going where "
        "the chain's draft was wrong. Measured on the offline pair (block 4, 2-core AMD EPYC CPU): at a budget of "
        "32, tau rises from 1.57 to 2.34 on natural prompts and from 2.47 to 3.26 on generated ones, but there a "
        "verify of 33 rows costs 2.6 plain steps, so trees pay only at budgets 2-4 on that CPU. Where such a verify "
        "costs about one plain step (a GPU, at this model size), the gain in tau becomes speed. Add the "
        "<i>DFlash, tree</i> lane under <i>More lanes</i> and open <i>Inside a cycle</i> to see each tree.",
    ),
    (
        "training-recipe",
        "7. Training recipe",
        "The drafter learns from text the target wrote, with the target frozen: random anchors cut many "
        "blocks from each sequence, a block-sparse mask lets each block see the target features before its "
        "anchor and itself (exactly what one decoding cycle sees), and the loss weights decay with the slot, "
        "because a late slot only pays off when every earlier one was accepted.",
    ),
]


@lru_cache(maxsize=1)
def howto_html() -> str:
    """The tab's HTML: each section's text, then its diagram."""
    parts = ['<div class="howto" style="max-width:800px;font-size:15px;line-height:1.5">']
    for name, title, text in SECTIONS:
        svg = (DIAGRAMS / f"{name}.svg").read_text(encoding="utf-8")
        parts.append(
            f'<h3 style="margin:18px 0 6px">{title}</h3><p>{text}</p>'
            f'<div class="diagram" id="diagram-{name}" style="max-width:100%;overflow-x:auto">{svg}</div>'
        )
    parts.append("</div>")
    return "".join(parts)
