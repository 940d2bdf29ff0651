"""How a new drafter starts: its config for a target, its mask token, and its first weights.

A drafter shares the target's width, so its layers can start as copies of the target's own top
layers (`init_from_target`), and a trained drafter can be deepened (`grow_drafter`), given more target layers to read
(`add_feature_layers`) or turned into a DFlash2 drafter (`to_dflash2`) without losing what it learned.
Used by `train.py`; nothing here trains.
"""

from __future__ import annotations

import copy
import math

import torch

from ..errors import ConfigError
from ..models.config import DFLASH2, DFLASH_AR, drafter_config_dict, parse_drafter_config
from ..models.drafter import DFlashDrafter
from ..models.target import Target


def pick_mask_token_id(tokenizer, vocab_size: int, seen: set[int]) -> tuple[int, str]:
    """An id that never occurs in the data: an unused special token if there is one, else the last free id.

    A mask id that also occurs as real text would make the drafter's input ambiguous.
    """
    specials: list[tuple[int, str]] = []
    if tokenizer is not None:
        reserved = {tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
        for tid, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
            name = getattr(tok, "content", str(tok))
            if tid not in reserved and tid not in seen and tid < vocab_size:
                specials.append((int(tid), name))
    if specials:
        # Prefer a token whose name says it is a mask, then the highest-numbered unused special.
        specials.sort(key=lambda t: ("mask" in t[1].lower(), t[0]))
        tid, name = specials[-1]
        return tid, f"unused special token {name!r}"
    for tid in range(vocab_size - 1, -1, -1):
        if tid not in seen:
            return tid, "highest id absent from the data"
    raise ConfigError("every vocabulary id occurs in the data; pass --mask-token-id")


def build_drafter_config(target: Target, layers: int, block_size: int, mask_token_id: int, layer_ids: list[int],
                         autoregressive: bool = False):
    """A released-format drafter config of the target's width (the drafter shares its embedding);
    `autoregressive` makes it the causal one-token-per-pass drafter (`DFlashARDraftModel`)."""
    tc = target.model.config
    heads = tc.num_attention_heads
    rope = getattr(tc, "rope_parameters", None) or {}
    raw = {
        "vocab_size": target.vocab_size,
        "hidden_size": tc.hidden_size,
        "intermediate_size": tc.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(tc, "num_key_value_heads", None) or heads,
        "head_dim": getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        "hidden_act": getattr(tc, "hidden_act", "silu"),
        "max_position_embeddings": tc.max_position_embeddings,
        "rms_norm_eps": getattr(tc, "rms_norm_eps", 1e-6),
        "rope_theta": rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0)),
        "attention_bias": bool(getattr(tc, "attention_bias", False)),
        "tie_word_embeddings": False,
        "num_target_layers": target.num_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": layer_ids, "block_size": block_size},
    }
    if autoregressive:
        raw["architectures"] = [DFLASH_AR]
    return parse_drafter_config(raw)


@torch.no_grad()
def query_key_scales(target: Target, layer_ids: list[int], samples: list[torch.Tensor]) -> dict[int, tuple[float, float]]:
    """Root-mean-square norm per head of the target's queries and keys at `layer_ids`, on real text.

    Targets without q/k norms (Llama-style) leave the magnitude of q.k, and so how sharply a head
    can attend, to the projections; a drafter that normalises q and k needs these as norm gains.
    """
    config = target.model.config
    head_dim = getattr(config, "head_dim", None) or target.hidden_size // config.num_attention_heads
    sums = {i: [0.0, 0.0, 0] for i in layer_ids}
    hooks = []
    for i in layer_ids:
        attn = target.layers[i].self_attn

        def record(slot, i=i):
            def hook(_module, _inputs, out):
                vectors = out.float().reshape(-1, head_dim)
                sums[i][slot] += float(vectors.pow(2).sum(-1).mean() / head_dim)
                if slot == 0:
                    sums[i][2] += 1
            return hook

        hooks += [attn.q_proj.register_forward_hook(record(0)), attn.k_proj.register_forward_hook(record(1))]
    try:
        for ids in samples:
            target.model(input_ids=ids[None].to(target.device), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return {i: (math.sqrt(q / max(n, 1)), math.sqrt(k / max(n, 1))) for i, (q, k, n) in sums.items()}


def _copy_target_layer(layer, src, scales: tuple[float, float] | None) -> None:
    """Load target layer `src` (attention, MLP, norms) into drafter layer `layer`.

    q_norm/k_norm come from the target when it has them; otherwise their gains are the target's
    measured q/k norms (`scales`): with gains of 1 the attention logits stay within a few units and
    every head attends almost uniformly, which left a first drafter unable to focus on the recent
    context. Never below 1: smaller gains would only flatten attention further (random targets).
    """
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        getattr(layer.self_attn, name).load_state_dict(getattr(src.self_attn, name).state_dict())
    for j, norm in enumerate(("q_norm", "k_norm")):
        src_norm = getattr(src.self_attn, norm, None)
        if src_norm is not None:
            getattr(layer.self_attn, norm).weight.copy_(src_norm.weight)
        else:
            getattr(layer.self_attn, norm).weight.fill_(max(scales[j], 1.0) if scales else 1.0)
    layer.mlp.load_state_dict(src.mlp.state_dict())
    layer.input_layernorm.weight.copy_(src.input_layernorm.weight)
    layer.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)


def _target_layer_scales(target: Target, first: int, samples) -> dict:
    """q/k norm gains for target layers `first`.. when the target has no q_norm/k_norm."""
    big = target.layers
    needs = any(getattr(big[i].self_attn, "q_norm", None) is None for i in range(first, len(big)))
    return query_key_scales(target, list(range(first, len(big))), list(samples)) if needs and samples else {}


@torch.no_grad()
def init_from_target(drafter: DFlashDrafter, target: Target, samples: list[torch.Tensor] = ()) -> None:
    """Start from the target's own top layers: they already map features of this width to tokens.

    Drafter layer i takes target layer L-n+i (see `_copy_target_layer`). `fc` starts by passing
    the last selected layer's features through, `hidden_norm` scales them as the first copied
    layer's input norm would, and `norm` is the target's final norm, so the initial drafter is a
    shortened copy of the target's upper stack.
    """
    n, big = len(drafter.layers), target.layers
    start = len(big) - n
    scales = _target_layer_scales(target, start, samples)
    for i, layer in enumerate(drafter.layers):
        _copy_target_layer(layer, big[start + i], scales.get(start + i))
    h = drafter.config.hidden_size
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, -h:] = torch.eye(h)
    drafter.fc.weight.add_(torch.randn_like(drafter.fc.weight) * 0.01)
    drafter.hidden_norm.weight.copy_(big[start].input_layernorm.weight)
    drafter.norm.weight.copy_(target.model.get_decoder().norm.weight)


@torch.no_grad()
def grow_drafter(warm: DFlashDrafter, target: Target, layers: int, samples: list[torch.Tensor] = ()) -> DFlashDrafter:
    """`warm` with layers appended up to `layers`, computing exactly what `warm` computes.

    Each new layer starts as a copy of one of the target's top layers with its output projections
    (o_proj, down_proj) zeroed: its residual branches add nothing, so training resumes from the
    warm drafter's acceptance instead of from scratch, and gradients reach the zeroed projections
    at once (their inputs are not zero), so the new depth comes into use from the first steps.
    """
    have = len(warm.layers)
    if layers < have:
        raise ConfigError(f"cannot grow a {have}-layer drafter to {layers} layers: a drafter can grow, not shrink")
    config = copy.deepcopy(warm.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types) + [config.layer_types[-1]] * (layers - have)
    grown = DFlashDrafter(config).to(dtype=warm.dtype, device=warm.fc.weight.device)
    missing, unexpected = grown.load_state_dict(warm.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("layers.") for k in missing), (missing, unexpected)
    big = target.layers
    start = len(big) - (layers - have)
    scales = _target_layer_scales(target, start, samples)
    for i, layer in enumerate(grown.layers[have:]):
        _copy_target_layer(layer, big[start + i], scales.get(start + i))
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return grown


@torch.no_grad()
def add_feature_layers(warm: DFlashDrafter, layer_ids: list[int]) -> DFlashDrafter:
    """`warm` reading the target layers `layer_ids`, a superset of its own, computing exactly what `warm` computes.

    `fc` takes the concatenated features in `layer_ids` order; the columns of the layers `warm`
    already read keep its weights and the new layers' columns start at zero, so training resumes
    from the warm drafter's acceptance and learns what the new layers add.
    """
    old, new = list(warm.target_layer_ids), [int(i) for i in layer_ids]
    if len(set(new)) != len(new) or not set(old) <= set(new):
        raise ConfigError(f"target_layer_ids {new} must list each layer once and keep the warm drafter's {old}")
    config = copy.deepcopy(warm.config)
    config.target_layer_ids = new
    wider = DFlashDrafter(config).to(dtype=warm.dtype, device=warm.fc.weight.device)
    state = {k: v for k, v in warm.state_dict().items() if k != "fc.weight"}
    missing, unexpected = wider.load_state_dict(state, strict=False)
    assert missing == ["fc.weight"] and not unexpected, (missing, unexpected)
    h = config.hidden_size
    wider.fc.weight.zero_()
    for j, layer in enumerate(old):
        k = new.index(layer)
        wider.fc.weight[:, k * h:(k + 1) * h] = warm.fc.weight[:, j * h:(j + 1) * h]
    return wider


@torch.no_grad()
def to_dflash2(warm: DFlashDrafter, conv_kernel_size: int, conv_group_size: int, selector_rank: int,
               selector_top_k: int) -> DFlashDrafter:
    """`warm`, a first-release DFlash drafter, as a DFlash2 one (docs/design.md §2, "DFlash2") that drafts
    what `warm` drafts over the whole vocabulary.

    Every layer's `BlockConv` starts as the identity at tap 0 with no correction (its own init), so the
    layers compute what `warm`'s did; the selector's hidden projection starts at zero, so no edge has a
    pairwise term and the greedy walk takes each slot's top candidate: `warm`'s argmax. Its codebooks
    start random, so the projection's first gradients are not zero. A DFlash2 drafter has no draft
    vocabulary (its candidates are target ids): a `warm` one with a draft vocabulary drops it and
    drafts over the target's whole LM head.

    Sizes: the convolutions add 2 * layers * (2 * taps * hidden + 2 * taps * groups * hidden) weights,
    groups = hidden / conv_group_size; the selector 2 * vocab * rank + rank * hidden. For the offline
    pair (576 hidden, 49,152 vocabulary, 3 layers; an 11.6M DFlash drafter) taps 2, groups of 16 and
    rank 32 add 0.51M and 3.16M; the released rank 256 would add 25.3M, twice the drafter.
    """
    if warm.autoregressive or warm.dflash2 is not None:
        raise ConfigError(f"only a first-release DFlash drafter turns into a DFlash2 one, not a {warm.config.architecture}")
    raw = drafter_config_dict(warm.config)
    raw.pop("draft_vocab_size", None)
    raw["architectures"] = [DFLASH2]
    raw["dflash_config"].update(conv_kernel_size=conv_kernel_size, conv_group_size=conv_group_size,
                                selector_rank=selector_rank, selector_top_k=selector_top_k)
    config = parse_drafter_config(raw)  # names a group size that does not divide the width, and the like
    new = DFlashDrafter(config).to(dtype=warm.dtype, device=warm.fc.weight.device)
    state = {k: v for k, v in warm.state_dict().items() if k != "draft_vocab"}
    missing, unexpected = new.load_state_dict(state, strict=False)
    assert not unexpected and all("_conv." in k or k.startswith("candidate_selector.") for k in missing), (missing, unexpected)
    new.candidate_selector.hidden_projection.weight.zero_()
    return new
