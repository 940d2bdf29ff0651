"""Tree verification: a draft tree from one drafter pass, verified by the target in one forward.

A block drafter scores every slot of its block in one pass. Instead of verifying only the argmax
chain, `grow` builds a tree from each slot's top-k: best-first by cumulative log-probability, a
heap of frontier nodes where popping a node adds it to the tree and pushes its next sibling and
its first child, until the node budget is spent. Every node sits at the position of its depth;
`ancestor_mask` lets each one attend to the context and to its own ancestors only, so one target
forward scores every root-to-node path at once. `walk` then descends from the root while the
target's own token (its argmax, or its sample) is a child of the node it stands on; the first
target token without such a child is the bonus.

Lossless and exact: the tree depends only on the drafter's pass, never on the target, and every
token the walk emits is the target's own choice at its node, made from the target's scores after
exactly the tokens before it (the ancestor mask, and the positions by depth, make a node's row the
row plain decoding would compute there). Greedy output is plain decoding's; sampled output draws
each token from the target's distribution with its own independent draw, as in the match rule
(`verify.match_sampled_accept`), so no rejection sampling is needed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    """A tree of drafts below the root (slot 0, node 0). Nodes are numbered in the order they were
    added, so a node's parent has a smaller number; `parents[0]` is -1."""

    tokens: tuple[int, ...]  # node 0: the root's token (the previous bonus), then one draft per node
    parents: tuple[int, ...]
    depths: tuple[int, ...]  # the root is at depth 0, a draft of slot d at depth d
    logq: tuple[float, ...]  # the drafter's log-probability of each node's token at its slot (0 at the root)

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list[dict[int, int]]:
        """Per node: {token: child node}. Siblings hold distinct tokens (a slot's top-k)."""
        out: list[dict[int, int]] = [{} for _ in self.tokens]
        for node in range(1, len(self.tokens)):
            out[self.parents[node]][self.tokens[node]] = node
        return out


def grow(root: int, ids: list[list[int]], logq: list[list[float]], budget: int) -> DraftTree:
    """The best-first tree of at most `budget` drafts below `root`.

    ids, logq: per draft slot (depth 1, 2, ...), its top-k tokens and their log-probabilities, best
    first. A node's score is the sum of its path's log-probabilities; since every term is <= 0, a
    child never outscores its parent nor a later sibling an earlier one, so the heap pops parents
    before children. Ties pop in the order they were pushed.
    """
    tokens, parents, depths, logqs = [root], [-1], [0], [0.0]
    if not ids:
        return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(logqs))
    # (-score, push order, parent node, depth, rank among the slot's top-k)
    heap = [(-logq[0][0], 0, 0, 1, 0)]
    pushed = 1
    while heap and len(tokens) <= budget:
        neg, _, parent, depth, rank = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ids[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        logqs.append(logq[depth - 1][rank])
        if rank + 1 < len(ids[depth - 1]):
            sibling = -neg - logq[depth - 1][rank] + logq[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling, pushed, parent, depth, rank + 1))
            pushed += 1
        if depth < len(ids):
            heapq.heappush(heap, (neg - logq[depth][0], pushed, node, depth + 1, 0))
            pushed += 1
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(logqs))


def ancestor_mask(tree: DraftTree, device) -> torch.Tensor:
    """[n, n] bool: node i may attend to node j iff j is i itself or one of its ancestors."""
    n = len(tree)
    rows: list[list[bool]] = []
    for node in range(n):  # a parent is numbered before its children: its row is already complete
        row = list(rows[tree.parents[node]]) if node else [False] * n
        row[node] = True
        rows.append(row)
    # Built as lists and moved in one go: writing a tensor row by row costs far more on the host
    # (dev/LOG.md, tree verification).
    return torch.tensor(rows, dtype=torch.bool, device=device)


def walk(tree: DraftTree, choices: list[int]) -> tuple[list[int], int]:
    """(the nodes walked, from the root; the bonus token): descend while the target's choice at a
    node (`choices[node]`, from that node's row) is one of its children."""
    children = tree.children()
    path = [0]
    while (child := children[path[-1]].get(choices[path[-1]])) is not None:
        path.append(child)
    return path, choices[path[-1]]
