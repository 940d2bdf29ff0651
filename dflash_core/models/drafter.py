"""The DFlash drafter: a few Qwen3-style layers that fill a block of masked slots in one pass.

It has no embedding and no LM head of its own (it borrows the target's). Target features are fused
by `fc` + `hidden_norm` into a context `c` that is injected as extra keys/values into every layer
("KV injection", docs/design.md §2); block queries attend, without a causal mask, to all cached context and
to the whole block. A DFlash2 config (`config.dflash2`) adds a block convolution around each sublayer and
a path selector that picks the draft (`dflash2.py`). An autoregressive config (`config.autoregressive`,
architecture `DFlashARDraftModel`) runs the same layers causally: its block holds real tokens, one
query per pass (`drafting.ARDrafting` at inference, the causal mask of `training/objective.py` in
training). An input-fusion config (`config.context_fusion == "input"`, the paper's ablation of KV
injection) has the same weights but feeds `c` in once: the context positions join the drafter's
sequence as rows of their own, causal among themselves, and every layer's keys and values come from
its own input rows only (docs/design.md §2, "Input fusion"). Loads and saves the released checkpoint format of
both (docs/design.md §3); a drafter with a draft vocabulary is stored in the form vLLM reads (§7), and
files of the older form still load. Also loads transformers' native DFlash checkpoints (`native_format.py`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from ..errors import CheckpointError
from ..sampling import SamplingParams, greedy_ids, probabilities, sample
from ..speed import kernels
from ..speed.cpu_linear import pack_linears
from ..speed.kernels import cpu_attention
from ..speed.kernels.cuda_paths import drafter_attention
from . import native_format
from .config import drafter_config_dict, parse_drafter_config
from .dflash2 import BlockConv, PathScores, PathSelector
from .hub import resolve_model_dir


class DrafterCache:
    """Context keys/values of every drafter layer, in preallocated buffers.

    Positions `[0, length)` hold committed context. During a draft forward the new context and the
    block are written after them; only the context part is kept (`commit`), so the block's slots
    are a scratch tail that the next forward overwrites.

    capacity: a static cache of that many positions, for CUDA graphs (`cuda_graphs.py`): allocated
    once and never moved, and written at slots given as a device tensor (`write_at`).
    """

    def __init__(self, num_layers: int, capacity: int | None = None):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0
        self.capacity = capacity

    def reserve(self, layer: int, end: int, batch: int, heads: int, head_dim: int, dtype, device):
        """The buffers of `layer` ([b, kv_heads, capacity, head_dim]), grown to hold `end` positions."""
        buf_k, buf_v = self.keys[layer], self.values[layer]
        if self.capacity is not None:
            if buf_k is None:
                # Zeros, not garbage: a static step attends over every slot, masking those past its
                # block, and a masked NaN would still turn the weighted sum into NaN.
                buf_k = torch.zeros(batch, heads, self.capacity, head_dim, dtype=dtype, device=device)
                self.keys[layer], self.values[layer] = buf_k, buf_v = buf_k, torch.zeros_like(buf_k)
            return buf_k, buf_v
        if buf_k is None or buf_k.shape[2] < end:
            # Grow geometrically so a long generation reallocates only a few times.
            capacity = max(end, 256, 0 if buf_k is None else 2 * buf_k.shape[2])
            new_k = torch.empty(batch, heads, capacity, head_dim, dtype=dtype, device=device)
            new_v = torch.empty_like(new_k)
            if buf_k is not None:
                new_k[:, :, : self.length] = buf_k[:, :, : self.length]
                new_v[:, :, : self.length] = buf_v[:, :, : self.length]
            self.keys[layer], self.values[layer] = buf_k, buf_v = new_k, new_v
        return buf_k, buf_v

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `k`, `v` ([b, kv_heads, n, head_dim]) after the committed length; return all keys/values."""
        end = self.length + k.shape[2]
        buf_k, buf_v = self.reserve(layer, end, k.shape[0], k.shape[1], k.shape[3], k.dtype, k.device)
        buf_k[:, :, self.length : end] = k
        buf_v[:, :, self.length : end] = v
        return buf_k[:, :, :end], buf_v[:, :, :end]

    def write_at(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Static cache: store row i of `k`, `v` ([b, kv_heads, n, head_dim]) at slot `slots[i]`; return the
        whole buffers."""
        buf_k, buf_v = self.reserve(layer, 0, k.shape[0], k.shape[1], k.shape[3], k.dtype, k.device)
        buf_k.index_copy_(2, slots, k)
        buf_v.index_copy_(2, slots, v)
        return buf_k, buf_v

    def commit(self, num_context: int) -> None:
        self.length += num_context

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


def static_slots(length: int, num_context: int, rows: int, block: int, device) -> torch.Tensor:
    """Slot (= position) of every row of a static draft step, whose context is padded to `rows`.

    The `num_context` real context rows go after the committed `length`, the block right after
    them, and the padding rows after the block, where the block's mask hides them and the next
    cycle overwrites them. Host ints in, a device tensor out, with no sync.
    """
    start = length + num_context  # the block's slot 0
    return torch.cat([
        torch.arange(length, start, device=device),
        torch.arange(start + block, start + block + rows - num_context, device=device),
        torch.arange(start, start + block, device=device),
    ])


def fusion_mask(row_slots: torch.Tensor, num_context: int, num_keys: int) -> torch.Tensor:
    """Boolean [rows, num_keys] mask (True = attend) of an input-fusion forward whose rows sit at
    cache slots `row_slots`: a context row (the first `num_context`) sees the keys at or before its
    own slot, causally; a block row sees every key up to the block's last slot (the whole block both
    ways, and no padding row a static step puts after it)."""
    rows = torch.arange(len(row_slots), device=row_slots.device)
    limit = torch.where(rows < num_context, row_slots, row_slots[-1])
    return torch.arange(num_keys, device=row_slots.device)[None, :] <= limit[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` ([b, heads, n, d]) by per-position `cos`/`sin` ([b, n, d])."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def _is_block_mask(mask) -> bool:
    return type(mask).__name__ == "BlockMask"  # avoids importing flex attention for inference


_FLEX = None


def _flex_attention():
    """Flex Attention, compiled once on first use (eager flex attention is a slow reference)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=True) if torch.cuda.is_available() else flex_attention
    return _FLEX


class DrafterAttention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        layer_types = getattr(config, "layer_types", None) or []
        is_sliding = layer_idx < len(layer_types) and layer_types[layer_idx] == "sliding_attention"
        self.sliding_window = config.sliding_window if is_sliding else None

    def forward(self, x, context, cos, sin, cache=None, attn_mask=None, key_positions=None, slots=None):
        """`x`: normed rows [b, q, h], the queries; `context`: fused target features [b, c, h] (not
        normed) injected as keys and values before them, or None (input fusion: the keys and values
        are those of `x` alone); `slots`: cache slots of the rows, for a static cache."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        kv_in = x if context is None else torch.cat([context, x], dim=1)
        n = kv_in.shape[1]
        k, v = kernels.project_kv(self.k_proj, self.v_proj, kv_in)  # one GEMM on CUDA at inference
        k = k.view(b, n, self.num_kv_heads, self.head_dim)
        v = v.view(b, n, self.num_kv_heads, self.head_dim)
        q = apply_rope(q, cos[:, -q_len:], sin[:, -q_len:])
        if slots is not None:
            k = apply_rope(self.k_norm(k).transpose(1, 2), cos, sin)
            k, v = cache.write_at(self.layer_idx, slots, k, v.transpose(1, 2))
        elif cache is not None:
            # k_norm + RoPE + cache write: one fused launch per layer on CUDA (kernels/kv_injection.py).
            k, v = kernels.inject_kv(
                cache, self.layer_idx, k, v, self.k_norm.weight, self.k_norm.variance_epsilon, cos, sin
            )
        else:
            k, v = apply_rope(self.k_norm(k).transpose(1, 2), cos, sin), v.transpose(1, 2)
        if _is_block_mask(attn_mask):
            # Training on GPU (objective.py): the block-sparse mask skips every tile no query may see.
            # Any sliding window must already be part of that mask.
            out = _flex_attention()(
                q, k, v, block_mask=attn_mask, scale=self.head_dim**-0.5, enable_gqa=self.num_heads != self.num_kv_heads
            )
            return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))
        if self.sliding_window is not None:
            query_positions = (key_positions if slots is None else slots)[-q_len:]
            in_window = (query_positions[:, None] - key_positions[None, :]) < self.sliding_window
            attn_mask = in_window if attn_mask is None else attn_mask & in_window
        if cpu_attention.takes(q, k, attn_mask, 0.0):
            # A compiled CPU draft step over its static cache: only the keys in use cost time.
            out = cpu_attention.masked_attention(q, k, v, attn_mask, self.head_dim**-0.5)
        else:
            # flash-attn on CUDA when installed and no mask is needed, else SDPA (kernels/cuda_paths.py).
            out = drafter_attention(
                q, k, v, attn_mask=attn_mask, scale=self.head_dim**-0.5, enable_gqa=self.num_heads != self.num_kv_heads
            )
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DrafterLayer(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DrafterAttention(config, layer_idx)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)
        self.attention_conv = self.mlp_conv = None
        options = getattr(config, "dflash2", None)
        if options is not None:
            conv = (config.hidden_size, options.conv_kernel_size, options.conv_group_size)
            self.attention_conv, self.mlp_conv = BlockConv(*conv), BlockConv(*conv)

    def forward(self, x, context, cos, sin, block=None, **attn_kwargs):
        """`block`: slots per block when `x` holds several blocks (see `DFlashDrafter.forward`)."""
        h = self.input_layernorm(x)
        if self.attention_conv is None:
            x = x + self.self_attn(h, context, cos, sin, **attn_kwargs)
            return x + self.mlp(self.post_attention_layernorm(x))
        # DFlash2: the block, not the context, is filtered; so the block's own keys and values are too.
        x = x + self.attention_conv.around(lambda y: self.self_attn(y, context, cos, sin, **attn_kwargs), h, block)
        return x + self.mlp_conv.around(self.mlp, self.post_attention_layernorm(x), block)


class DFlashDrafter(nn.Module):
    """Block-diffusion drafter conditioned on target features (docs/design.md §2)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        n_features = len(config.target_layer_ids)
        self.layers = nn.ModuleList(DrafterLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fc = nn.Linear(n_features * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(config)
        if getattr(config, "draft_vocab_size", None):
            # Target ids the drafter may propose, most frequent first; stored in the checkpoint.
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size), persistent=True)
        else:
            self.draft_vocab = None
        self.dflash2 = getattr(config, "dflash2", None)  # a `DFlash2Options`, None for the first release
        if self.dflash2 is not None:
            self.candidate_selector = PathSelector(
                config.hidden_size, config.vocab_size, self.dflash2.selector_rank, self.dflash2.selector_top_k
            )
        # The LM head rows of the draft vocabulary as a checkpoint carried them (see `save_pretrained`).
        self.head_copy: torch.Tensor | None = None
        self._head: tuple | None = None
        self._static_cache: DrafterCache | None = None

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def autoregressive(self) -> bool:
        """True for the autoregressive drafter: causal, one token per pass (γ = block_size - 1 passes)."""
        return bool(getattr(self.config, "autoregressive", False))

    @property
    def input_fusion(self) -> bool:
        """True when the context features enter once, at the input (`context_fusion` "input"), not
        into every layer's keys and values."""
        return getattr(self.config, "context_fusion", "kv") == "input"

    @property
    def target_layer_ids(self) -> list[int]:
        return self.config.target_layer_ids

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def draft_head(self, lm_head: nn.Module) -> nn.Linear:
        """The target's LM head rows for the draft vocabulary: a frozen linear layer in the drafter's
        dtype (oneDNN-packed on CPU, see cpu_linear.py).

        Built once per target head and kept: casting or slicing a 49k x 576 matrix every cycle
        would cost more than the drafter's layers.
        """
        if torch.compiler.is_compiling() and self._head is not None:
            return self._head[1]  # a compiled step cannot read data pointers; its session built the head
        weight = lm_head.weight
        key = (weight.data_ptr(), weight.shape, weight.dtype, weight.device, self.dtype)
        if self._head is None or self._head[0] != key:
            # Decoding calls this under inference mode; the head outlives the call (training and
            # repacking read its weight's version counter), so it must be a normal tensor.
            with torch.inference_mode(False), torch.no_grad():
                w = weight.detach()
                if self.draft_vocab is not None:
                    w = w[self.draft_vocab.to(w.device)]
                head = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
                head.weight = nn.Parameter(w.to(self.dtype).contiguous(), requires_grad=False)
                pack_linears(head)
            self._head = (key, head)
        return self._head[1]

    def draft_logits(self, hidden: torch.Tensor, lm_head: nn.Module, anchor_ids: torch.Tensor | None = None):
        """What the draft is chosen from, for the drafted slots' final states `hidden` [n, h]: logits
        over the draft vocabulary (the full vocabulary when there is none), or for DFlash2 the path
        scores of its top-k candidates (`PathScores`), which need the block's slot-0 token `anchor_ids` [1]."""
        logits = self.draft_head(lm_head)(hidden.to(self.dtype))
        if self.dflash2 is None:
            return logits
        if anchor_ids is None:
            raise ValueError("a DFlash2 drafter scores its draft after the block's slot-0 token: pass anchor_ids")
        return self.candidate_paths(hidden, logits, anchor_ids)

    def candidate_paths(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor) -> PathScores:
        """DFlash2: the path scores of the top-k candidates of `logits` [..., n, V] (the LM head's, for the
        final states `hidden` [..., n, h]) after the slot-0 tokens `anchor_ids`; leading dimensions are
        blocks (training)."""
        unary, candidates = torch.topk(logits, self.dflash2.selector_top_k, dim=-1)
        # Scale and cap only the K kept values: both are monotonic, so the choice is the same.
        return self.candidate_selector(hidden.to(self.dtype), candidates, self.unary_scores(unary), anchor_ids)

    def unary_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """DFlash2's unary scores of LM head logits: times `output_multiplier`, soft-capped at
        `final_logit_softcapping` (off at 0), in float32."""
        options = self.dflash2
        unary = logits.float()
        if options.output_multiplier != 1.0:  # training passes the whole vocabulary: skip a pass over it
            unary = unary * options.output_multiplier
        if options.final_logit_softcapping > 0:
            unary = torch.tanh(unary / options.final_logit_softcapping) * options.final_logit_softcapping
        return unary

    def propose(self, drafted, sampling: SamplingParams, generator, sample_drafts: bool, vocab_size: int):
        """The draft target ids [n] from what `draft_logits` returned, and the distribution over the
        target vocabulary they were sampled from [n, V] (None for argmax drafts)."""
        if isinstance(drafted, PathScores):
            return PathSelector.propose(drafted, vocab_size, sampling if sample_drafts else None, generator)
        if sample_drafts:
            probs = probabilities(self.full_logits(drafted, vocab_size), sampling)
            return sample(probs, generator), probs
        return self.to_target_ids(greedy_ids(drafted)), None

    def to_target_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Map indices into the draft vocabulary to target token ids."""
        return index if self.draft_vocab is None else self.draft_vocab[index]

    def full_logits(self, draft_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Scatter draft-vocabulary logits into the target vocabulary (-inf elsewhere), in float32.

        Sampled drafts need the proposal distribution over the target's vocabulary for the
        rejection test; ids outside the draft vocabulary simply have probability 0. For DFlash2 path
        scores: each slot's scores after the greedy walk's previous choice (`PathSelector.realized_logits`).
        """
        if isinstance(draft_logits, PathScores):
            return PathSelector.realized_logits(draft_logits, vocab_size)
        if self.draft_vocab is None:
            return draft_logits.float()
        full = draft_logits.new_full((*draft_logits.shape[:-1], vocab_size), float("-inf"), dtype=torch.float32)
        return full.index_copy_(-1, self.draft_vocab, draft_logits.float())

    def new_cache(self, capacity: int | None = None) -> DrafterCache:
        """A fresh cache; with `capacity`, this drafter's static cache, emptied. The static cache is
        kept across runs, so CUDA graphs captured on it stay valid, and replaced only to grow; hence
        one graphed run at a time per drafter."""
        if capacity is None:
            return DrafterCache(len(self.layers))
        cache = self._static_cache
        if cache is None or cache.capacity < capacity:
            cache = self._static_cache = DrafterCache(len(self.layers), -(-capacity // 256) * 256)
        cache.length = 0
        return cache

    def with_own_cache(self) -> DFlashDrafter:
        """This drafter, its modules and weights shared, with a static cache of its own: a second
        graphed or compiled run beside one of this drafter's (`new_cache` keeps one per drafter)."""
        twin = copy.copy(self)
        twin._static_cache = None
        return twin

    def before_draft(self, start: int) -> None:
        """Host-side work before a draft step whose slot 0 is at `start`, outside any CUDA graph
        (none here; `OracleDrafter` picks its proposal)."""

    def forward(self, block_embeds, target_features, position_ids, cache=None, attn_mask=None, block_size=None):
        """Hidden states (after the final norm) of every block slot.

        block_embeds: [b, q, h], the target's embeddings of `[last token, mask, ...]`.
        target_features: [b, c, n*h], concatenated target layer outputs of the new context.
        position_ids: [b, c + q], positions of the new context, then of the block.
        cache: a `DrafterCache`; the new context is committed to it, the block is not. A static cache
        (with a capacity) commits nothing: position_ids are then the rows' slots (`static_slots`),
        context rows may be padding, and the caller commits the real ones.
        attn_mask: optional boolean mask [q, keys] (True = attend), e.g. the training block mask; for
        input fusion [c + q, keys], the context rows' then the block's (by default `fusion_mask`).
        block_size: slots per block when the q slots are several blocks side by side (training, under
        its block mask); DFlash2's convolutions stay inside each. Default: the q slots are one block.
        """
        context = self.hidden_norm(self.fc(target_features))
        if self.dflash2 is not None and self.dflash2.input_embedding_scale != 1.0:
            block_embeds = block_embeds * self.dflash2.input_embedding_scale
        cos, sin = self.rotary(block_embeds, position_ids)
        static = cache is not None and cache.capacity is not None
        key_positions = None  # only sliding-window layers need them; skip the work otherwise
        if static:
            # Fixed shapes for a CUDA graph: the block attends to the whole capacity, masked past its
            # last slot (slot = position, so the host never needs the cache length).
            key_positions = torch.arange(cache.capacity, device=position_ids.device)
            attn_mask = key_positions[None, :] <= position_ids[0, -1]
        elif any(layer.self_attn.sliding_window is not None for layer in self.layers):
            key_positions = position_ids[0]
            if cache is not None and cache.length:
                past = torch.arange(cache.length, device=position_ids.device, dtype=position_ids.dtype)
                key_positions = torch.cat([past, key_positions])
        x, num_context = block_embeds, context.shape[1]
        slots = position_ids[0] if static else None
        if self.input_fusion:
            # The context enters once, as rows of the sequence; from here on the layers see it only
            # through those rows' own states, never as injected keys and values.
            x, context = torch.cat([context.to(block_embeds.dtype), block_embeds], dim=1), None
            if static:
                attn_mask = fusion_mask(slots, num_context, cache.capacity)
            elif attn_mask is None:
                past = cache.length if cache is not None else 0
                row_slots = torch.arange(past, past + x.shape[1], device=position_ids.device)
                attn_mask = fusion_mask(row_slots, num_context, past + x.shape[1])
        for layer in self.layers:
            x = layer(x, context, cos, sin, block=block_size, cache=cache, attn_mask=attn_mask, key_positions=key_positions,
                      slots=slots)
        if cache is not None and not static:
            cache.commit(num_context)
        return self.norm(x[:, -block_embeds.shape[1]:])

    @classmethod
    def from_pretrained(
        cls, path_or_id: str | Path, device="cpu", dtype=torch.float32, progress=None, vocab_size: int | None = None
    ) -> DFlashDrafter:
        """Load a drafter (`config.json` + `model.safetensors`) from a directory or Hub id: the
        released format, or transformers' native one (`native_format.py`), which drafts over the
        target's whole head. `vocab_size`: the target's, for a native config that gives none;
        `progress`: see `hub.resolve_model_dir`."""
        directory = resolve_model_dir(path_or_id, ("config.json", "model.safetensors"), progress=progress)
        raw = json.loads((directory / "config.json").read_text())
        tensors = load_file(directory / "model.safetensors")
        if native_format.is_native(raw):
            raw, tensors = native_format.released_config(raw, vocab_size), native_format.from_native_state(tensors)
        config = parse_drafter_config(raw)
        state, head_copy = _from_file_state(tensors, config, directory)
        with torch.device("meta"):
            model = cls(config)
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise CheckpointError(
                f"{directory / 'model.safetensors'} does not match the drafter config: "
                f"missing keys {missing or 'none'}; unexpected keys {unexpected or 'none'}"
            )
        for name, param in model.state_dict().items():
            if state[name].shape != param.shape:
                raise CheckpointError(
                    f"{name} has shape {tuple(state[name].shape)} in the checkpoint but the config "
                    f"implies {tuple(param.shape)}"
                )
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        model.load_state_dict(state, strict=True, assign=True)
        # Rotary frequencies are not stored; rebuild them in float32 whatever the weight dtype.
        model.rotary = Qwen3RotaryEmbedding(config)
        model.head_copy = head_copy
        return model.to(device).eval()

    def head_rows(self, lm_head: nn.Module | None = None) -> torch.Tensor:
        """The target's LM head rows for the draft vocabulary: taken from `lm_head` when given, else
        from the head this drafter last drafted with, else from the copy its checkpoint carried."""
        if lm_head is not None:
            weight = lm_head.weight.detach()
            return weight[self.draft_vocab.to(weight.device)]
        if self._head is not None:
            return self._head[1].weight.detach()
        if self.head_copy is not None:
            return self.head_copy
        raise CheckpointError(
            "a drafter with a draft vocabulary is saved with its rows of the target's LM head (vLLM reads "
            "them as the drafter's lm_head), and this one has none yet: pass lm_head=target.head"
        )

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype = torch.bfloat16, lm_head=None) -> None:
        """Write the released format, loadable by `from_pretrained`, vLLM and the reference code.

        A draft vocabulary is written in the form vLLM 0.32 reads (EAGLE-3's): `d2t` (draft index i
        proposes target id i + d2t[i]), `lm_head.weight` (the target's head rows for those ids, from
        `head_rows(lm_head)`) and a top-level `draft_vocab_size`.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.dtype = str(dtype).removeprefix("torch.")
        state = dict(self.state_dict())
        if self.draft_vocab is not None:
            vocab = state.pop("draft_vocab")
            state["d2t"] = vocab - torch.arange(len(vocab), device=vocab.device)
            state["lm_head.weight"] = self.head_rows(lm_head)
        state = {
            k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous() for k, v in state.items()
        }
        save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps(drafter_config_dict(self.config), indent=2) + "\n")


def _from_file_state(state: dict, config, directory: Path) -> tuple[dict, torch.Tensor | None]:
    """The module state for a checkpoint's tensors, and the LM head rows it carried (or None).

    Reads the draft vocabulary in both stored forms: `d2t` offsets with an `lm_head.weight` (written
    since vLLM support), and the older `draft_vocab` list of target ids.
    """
    state = dict(state)
    state.pop("t2d", None)  # EAGLE-3's target-to-draft mask: implied by d2t, and vLLM skips it too
    head_copy = state.pop("lm_head.weight", None)
    if "d2t" in state:
        d2t = state.pop("d2t")
        if config.draft_vocab_size is None or d2t.shape != (config.draft_vocab_size,):
            raise CheckpointError(
                f"{directory / 'model.safetensors'} has a d2t of shape {tuple(d2t.shape)}, but the config gives "
                f"draft_vocab_size {config.draft_vocab_size}"
            )
        vocab = d2t.long() + torch.arange(len(d2t))
        if vocab.min() < 0 or vocab.max() >= config.vocab_size:
            raise CheckpointError(
                f"{directory / 'model.safetensors'}: d2t maps draft ids to target ids outside 0..{config.vocab_size - 1}"
            )
        state["draft_vocab"] = vocab
    if head_copy is not None and (config.draft_vocab_size is None or head_copy.shape != (config.draft_vocab_size, config.hidden_size)):
        raise CheckpointError(
            f"{directory / 'model.safetensors'} has an lm_head.weight of shape {tuple(head_copy.shape)}; this "
            f"engine reads one only as the rows of a draft vocabulary ({config.draft_vocab_size} x {config.hidden_size})"
        )
    return state, head_copy


def method_name(drafter) -> str:
    """"plain", "dflash", "dflash2", "ar", "fusion" (DFlash's input-fusion ablation), or a drafter's
    own `method` (e.g. "lookup")."""
    if drafter is None:
        return "plain"
    if hasattr(drafter, "session"):
        return drafter.method
    if getattr(drafter, "autoregressive", False):
        return "ar"
    if getattr(drafter, "input_fusion", False):
        return "fusion"
    return "dflash2" if getattr(drafter, "dflash2", None) is not None else "dflash"
