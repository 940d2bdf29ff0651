"""What a drafter is trained on, shared by `train` (the loop), evaluation and the tests (docs/design.md §5).

The frozen target runs once over a sequence (prompt + its own greedy response) and gives the
features of the tapped layers. Each anchor inside the response makes a block
`[token at anchor, mask x (B-1)]` at positions `anchor .. anchor+B-1`; all blocks of a sequence go
through the drafter in one forward, under a block-sparse mask that reproduces inference exactly: a
block sees the context strictly before its anchor and its own block (both directions), nothing
else. The loss is the position-weighted cross-entropy of slots 1..B-1 (the weights decay with the
slot, `slot_weights`, or follow the drafter's own confidence, `dpace_weights`) against the target's greedy
token and, optionally, its top-k next-token distribution; for text the target did not write, the
greedy tokens come from the same forward, as far as the text follows them (`greedy_path_labels`).
Evaluation turns the same forward into acceptance lengths: teacher-forced tau, and tau along the blocks greedy decoding would run.
On CUDA the block mask is a Flex Attention `BlockMask`; elsewhere an equivalent dense boolean mask.

A DFlash2 drafter (`drafter.dflash2`) trains through the same forward: its block convolutions stay
inside each block, the block loss is on its unary scores over the whole vocabulary, and a second
loss trains its path selector (`DrafterTrainer.selector_loss`); its drafts, for acceptance, are the
selector's greedy walk.

An autoregressive drafter (`drafter.autoregressive`) trains through the same forward: its block at
an anchor holds the real tokens `anchor .. anchor+B-2` (teacher forcing: at inference they are its
own drafts, which matter only while they equal these), attends causally inside the block, and slot
j predicts the token after it, so its labels are DFlash's, one slot earlier.

An input-fusion drafter (`drafter.input_fusion`) runs the sequence's context through its layers as
rows of their own, once per sequence and causally (`fused=True` in the masks), and each anchor's
block attends, at every layer, to those rows before the anchor and to itself: what its decoding
cache holds after the cycles up to that anchor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..models.dflash2 import PathScores, PathSelector
from ..models.target import Target

# ------------------------------------------------------------------------------------ recipe


def default_gamma(block_size: int) -> float:
    """Loss decay of docs/design.md §5 (7 for 16, 5 for 10, 4 for 8), linearly interpolated elsewhere."""
    known = [(8, 4.0), (10, 5.0), (16, 7.0)]
    if block_size <= 8:
        return max(1.0, 4.0 * block_size / 8)
    for (b0, g0), (b1, g1) in zip(known, known[1:]):
        if block_size <= b1:
            return g0 + (g1 - g0) * (block_size - b0) / (b1 - b0)
    return 7.0 * block_size / 16


def slot_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1: early slots matter most for acceptance."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


DPACE_ALPHA = 0.5  # the confidence smoothing of D-PACE's paper and of the trainers that ship it


def dpace_weights(ce: torch.Tensor, valid: torch.Tensor, alpha: float = DPACE_ALPHA) -> torch.Tensor:
    """D-PACE's slot weights [nA, B-1] from the drafter's own cross-entropy `ce` at each slot.

    D-PACE (Dynamic Position-Aware Cross-Entropy, arXiv:2605.18810, Eq. 7-8): the drafter's
    confidence in the label, q_i = exp(-ce_i), is smoothed to q~_i = (1 - alpha) q_i + alpha, and
    slot j weighs w_j = sum_{m >= j} prod_{i <= m} q~_i over the valid slots m: the chance that the
    block reaches slot m times what accepting it is worth, so each slot weighs its share of the
    expected acceptance length under the drafter as it is now. Invalid slots have q~ = 1 and no
    weight of their own. The weights carry no gradient.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"D-PACE alpha must be in (0, 1], got {alpha}")
    with torch.no_grad():
        mask = valid.to(ce.dtype)
        smoothed = torch.where(valid, (1 - alpha) * torch.exp(-ce) + alpha, torch.ones_like(ce))
        prefix = smoothed.cumprod(dim=-1) * mask
        return prefix.flip(-1).cumsum(-1).flip(-1) * mask


def anchor_count(seq_len: int, prompt_len: int) -> int:
    """How many valid anchors a sequence has: a and a+1 both response positions, a >= prompt_len.

    At inference the first block starts at the first response token (the prefill's bonus), so
    these anchors cover exactly the states the drafter meets.
    """
    return max(0, seq_len - 1 - prompt_len)


def sample_anchors(seq_len: int, prompt_len: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """Up to `n` sorted distinct valid anchors (all of them when there are at most `n`)."""
    count = anchor_count(seq_len, prompt_len)
    if count <= n:
        return torch.arange(prompt_len, prompt_len + count)
    return (torch.randperm(count, generator=generator)[:n] + prompt_len).sort().values


def is_every_anchor(anchors: torch.Tensor, seq_len: int, prompt_len: int) -> bool:
    """Whether `sample_anchors` returned every valid anchor, so decoding's walk over them is known."""
    return anchors.numel() == anchor_count(seq_len, prompt_len)


def block_slots(block_size: int, causal: bool) -> int:
    """Slots per training block: B for DFlash, B-1 tokens for an autoregressive drafter (the last
    one's prediction is past the block)."""
    return block_size - 1 if causal else block_size


def block_layout(anchors: torch.Tensor, seq_len: int, block_size: int, mask_token_id: int, ids: torch.Tensor,
                 causal: bool = False):
    """Block token ids, position ids, labels and label validity for a set of anchors.

    DFlash blocks are `[token at anchor, mask x (B-1)]`; causal (autoregressive) blocks are the B-1
    real tokens from the anchor on (the mask id past the sequence's end, where no label is valid).
    Returns (block_ids [nA*L], position_ids [T + nA*L], labels [nA, B-1], valid [nA, B-1]), with
    L = `block_slots(block_size, causal)`.
    """
    device = ids.device
    anchors = anchors.to(device)
    offsets = torch.arange(block_slots(block_size, causal), device=device)
    block_pos = anchors[:, None] + offsets[None, :]  # [nA, L]
    if causal:
        block_ids = torch.where(block_pos < seq_len, ids[block_pos.clamp(max=seq_len - 1)], mask_token_id)
    else:
        block_ids = torch.full_like(block_pos, mask_token_id)
        block_ids[:, 0] = ids[anchors]
    label_pos = anchors[:, None] + torch.arange(1, block_size, device=device)[None, :]
    valid = label_pos < seq_len  # every position after the prompt is a response token
    labels = torch.where(valid, ids[label_pos.clamp(max=seq_len - 1)], torch.full_like(label_pos, -100))
    position_ids = torch.cat([torch.arange(seq_len, device=device), block_pos.reshape(-1)])
    return block_ids.reshape(-1), position_ids, labels, valid


def greedy_path_labels(ids: torch.Tensor, greedy: torch.Tensor, anchors: torch.Tensor, block_size: int):
    """Labels and validity [nA, B-1] for a text the target did not write, from its greedy next tokens.

    `greedy[t]` is the target's argmax after position t of `ids` (one forward over the text). Slot k
    of the block at anchor a must predict what greedy decoding writes k tokens after a: `greedy[a+k-1]`,
    known only while the text follows greedy decoding over a+1..a+k-1; past the first token where it
    does not, the label is unknown (-100). On the target's own greedy output these are `block_layout`'s.
    """
    T = ids.shape[0]
    pos = anchors.to(ids.device)[:, None] + torch.arange(block_size - 1, device=ids.device)  # a+k-1
    inside = pos < T
    pos = pos.clamp(max=T - 1)
    on_path = torch.ones(T, dtype=torch.bool, device=ids.device)
    on_path[1:] = ids[1:] == greedy[:-1]  # token t is what greedy decoding writes after t-1
    follows = torch.ones_like(inside)
    follows[:, 1:] = on_path[pos[:, 1:]]  # slot k needs tokens a+1..a+k-1 on the path
    valid = inside & follows.cumprod(dim=1).bool()
    labels = torch.where(valid, greedy[pos], torch.full_like(pos, -100))
    return labels, valid


def dense_block_mask(anchors: torch.Tensor, seq_len: int, block_size: int, device=None,
                     causal: bool = False, fused: bool = False) -> torch.Tensor:
    """Boolean [nA*L, T + nA*L] (True = attend) for blocks of L = `block_size` slots, the training
    twin of one inference cycle each.

    At inference the block at `start` sees the cached context 0..start-1 (the bonus token's own
    features do not exist yet) and the whole block without causality; an autoregressive drafter's
    pass j sees the block's tokens 0..j only (`causal`). `fused` (input fusion): the T context
    positions are query rows too, first, each seeing the context up to itself and no block:
    [T + nA*L, T + nA*L].
    """
    anchors = anchors.to(device)
    n = anchors.numel()
    q_idx = torch.arange(n * block_size, device=device)
    q_block = q_idx // block_size
    ctx = torch.arange(seq_len, device=device)[None, :] < anchors[q_block][:, None]
    own = q_block[:, None] == q_block[None, :]
    if causal:
        own &= q_idx[:, None] >= q_idx[None, :]
    mask = torch.cat([ctx, own], dim=1)
    if fused:
        context_rows = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
        context_rows = torch.cat([context_rows, context_rows.new_zeros(seq_len, n * block_size)], dim=1)
        mask = torch.cat([context_rows, mask])
    return mask


def flex_block_mask(anchors: torch.Tensor, seq_len: int, block_size: int, device, causal: bool = False,
                    fused: bool = False):
    """The same mask as a Flex Attention `BlockMask`, so GPUs skip the masked-out tiles."""
    from torch.nn.attention.flex_attention import create_block_mask

    anchors = anchors.to(device)
    n = anchors.numel()
    rows = seq_len if fused else 0  # query rows before the blocks': the context's own, for input fusion

    def mask_mod(b, h, q_idx, kv_idx):
        row = q_idx - rows  # the query's row among the blocks'; negative for a context row
        blk = row.clamp(min=0) // block_size
        in_ctx = (kv_idx < seq_len) & (kv_idx < anchors[blk])
        in_own = (kv_idx >= seq_len) & ((kv_idx - seq_len) // block_size == blk)
        if causal:
            in_own = in_own & (kv_idx - seq_len <= row)
        allowed = (row >= 0) & (in_ctx | in_own)
        if fused:
            allowed = allowed | ((row < 0) & (kv_idx <= q_idx))
        return allowed

    return create_block_mask(mask_mod, None, None, rows + n * block_size, seq_len + n * block_size, device=device)


# ------------------------------------------------------------------------------------ target features


class _StopForward(Exception):
    """Raised after the deepest tapped layer: the layers above it and the LM head are not needed."""


class FeatureExtractor:
    """Frozen target features for training, computing only the layers the drafter reads.

    Hooks are attached only for the duration of a call, so the same `Target` still decodes
    normally (with its own taps) between training steps.
    """

    def __init__(self, target: Target, layer_ids: list[int]):
        self.target = target
        self.layer_ids = list(layer_ids)
        self.decoder = target.model.get_decoder()
        self._out: dict[int, torch.Tensor] = {}

    def _hook(self, layer_id: int, stop: bool):
        def record(_module, _inputs, output):
            self._out[layer_id] = output[0] if isinstance(output, tuple) else output
            if stop:
                raise _StopForward

        return record

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, top_k: int = 0):
        """(features, soft labels) of `ids` [1, T] (no KV cache, positions 0..T-1).

        Features are the chosen layers' outputs concatenated, [1, T, k*h]. Soft labels are None,
        or with `top_k` the target's next-token distribution at every position, kept as its `top_k`
        most likely ids [T, top_k] and their probabilities [T, top_k].
        """
        last = max(self.layer_ids)
        stop_early = top_k == 0
        hooks = [self.target.layers[i].register_forward_hook(self._hook(i, stop_early and i == last))
                 for i in set(self.layer_ids)]
        self._out.clear()
        hidden = None
        try:
            hidden = self.decoder(input_ids=ids, use_cache=False).last_hidden_state
        except _StopForward:
            pass
        finally:
            for hook in hooks:
                hook.remove()
        feats = torch.cat([self._out[i] for i in self.layer_ids], dim=-1)
        self._out.clear()
        if stop_early:
            return feats, None
        probs = self.target.head(hidden[0]).float().softmax(-1)
        top_p, top_ids = probs.topk(top_k, dim=-1)
        return feats, (top_ids, top_p)


# ------------------------------------------------------------------------------------ trainer


@dataclass
class StepOut:
    loss: torch.Tensor
    ce: torch.Tensor  # weighted cross-entropy against the greedy labels alone (= loss without soft labels or selector)
    logits: torch.Tensor  # [nA, B-1, V] over the draft vocabulary (DFlash2: the unary scores)
    labels: torch.Tensor  # draft-vocabulary indices, -100 where there is nothing to predict
    valid: torch.Tensor
    block_tokens: int
    # DFlash2 only: each block's path scores (candidates [nA, B-1, K], edges [nA, B-1, K, K]), the
    # greedy walk's drafts [nA, B-1] (target ids) and the selector's loss.
    paths: PathScores | None = None
    drafts: torch.Tensor | None = None
    selector: torch.Tensor | None = None


class DrafterTrainer:
    """The training forward shared by the optimisation loop, evaluation and the tests."""

    def __init__(self, target: Target, drafter, block_size: int, gamma: float, amp_dtype=None, feature_cache_bytes: int = 0,
                 soft_top_k: int = 0, soft_weight: float = 0.0, selector_weight: float = 1.0,
                 slot_weighting: str = "decay", dpace_alpha: float = DPACE_ALPHA):
        self.target = target
        self.drafter = drafter  # possibly DDP-wrapped
        core = drafter.module if hasattr(drafter, "module") else drafter
        self.core = core
        self.block_size = block_size
        self.mask_token_id = core.mask_token_id
        self.weights = slot_weights(block_size, gamma).to(target.device)
        # "decay": the fixed exp(-(k-1)/gamma); "dpace": weights from the drafter's own confidence.
        if slot_weighting not in ("decay", "dpace"):
            raise ValueError(f"slot weighting must be 'decay' or 'dpace', got {slot_weighting!r}")
        self.slot_weighting, self.dpace_alpha = slot_weighting, dpace_alpha
        self.features = FeatureExtractor(target, core.target_layer_ids)
        self.amp_dtype = amp_dtype
        self.device = target.device
        # Soft labels: the target's own top-k distribution mixed into the one-hot greedy label.
        # A greedy token says only which id won; the distribution also says by how much and what
        # came second, which is more signal per position when the data is what limits the drafter.
        self.soft_top_k = soft_top_k if soft_weight > 0 else 0
        self.soft_weight = soft_weight
        self.selector_weight = selector_weight  # DFlash2: the selector's loss against the block loss
        # On a CPU the frozen target's forward costs more than the drafter's whole step, so with
        # several epochs over a small data set its features are kept rather than recomputed.
        self.feature_cache: dict[str, torch.Tensor] = {}
        self.feature_cache_left = feature_cache_bytes
        # Labels move into draft-vocabulary indices; ids outside it cannot be drafted (-100).
        self.label_index = None
        if core.draft_vocab is not None:
            self.label_index = torch.full((target.vocab_size,), -100, dtype=torch.long, device=self.device)
            self.label_index[core.draft_vocab.to(self.device)] = torch.arange(core.draft_vocab.numel(), device=self.device)

    def _autocast(self):
        if self.amp_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def target_features(self, ids: torch.Tensor, key: str | None, greedy: bool = False):
        """Features of `ids`, plus (top ids, top probabilities) per position when soft labels are on
        or `greedy` asks for the target's own next tokens (then at least the top 1)."""
        cached = self.feature_cache.get(key) if key is not None else None
        if cached is None:
            feats, soft = self.features(ids[None], max(self.soft_top_k, int(greedy)))
            if self.amp_dtype is not None:
                # Autocast feeds `fc` in this dtype anyway; caching it halves the memory.
                feats = feats.to(self.amp_dtype)
            cached = (feats, soft)
            size = sum(t.numel() * t.element_size() for t in (feats, *(soft or ())))
            if key is not None and size <= self.feature_cache_left:
                self.feature_cache[key] = cached
                self.feature_cache_left -= size
        return cached

    def soft_cross_entropy(self, logp: torch.Tensor, anchors: torch.Tensor, soft) -> torch.Tensor:
        """-sum_j p_target(j) log q(j) per slot over the target's top-k ids the drafter can propose.

        The label of block slot k is the token at anchor+k, which the target predicted at anchor+k-1.
        """
        top_ids, top_p = soft
        T = top_ids.shape[0]
        src = (anchors.to(self.device)[:, None] + torch.arange(self.block_size - 1, device=self.device)).clamp(max=T - 1)
        ids, p = top_ids[src], top_p[src]  # [nA, B-1, k]
        if self.label_index is not None:
            ids = self.label_index[ids]
            p = p * (ids >= 0)
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)
        return -(p * logp.gather(-1, ids.clamp(min=0))).sum(-1)

    def selector_loss(self, hidden: torch.Tensor, unary: torch.Tensor, paths: PathScores, anchor_ids: torch.Tensor,
                      labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """DFlash2's path selector, teacher-forced: at every slot, the cross-entropy over the edges from
        the true previous token (the anchor's token for the first drafted slot, else the label of the
        slot before) to the slot's K candidates, toward the candidate that is the label.

        Slots whose label is not among their candidates give the selector nothing to choose and are
        left out; the others keep the block loss's `weights` [nA, B-1], renormalised.
        """
        previous = torch.cat([anchor_ids[:, None], labels[:, :-1].clamp(min=0)], dim=1)
        edges = self.core.candidate_selector.edge_scores(
            hidden.to(self.core.dtype), previous[..., None], paths.candidates, unary.gather(-1, paths.candidates)
        )[..., 0, :]  # [nA, B-1, K]: one predecessor per slot
        hit = paths.candidates == labels[..., None]
        w = weights * hit.any(-1)
        ce = F.cross_entropy(edges.flatten(0, 1), hit.float().argmax(-1).flatten(), reduction="none").view_as(w)
        return (ce * w).sum() / w.sum().clamp(min=1e-9)

    def forward(self, ids: torch.Tensor, anchors: torch.Tensor, dense: bool | None = None, unwrapped: bool = False,
                key: str | None = None, walk_weight: float = 1.0, target_labels: bool = False) -> StepOut:
        """Logits and weighted loss of every anchor's block for one sequence `ids` [T].

        With `walk_weight` != 1, `anchors` must be every response anchor; the blocks greedy decoding
        would run with the drafter as it is now (`walk_anchors`) weigh `walk_weight` times the rest.
        With `target_labels` the response is text the target did not write: the labels come from the
        target's own greedy tokens in the same forward (`greedy_path_labels`).
        """
        ids = ids.to(self.device)
        T, B, causal = ids.shape[0], self.block_size, self.core.autoregressive
        L = block_slots(B, causal)
        block_ids, position_ids, labels, valid = block_layout(anchors, T, B, self.mask_token_id, ids, causal)
        # Sliding-window layers are only handled by the dense path (the window is added per layer).
        sliding = any(layer.self_attn.sliding_window for layer in self.core.layers)
        use_flex = (self.device.type == "cuda" and not sliding) if dense is None else not dense
        mask = (flex_block_mask if use_flex else dense_block_mask)(anchors, T, L, self.device, causal=causal,
                                                                   fused=self.core.input_fusion)
        with self._autocast():
            feats, soft = self.target_features(ids, key, greedy=target_labels)
            if target_labels:
                labels, valid = greedy_path_labels(ids, soft[0][:, 0], anchors, B)
                soft = soft if self.soft_top_k else None
            with torch.no_grad():
                embeds = self.target.embed(block_ids[None])
            # Rank-0-only evaluation must bypass DDP, whose forward would wait for the other ranks.
            module = self.core if unwrapped else self.drafter
            hidden = module(embeds, feats, position_ids[None], attn_mask=mask, block_size=L)
            n = anchors.numel()
            # DFlash: slot 0 holds the anchor's own token and its output is never used; causal:
            # every slot predicts the token after it.
            # Contiguous: on a strided view that needs grad, the head's matmul broadcasts its weight
            # into one small matmul per block (a batched matmul ~4x slower than the step's layers on a CPU).
            hidden = (hidden.view(n, L, -1) if causal else hidden.view(n, B, -1)[:, 1:]).contiguous()
            paths = drafts = None
            if self.core.dflash2 is None:
                logits = self.core.draft_logits(hidden, self.target.head)
            else:
                head_logits = self.core.draft_head(self.target.head)(hidden.to(self.core.dtype))
                paths = self.core.candidate_paths(hidden, head_logits, ids[anchors.to(self.device)])
                logits = self.core.unary_scores(head_logits)
                with torch.no_grad():
                    drafts = PathSelector.propose(paths, logits.shape[-1])[0]
        logits = logits.float()
        if self.label_index is not None:
            labels = torch.where(valid, self.label_index[labels.clamp(min=0)], labels)
        logp = logits.log_softmax(-1)
        hard = -logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        if self.slot_weighting == "dpace":
            w = dpace_weights(hard, labels >= 0, self.dpace_alpha)
        else:
            w = self.weights[None, :].expand_as(labels) * (labels >= 0)
        if walk_weight != 1.0:
            # Decoding only meets the anchors right after a bonus token, and they are the harder ones
            # (a block starts after a rejection); uniform anchors spend the loss on states it never sees.
            with torch.no_grad():
                walk = walk_anchors(acceptance_lengths(logits, labels, valid, drafts).cpu()).to(self.device)
            per_anchor = torch.ones(n, device=self.device).index_fill_(0, walk, walk_weight)
            w = w * per_anchor[:, None]
        w = w / w.sum().clamp(min=1e-9)
        ce = (hard * w).sum()
        loss = ce
        if soft is not None:
            mixed = (1 - self.soft_weight) * hard + self.soft_weight * self.soft_cross_entropy(logp, anchors, soft)
            loss = (mixed * w).sum()
        selector = None
        if paths is not None:
            selector = self.selector_loss(hidden, logits, paths, ids[anchors.to(self.device)], labels, w)
            loss = loss + self.selector_weight * selector
        return StepOut(loss, ce, logits, labels, valid, int(n * L), paths, drafts, selector)


def acceptance_lengths(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor,
                       drafts: torch.Tensor | None = None) -> torch.Tensor:
    """Teacher-forced acceptance length per block: 1 (bonus) + leading slots predicted right.

    The drafts are the logits' argmax, or `drafts` [nA, B-1] where they are not (DFlash2's walk).
    With greedy target responses as data, a right prediction is exactly a draft the target would
    accept, so the mean estimates tau at greedy decoding.
    """
    hit = ((logits.argmax(-1) if drafts is None else drafts) == labels) & valid
    return 1 + hit.long().cumprod(dim=1).sum(dim=1)


def walk_anchors(lengths: torch.Tensor) -> torch.Tensor:
    """Indices of the anchors greedy decoding starts its blocks at, from the lengths at every anchor.

    `lengths[i]` belongs to the anchor at the i-th response position. Decoding starts a block at the
    first response token and the next one right after its bonus token, i.e. at a + length(a); when
    the sequence is the target's own greedy output, these are exactly the blocks decoding runs.
    """
    walk, a = [], 0
    while a < len(lengths):
        walk.append(a)
        a += int(lengths[a])
    return torch.tensor(walk, dtype=torch.long)


def decode_walk(lengths: torch.Tensor) -> torch.Tensor:
    """The acceptance lengths greedy decoding meets (see `walk_anchors`)."""
    return lengths[walk_anchors(lengths)]


@torch.no_grad()
def evaluate(trainer: DrafterTrainer, seqs, anchors_per_seq: int, seed: int = 1234) -> dict:
    """Held-out loss and estimated tau on fixed anchors (same anchors every evaluation).

    `val_tau` averages over the sampled anchors. Decoding does not meet anchors uniformly: a block
    starts right after a rejection, where drafting is harder, so `val_tau_decode` also walks each
    sequence as greedy decoding would (only for sequences whose every anchor was evaluated).
    """
    was_training = trainer.core.training
    trainer.core.eval()
    gen = torch.Generator().manual_seed(seed)
    tot_loss = tot_ce = tot_selector = tot_w = 0.0
    acc, walks, unary = [], [], []
    per_slot_hits = torch.zeros(trainer.block_size - 1)
    for ids, plen, key in seqs:
        anchors = sample_anchors(len(ids), plen, anchors_per_seq, gen)
        if anchors.numel() == 0:
            continue
        out = trainer.forward(ids, anchors, unwrapped=True, key=key)
        lengths = acceptance_lengths(out.logits, out.labels, out.valid, out.drafts).cpu()
        acc.append(lengths)
        if out.drafts is not None:
            # DFlash2 without its selector: each slot's top unary candidate.
            unary.append(acceptance_lengths(out.logits, out.labels, out.valid).cpu())
            tot_selector += float(out.selector) * anchors.numel()
        if is_every_anchor(anchors, len(ids), plen):
            walks.append(decode_walk(lengths))
        per_slot_hits += torch.bincount(lengths - 1, minlength=trainer.block_size)[1:].flip(0).cumsum(0).flip(0).float()
        tot_loss += float(out.loss) * anchors.numel()
        tot_ce += float(out.ce) * anchors.numel()
        tot_w += anchors.numel()
    trainer.core.train(was_training)
    if not acc:
        return {}
    lengths = torch.cat(acc).float()
    selector = {}
    if unary:
        # What the selector adds: tau of its walk (val_tau) against the unary argmax's.
        selector = {"val_tau_unary": float(torch.cat(unary).float().mean()), "val_selector_loss": tot_selector / tot_w}
    return {
        "val_loss": tot_loss / tot_w,
        "val_ce": tot_ce / tot_w,
        "val_tau": float(lengths.mean()),
        "val_tau_decode": float(torch.cat(walks).float().mean()) if walks else None,
        "val_blocks": int(lengths.numel()),
        # Fraction of blocks whose draft got at least k tokens accepted, k = 1..B-1.
        "val_accept_at": [round(float(x), 4) for x in per_slot_hits / lengths.numel()],
        **selector,
    }
