"""Drafter configuration: parsing and writing the released DFlash `config.json` format.

A released drafter config is a Qwen3 config plus DFlash keys (docs/design.md §3). The architecture part is
held by `transformers.Qwen3Config` (which normalises rope settings across versions); the DFlash
part is read here, from `dflash_config` first and the top level second.
"""

from __future__ import annotations

from transformers import Qwen3Config

from .errors import ConfigError

DFLASH_KEYS = ("block_size", "mask_token_id", "target_layer_ids")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers whose outputs feed the drafter when the config names none."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def parse_drafter_config(raw: dict) -> Qwen3Config:
    """Build the drafter config from a released `config.json` dict.

    The returned config carries `block_size`, `mask_token_id`, `target_layer_ids`,
    `num_target_layers` and `draft_vocab_size` as plain attributes. `draft_vocab_size` (None in
    the z-lab checkpoints; a top-level key, as vLLM reads it, or in `dflash_config` in older files
    of this project) says the drafter proposes only from a stored subset of the vocabulary, so its
    share of the LM head costs a fraction of the full one.
    """
    nested = raw.get("dflash_config") or {}

    def lookup(key):
        return nested[key] if nested.get(key) is not None else raw.get(key)

    config = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("dflash_config", "auto_map")})
    config.dflash_config = dict(nested)
    # Qwen3Config drops sliding_window unless use_sliding_window is set; docs/design.md §2 goes by layer_types.
    if raw.get("layer_types"):
        config.layer_types = list(raw["layer_types"])
        config.sliding_window = raw.get("sliding_window")
        if "sliding_attention" in config.layer_types and not config.sliding_window:
            raise ConfigError("drafter config marks sliding_attention layers but gives no sliding_window")

    block_size = lookup("block_size")
    mask_token_id = lookup("mask_token_id")
    num_target_layers = lookup("num_target_layers")
    if block_size is None or int(block_size) < 1:
        raise ConfigError(f"drafter config has no valid block_size (got {block_size!r})")
    if mask_token_id is None:
        raise ConfigError("drafter config has no mask_token_id (expected in dflash_config)")
    if not 0 <= int(mask_token_id) < config.vocab_size:
        raise ConfigError(f"mask_token_id {mask_token_id} is outside the vocabulary of size {config.vocab_size}")

    layer_ids = lookup("target_layer_ids")
    if layer_ids is None:
        if num_target_layers is None:
            raise ConfigError("drafter config gives neither target_layer_ids nor num_target_layers")
        layer_ids = default_target_layer_ids(int(num_target_layers), config.num_hidden_layers)
    if not layer_ids:
        raise ConfigError("drafter config has an empty target_layer_ids")

    config.block_size = int(block_size)
    config.mask_token_id = int(mask_token_id)
    config.target_layer_ids = [int(i) for i in layer_ids]
    config.num_target_layers = None if num_target_layers is None else int(num_target_layers)
    draft_vocab_size = lookup("draft_vocab_size")
    if draft_vocab_size is not None and not 1 <= int(draft_vocab_size) <= config.vocab_size:
        raise ConfigError(f"draft_vocab_size {draft_vocab_size} must be between 1 and the vocabulary size {config.vocab_size}")
    config.draft_vocab_size = None if draft_vocab_size is None else int(draft_vocab_size)
    return config


def drafter_config_dict(config: Qwen3Config) -> dict:
    """The released-format dict for `config` (what `parse_drafter_config` reads back)."""
    raw = config.to_dict()
    for key in (*DFLASH_KEYS, "dflash_config", "num_target_layers", "draft_vocab_size"):
        raw.pop(key, None)
    dflash = {
        "mask_token_id": config.mask_token_id,
        "target_layer_ids": list(config.target_layer_ids),
        "block_size": config.block_size,
    }
    if getattr(config, "draft_vocab_size", None):
        raw["draft_vocab_size"] = config.draft_vocab_size  # top level: where vLLM looks
    raw.update(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        # Older transformers and the reference code read rope_theta at the top level.
        rope_theta=config.rope_parameters["rope_theta"],
        block_size=config.block_size,
        num_target_layers=config.num_target_layers,
        dflash_config=dflash,
    )
    return raw
