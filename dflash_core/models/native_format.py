"""The mapping between this engine's drafter format and transformers' native DFlash format.

transformers (5.25 on) runs DFlash itself: `generate(..., assistant_model=draft, speculation_type="dflash")`
with a `MuseGlimmerAssistantModel` drafter, whose checkpoint has `model_type` "muse_glimmer_assistant".
Its layers are the released drafter's (Qwen3-style, QK-norm, no biases, a final `norm`); only the
fusion of the target features is named otherwise (`encoder.fc`, `encoder.output_norm_enc` for our
`fc`, `hidden_norm`), and the DFlash keys sit at the top level of its config. It drafts with the
target's embeddings and its whole LM head, so a draft vocabulary (`d2t` and the head rows) has no
place in it. docs/design.md §3 ("transformers' native format") lists the fields.

This module only translates configs and state dicts; `export_native.py` writes a native checkpoint,
`DFlashDrafter.from_pretrained` reads one through `released_config` and `from_native_state`.
"""

from __future__ import annotations

from ..errors import ConfigError
from .config import DFLASH

NATIVE_MODEL_TYPE = "muse_glimmer_assistant"
NATIVE_ARCHITECTURE = "MuseGlimmerAssistantModel"
# Our state-dict prefixes and theirs; every other key is the same in both.
RENAMES = (("fc.", "encoder.fc."), ("hidden_norm.", "encoder.output_norm_enc."))
# Architecture keys both configs give under the same names.
SHARED_KEYS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "rms_norm_eps", "max_position_embeddings", "hidden_act", "attention_dropout",
)
# transformers' values when a native config leaves these out (MuseGlimmerAssistantConfig).
NATIVE_DEFAULT_THETA = 500000.0
NATIVE_DEFAULT_WINDOW = 2048


def is_native(raw: dict) -> bool:
    """Whether a `config.json` dict is in transformers' native DFlash format."""
    return raw.get("model_type") == NATIVE_MODEL_TYPE or NATIVE_ARCHITECTURE in (raw.get("architectures") or [])


def native_config(config, special_ids: dict | None = None) -> dict:
    """The `MuseGlimmerAssistantConfig` keyword arguments of the drafter config `config` (a parsed
    released config, `config.parse_drafter_config`).

    Refuses what the native model has no part for: DFlash2's convolutions and selector, the
    autoregressive drafter's causal passes, input fusion, biased projections. `vocab_size` and
    `num_target_layers` ride along as extra keys (transformers keeps them) so this engine can check
    the pair when it loads the checkpoint back. `special_ids`: the target's bos/eos/pad ids (None
    each otherwise).
    """
    if getattr(config, "dflash2", None) is not None:
        raise ConfigError(
            "transformers' native DFlash has no DFlash2 convolutions or path selector: a DFlash2 drafter "
            "cannot be exported"
        )
    if getattr(config, "autoregressive", False):
        raise ConfigError(
            "transformers' native DFlash drafts a block in one bidirectional pass: the autoregressive drafter "
            "cannot be exported"
        )
    if getattr(config, "context_fusion", "kv") != "kv":
        raise ConfigError(
            "transformers' native DFlash injects the context into every layer's keys and values: an input-fusion "
            "drafter (context_fusion 'input') cannot be exported"
        )
    if getattr(config, "attention_bias", False):
        raise ConfigError(
            "transformers' native DFlash drafter has no attention biases; this drafter has attention_bias=True"
        )
    layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
    fields = {key: getattr(config, key) for key in SHARED_KEYS}
    fields["head_dim"] = config.head_dim or config.hidden_size // config.num_attention_heads
    fields.update(
        rope_parameters=dict(config.rope_parameters),
        layer_types=layer_types,
        block_size=config.block_size,
        mask_token_id=config.mask_token_id,
        target_layer_ids=list(config.target_layer_ids),
        vocab_size=config.vocab_size,
    )
    if config.num_target_layers is not None:
        fields["num_target_layers"] = config.num_target_layers
    if "sliding_attention" in layer_types:
        fields["sliding_window"] = config.sliding_window
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        fields[key] = (special_ids or {}).get(key)
    return fields


def released_config(raw: dict, vocab_size: int | None = None) -> dict:
    """The released-format config dict (what `parse_drafter_config` reads) of a native `config.json`
    dict; `vocab_size` (the target's) stands in where the native config gives none."""
    vocab = raw.get("vocab_size") or vocab_size
    if vocab is None:
        raise ConfigError(
            f"this {NATIVE_MODEL_TYPE} config gives no vocab_size, and no target was given to take it from; "
            "load it with its target (load_pair) or add the target's vocab_size to config.json"
        )
    released = {key: raw[key] for key in SHARED_KEYS if raw.get(key) is not None}
    layer_types = raw.get("layer_types") or ["sliding_attention"] * int(raw["num_hidden_layers"])
    released.update(
        architectures=[DFLASH],
        model_type="qwen3",
        vocab_size=int(vocab),
        attention_bias=False,
        tie_word_embeddings=False,
        rope_parameters=raw.get("rope_parameters") or {"rope_type": "default", "rope_theta": NATIVE_DEFAULT_THETA},
        layer_types=layer_types,
        dflash_config={key: raw[key] for key in ("block_size", "mask_token_id", "target_layer_ids") if key in raw},
    )
    if "sliding_attention" in layer_types:
        released["sliding_window"] = raw.get("sliding_window") or NATIVE_DEFAULT_WINDOW
    if raw.get("num_target_layers") is not None:
        released["num_target_layers"] = raw["num_target_layers"]
    return released


def to_native_state(state: dict) -> dict:
    """Our drafter's state dict under the native names, less the draft vocabulary (the native
    drafter drafts over the target's whole head)."""
    return {_renamed(name, 0, 1): tensor for name, tensor in state.items() if name != "draft_vocab"}


def from_native_state(state: dict) -> dict:
    """A native checkpoint's state dict under this engine's names."""
    return {_renamed(name, 1, 0): tensor for name, tensor in state.items()}


def _renamed(name: str, source: int, dest: int) -> str:
    for pair in RENAMES:
        if name.startswith(pair[source]):
            return pair[dest] + name[len(pair[source]):]
    return name
