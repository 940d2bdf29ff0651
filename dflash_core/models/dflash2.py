"""What DFlash2 adds to the drafter: a block convolution around each sublayer, and a path selector.

`BlockConv` is a causal depthwise convolution along the block's slots whose kernel is a stored base
plus a per-slot, per-channel-group correction predicted from the sublayer's input; it runs once on
the sublayer's input and once on its output. `PathSelector` picks the draft: each slot keeps the
top-k candidates of the LM head, every pair (candidate of the slot before, candidate here) gets a
low-rank score, and the draft walks the chain one slot at a time (docs/design.md §2, "DFlash2").
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..sampling import SamplingParams, probabilities, sample


class BlockConv(nn.Module):
    """The grouped, input-dependent causal convolution around one sublayer.

    base_kernel [2, taps, hidden]: side 0 filters the sublayer's input, side 1 its output.
    kernel_projection: hidden -> 2 * taps * groups corrections, one per side, tap and channel group.
    Slot j of the output mixes slots j, j-1, ..., j-taps+1 of the same block; slot 0 sees only itself.
    """

    def __init__(self, hidden_size: int, taps: int, group_size: int):
        super().__init__()
        self.taps = taps
        self.groups = hidden_size // group_size
        self.group_size = group_size
        # Identity at tap 0 and no correction: a fresh DFlash2 layer starts as its DFlash one.
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden_size))
        with torch.no_grad():
            self.base_kernel[:, 0] = 1.0
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        """Filter `x` [b, n, hidden] along its n slots; `delta` [b, n, taps, groups] is the correction
        of each output slot. Accumulates in float32 and returns x's dtype."""
        b, n, _ = x.shape
        base = self.base_kernel[side].float().view(1, 1, self.taps, self.groups, self.group_size)
        kernel = base + delta.float()[..., None]  # [b, n, taps, groups, group_size]
        xs = x.float().view(b, n, self.groups, self.group_size)
        out = kernel[:, :, 0] * xs
        for tap in range(1, min(self.taps, n)):
            # Output slot j reads input slot j - tap: the earlier slots of the same block only.
            out[:, tap:] += kernel[:, tap:, tap] * xs[:, :-tap]
        return out.view(b, n, -1).to(x.dtype)

    def around(self, sublayer, x: torch.Tensor, block: int | None = None) -> torch.Tensor:
        """`sublayer(x)` with the convolution on both sides; both corrections come from `x` [b, n, h].
        `block`: slots per block when x holds several blocks side by side (training); the
        convolution stays inside each one. Default: x is one block."""
        b, n, h = x.shape
        blocks = x.reshape(-1, block or n, h)
        delta = self.kernel_projection(blocks).view(*blocks.shape[:2], 2, self.taps, self.groups)
        inner = sublayer(self.convolve(blocks, delta[:, :, 0], 0).reshape(b, n, h))
        return self.convolve(inner.reshape(blocks.shape), delta[:, :, 1], 1).reshape(b, n, h)


class PathScores(NamedTuple):
    """What a DFlash2 draft step hands to `PathSelector.walk`, for the n drafted slots.

    candidates [n, K]: each slot's top-k target ids, best first.
    scores [n, K, K] float32: scores[l, i, j] is slot l choosing candidates[l, j] after slot l-1 chose
    candidates[l-1, i] (for l = 0 every row i is the same: the block's slot-0 token comes before).
    """

    candidates: torch.Tensor
    scores: torch.Tensor


class PathSelector(nn.Module):
    """The low-rank pairwise scorer: edge (a -> b) at slot l scores
    `unary_l(b) + <predecessor_codebook[a] * hidden_projection(h_l), successor_codebook[b]>`."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        nn.init.normal_(self.predecessor_codebook, std=rank**-0.5)
        nn.init.normal_(self.successor_codebook, std=rank**-0.5)

    def forward(self, hidden: torch.Tensor, candidates: torch.Tensor, unary: torch.Tensor, anchor_id: torch.Tensor) -> PathScores:
        """hidden [..., n, h]: the drafted slots' final states; candidates, unary [..., n, K]: their top-k
        ids and logits; anchor_id [...] (or [1] for one block): the block's slot-0 token. Leading
        dimensions are blocks scored at once (training)."""
        blocks = candidates.shape[:-2]
        anchor = anchor_id.reshape(*blocks, 1, 1).expand(*blocks, 1, self.top_k)
        predecessors = torch.cat([anchor, candidates[..., :-1, :]], dim=-2)
        return PathScores(candidates, self.edge_scores(hidden, predecessors, candidates, unary))

    def edge_scores(self, hidden: torch.Tensor, predecessors: torch.Tensor, candidates: torch.Tensor,
                    unary: torch.Tensor) -> torch.Tensor:
        """Scores [..., n, P, K] (float32) of the edges from each of the P predecessor ids [..., n, P] of a
        slot to each of its K candidates [..., n, K], whose unary scores are `unary` [..., n, K]."""
        weighted = self.predecessor_codebook[predecessors].float() * self.hidden_projection(hidden).float()[..., None, :]
        pairwise = weighted @ self.successor_codebook[candidates].float().transpose(-1, -2)
        return unary.float()[..., None, :] + pairwise

    @staticmethod
    def walk(path: PathScores, sampling: SamplingParams | None = None, generator=None):
        """The draft along `path`: slot by slot, the best (greedy, `sampling` None) or a sampled
        successor of the candidate chosen before. Returns (the chosen candidate indices [n], the
        K-way distribution each slot drew from [n, K] or None when greedy), with no host sync.
        A greedy walk also takes paths with leading block dimensions (indices [..., n])."""
        chosen = path.scores.new_zeros((*path.scores.shape[:-3], 1), dtype=torch.long)
        picks, dists = [], []
        for slot in range(path.candidates.shape[-2]):
            scores = path.scores[..., slot, :, :]
            # [..., 1, K]: the edges out of the last choice
            row = scores.gather(-2, chosen[..., None].expand(*chosen.shape, scores.shape[-1]))
            if sampling is None:
                chosen = row.argmax(dim=-1)
            else:
                dist = probabilities(row, sampling)
                chosen = sample(dist, generator)
                dists.append(dist)
            picks.append(chosen)
        return torch.cat(picks, dim=-1), None if sampling is None else torch.cat(dists, dim=-2)

    @staticmethod
    def propose(path: PathScores, vocab_size: int, sampling: SamplingParams | None = None, generator=None):
        """Draft target ids [n] and, when sampled, their distribution over the vocabulary [n, V];
        greedy, also for paths with leading block dimensions (ids [..., n])."""
        index, dists = PathSelector.walk(path, sampling, generator)
        ids = path.candidates.gather(-1, index[..., None])[..., 0]
        return ids, None if dists is None else scatter_rows(dists, path.candidates, vocab_size, fill=0.0)

    @staticmethod
    def realized_logits(path: PathScores, vocab_size: int) -> torch.Tensor:
        """The greedy walk's per-slot scores over the whole vocabulary [n, V] (-inf off the
        candidates): the rows whose modes the greedy draft took."""
        index, _ = PathSelector.walk(path)
        previous = torch.cat([index.new_zeros(1), index[:-1]])
        rows = path.scores[torch.arange(index.shape[0], device=index.device), previous]
        return scatter_rows(rows, path.candidates, vocab_size)


def scatter_rows(rows: torch.Tensor, candidates: torch.Tensor, vocab_size: int, fill: float = float("-inf")) -> torch.Tensor:
    """Rows [n, K] placed at their candidates' ids in [n, V] rows filled with `fill`, in float32."""
    full = rows.new_full((rows.shape[0], vocab_size), fill, dtype=torch.float32)
    return full.scatter_(1, candidates, rows.float())
