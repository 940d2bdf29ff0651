"""Drafter configuration: parsing and writing the released DFlash `config.json` format.

A released drafter config is a Qwen3 config plus DFlash keys (docs/design.md §3). The architecture part is
held by `transformers.Qwen3Config` (which normalises rope settings across versions); the DFlash
part is read here, from `dflash_config` first and the top level second. `architectures` names the
release: `DFlashDraftModel` (or nothing) for the first, `DFlash2DraftModel` for DFlash2, whose
convolution and path-selector keys are read and checked here too (docs/design.md §2-§3, "DFlash2"),
and `DFlashARDraftModel` for this project's autoregressive drafter with the same KV injection
(the same layers run causally, one token per pass; `config.autoregressive`). `context_fusion` in
`dflash_config` says where the target's context features enter: "kv" (DFlash's injection into every
layer's keys and values, the default) or "input" (this project's ablation: once, at the input, as
sequence positions of their own; `config.context_fusion`, docs/design.md §2 "Input fusion"); such
a drafter is written as `DFlashInputFusionDraftModel`, so that engines which know only DFlash refuse it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transformers import Qwen3Config

from ..errors import ConfigError

DFLASH_KEYS = ("block_size", "mask_token_id", "target_layer_ids")
DFLASH = "DFlashDraftModel"
DFLASH2 = "DFlash2DraftModel"
DFLASH_AR = "DFlashARDraftModel"
# Input fusion has DFlash's weights; a name of its own makes engines that know only DFlash (vLLM, the
# reference package, transformers) refuse it instead of running its weights as KV injection.
DFLASH_FUSION = "DFlashInputFusionDraftModel"
ARCHITECTURES = (DFLASH, DFLASH2, DFLASH_AR, DFLASH_FUSION)
# The integer keys a DFlash2 config must give, and its optional float keys with their defaults.
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DFLASH2_SCALARS = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": 0.0}
# Where the context features enter the drafter: every layer's keys and values, or the input once.
CONTEXT_FUSIONS = ("kv", "input")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers whose outputs feed the drafter when the config names none."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def parse_drafter_config(raw: dict) -> Qwen3Config:
    """Build the drafter config from a released `config.json` dict.

    The returned config carries `block_size`, `mask_token_id`, `target_layer_ids`,
    `num_target_layers`, `draft_vocab_size`, `architecture`, `autoregressive` (True for a
    `DFlashARDraftModel`), `dflash2` (a `DFlash2Options`, or None for a first-release drafter) and
    `context_fusion` (one of `CONTEXT_FUSIONS`, "kv" when the config gives none) as plain
    attributes. `draft_vocab_size` (None in the z-lab checkpoints; a top-level key, as vLLM reads
    it, or in `dflash_config` in older files of this project) says the drafter proposes only from a
    stored subset of the vocabulary, so its share of the LM head costs a fraction of the full one.
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
    config.architecture = _architecture(raw)
    config.autoregressive = config.architecture == DFLASH_AR
    config.dflash2 = _parse_dflash2(config, lookup, nested)
    config.context_fusion = _parse_context_fusion(config, lookup("context_fusion"))
    return config


def _parse_context_fusion(config: Qwen3Config, value) -> str:
    """The drafter's `context_fusion`, checked against the kinds input fusion is implemented for."""
    fusion_named = config.architecture == DFLASH_FUSION
    if value is None:
        return "input" if fusion_named else "kv"
    if value not in CONTEXT_FUSIONS:
        raise ConfigError(f"dflash_config.context_fusion must be one of {CONTEXT_FUSIONS}, got {value!r}")
    if value == "kv" and fusion_named:
        raise ConfigError(f"a {DFLASH_FUSION} drafter fuses the context at its input; its config gives context_fusion 'kv'")
    if value == "input" and config.architecture not in (DFLASH, DFLASH_FUSION):
        # DFlash2's block convolution filters the block along the sequence, which would then hold the
        # context rows too; the autoregressive drafter with input fusion is not implemented.
        raise ConfigError(
            f"dflash_config.context_fusion 'input' is implemented for {DFLASH} drafters only; this config's "
            f"architecture is {config.architecture}"
        )
    return value


def _architecture(raw: dict) -> str:
    names = raw.get("architectures") or [DFLASH]
    if isinstance(names, str):
        names = [names]
    known = [name for name in names if name in ARCHITECTURES]
    if not known:
        raise ConfigError(
            f"drafter config names architectures {names}; this engine loads {', '.join(ARCHITECTURES)} drafters"
        )
    return known[0]


@dataclass(frozen=True)
class DFlash2Options:
    """What a DFlash2 config adds (docs/design.md §2, "DFlash2"): the convolution's taps and group
    size, the path selector's codebook rank and candidates per slot, and three scalars on the
    embeddings and the candidates' logits."""

    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float = 0.0


def _parse_dflash2(config: Qwen3Config, lookup, nested: dict) -> DFlash2Options | None:
    """The DFlash2 options of `config`, None for a first-release drafter.

    The four integer keys follow the lookup rule; the optional scalars are read from `dflash_config`
    only, as vLLM does (a top-level `final_logit_softcapping` may belong to the target's family).
    """
    present = [key for key in DFLASH2_KEYS if lookup(key) is not None]
    if config.architecture != DFLASH2:
        if present:
            raise ConfigError(
                f"drafter config gives the DFlash2 keys {present} but its architecture is {config.architecture}; "
                f"a DFlash2 drafter declares architectures [\"{DFLASH2}\"]"
            )
        return None
    missing = [key for key in DFLASH2_KEYS if lookup(key) is None]
    if missing:
        raise ConfigError(f"{DFLASH2} config has no {', '.join(missing)} (expected in dflash_config)")
    values = {}
    for key in DFLASH2_KEYS:
        value = lookup(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{DFLASH2} config key {key} must be a positive integer, got {value!r}")
        values[key] = value
    for key, default in DFLASH2_SCALARS.items():
        value = nested.get(key)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{DFLASH2} config key {key} must be a number, got {value!r}")
        values[key] = float(value)
    options = DFlash2Options(**values)
    if config.hidden_size % options.conv_group_size:
        raise ConfigError(
            f"conv_group_size {options.conv_group_size} does not divide hidden_size {config.hidden_size}"
        )
    if options.selector_top_k > config.vocab_size:
        raise ConfigError(
            f"selector_top_k {options.selector_top_k} exceeds the vocabulary of size {config.vocab_size}"
        )
    if options.output_multiplier <= 0:
        raise ConfigError(f"output_multiplier must be positive, got {options.output_multiplier}")
    if config.draft_vocab_size is not None:
        # The selector's codebooks have one row per target token, and its candidates are target ids.
        raise ConfigError(f"{DFLASH2} drafters propose from the whole vocabulary: draft_vocab_size is not supported")
    return options


def drafter_config_dict(config: Qwen3Config) -> dict:
    """The released-format dict for `config` (what `parse_drafter_config` reads back)."""
    raw = config.to_dict()
    for key in (*DFLASH_KEYS, "dflash_config", "num_target_layers", "draft_vocab_size", "architecture", "dflash2",
                "autoregressive", "context_fusion"):
        raw.pop(key, None)
    dflash = {
        "mask_token_id": config.mask_token_id,
        "target_layer_ids": list(config.target_layer_ids),
        "block_size": config.block_size,
    }
    if getattr(config, "draft_vocab_size", None):
        raw["draft_vocab_size"] = config.draft_vocab_size  # top level: where vLLM looks
    options = getattr(config, "dflash2", None)
    if options is not None:
        dflash.update(asdict(options))
    if getattr(config, "context_fusion", "kv") != "kv":
        dflash["context_fusion"] = config.context_fusion  # DFlash's own configs stay as released
    architecture = (
        DFLASH2 if options is not None
        else DFLASH_AR if getattr(config, "autoregressive", False)
        else DFLASH_FUSION if getattr(config, "context_fusion", "kv") == "input"
        else DFLASH
    )
    raw.update(
        architectures=[architecture],
        model_type="qwen3",
        # Older transformers and the reference code read rope_theta at the top level.
        rope_theta=config.rope_parameters["rope_theta"],
        block_size=config.block_size,
        num_target_layers=config.num_target_layers,
        dflash_config=dflash,
    )
    return raw
