"""Tiny random target/drafter pairs in the real on-disk formats, for fast CPU tests.

The target is a Llama checkpoint with untied embeddings and a byte-level BPE tokenizer with a
ChatML template (like the offline default target); the drafter is in the released DFlash format
with default `target_layer_ids` and `block_size` inside `dflash_config`.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from dflash_core.models.config import parse_drafter_config
from dflash_core.models.drafter import DFlashDrafter

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3's switch, in miniature: without thinking the assistant turn opens with an empty think block.
THINKING_CHATML = CHATML.replace(
    "<|im_start|>assistant\n{% endif %}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}",
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. 1 + 2 = 3, 12 * 4 = 48.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Once upon a time, a student learned how speculative decoding works <b>&amp;</b> smiled.",
    "What is the capital of France? Paris is the capital of France.",
]


def build_tokenizer(vocab_size: int = 320, chat_template: str = CHATML) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = chat_template
    return fast


def build_target(
    directory: Path, *, num_layers: int = 6, hidden: int = 32, intermediate: int | None = None, seed: int = 0,
    vocab_size=None, logit_scale: float = 8.0, chat_template: str = CHATML, max_positions: int = 512,
    heads: int = 4, kv_heads: int = 2,
) -> Path:
    """A random Llama causal LM (untied embeddings) plus tokenizer, saved with `save_pretrained`."""
    tokenizer = build_tokenizer(chat_template=chat_template)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    # Larger logits keep greedy choices far from ties; smaller ones give spread-out sampling.
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(directory)
    if vocab_size is None:
        tokenizer.save_pretrained(directory)
    return Path(directory)


def build_drafter(
    directory: Path, target_dir: Path, *, num_layers: int = 2, block_size: int = 8, seed: int = 1,
    draft_vocab: list[int] | None = None, **overrides
) -> Path:
    """A random drafter in the released format for the target in `target_dir`.

    `draft_vocab`: the target ids the drafter may propose (this project's extension), else all.
    """
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    mask_id = target_config["vocab_size"] - 1
    raw = Qwen3Config(
        vocab_size=target_config["vocab_size"],
        hidden_size=target_config["hidden_size"],
        intermediate_size=2 * target_config["hidden_size"],
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=target_config["hidden_size"] // 4,
        max_position_embeddings=target_config["max_position_embeddings"],
    ).to_dict()
    dflash = {"mask_token_id": mask_id, "block_size": block_size}
    if draft_vocab is not None:
        raw["draft_vocab_size"] = len(draft_vocab)
    raw.update(num_target_layers=target_config["num_hidden_layers"], dflash_config=dflash)
    raw.update(overrides)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(parse_drafter_config(raw))
    head = None
    if draft_vocab is not None:
        drafter.draft_vocab.copy_(torch.tensor(draft_vocab))
        # The saved drafter carries its rows of the target's LM head (untied here: lm_head.weight).
        head = SimpleNamespace(weight=load_file(Path(target_dir) / "model.safetensors")["lm_head.weight"])
    drafter.save_pretrained(directory, dtype=torch.float32, lm_head=head)
    return Path(directory)


def build_fusion_drafter(directory: Path, target_dir: Path, *, context_fusion: str = "input", **kwargs) -> Path:
    """A random drafter of `build_drafter`'s shape whose config gives `context_fusion` ("input": an
    input-fusion drafter, the target's features at its input only; "kv": DFlash's KV injection)."""
    vocab = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"]
    block = kwargs.pop("block_size", 8)
    dflash = {"mask_token_id": vocab - 1, "block_size": block, "context_fusion": context_fusion}
    return build_drafter(directory, target_dir, block_size=block, dflash_config=dflash, **kwargs)


def build_qwen3_target(directory: Path, *, num_layers: int = 4, hidden: int = 32, vocab_size: int = 64, seed: int = 0,
                       logit_scale: float = 8.0) -> Path:
    """A random Qwen3 causal LM without a tokenizer (prompts are ids), saved with `save_pretrained`."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(directory)
    return Path(directory)


def build_dflash2_drafter(
    directory: Path, target_dir: Path, *, num_layers: int = 2, block_size: int = 8, seed: int = 1,
    conv_kernel_size: int = 3, conv_group_size: int = 8, selector_rank: int = 4, selector_top_k: int = 4,
    random_norms: bool = False, **dflash_extra,
) -> Path:
    """A random DFlash2 drafter in the released format for the target in `target_dir`.

    Its convolutions and selector get random weights (a fresh one is the identity / has no pair
    term), so a test sees every DFlash2 part act. `random_norms`: every RMSNorm weight drawn around 1
    too, so each layer's norms differ (all-ones norms hide a norm applied with another layer's
    weight). `dflash_extra`: more `dflash_config` keys.
    """
    mask_id = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"] - 1
    dflash = {
        "mask_token_id": mask_id, "block_size": block_size, "conv_kernel_size": conv_kernel_size,
        "conv_group_size": conv_group_size, "selector_rank": selector_rank, "selector_top_k": selector_top_k,
        **dflash_extra,
    }
    build_drafter(directory, target_dir, num_layers=num_layers, block_size=block_size, seed=seed,
                  architectures=["DFlash2DraftModel"], dflash_config=dflash)
    drafter = DFlashDrafter.from_pretrained(directory)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if "conv.base_kernel" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
            elif "conv.kernel_projection" in name:
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
            elif "candidate_selector" in name:
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5 * 2)
            elif random_norms and name.endswith("norm.weight"):
                param.copy_(1 + 0.5 * torch.randn(param.shape, generator=generator))
    drafter.save_pretrained(directory, dtype=torch.float32)
    return Path(directory)
