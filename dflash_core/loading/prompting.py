"""From user text to prompt ids (through the chat template) and from generated ids back to text.

Decoding is incremental: BPE tokens can split a multi-byte character, so text is released only
once it decodes cleanly.
"""

from __future__ import annotations

from ..errors import GenerationInputError
from .chat_template import template_args as drafter_template_args


def encode_prompt(tokenizer, text: str, chat: bool = True, template_args: dict | None = None) -> list[int]:
    """Prompt ids for a user message; chat models get their chat template with the assistant turn open.

    template_args: extra keyword arguments for the template, e.g. `{"enable_thinking": True}`;
    None means what the released drafters were trained with (`chat_template.template_args`: thinking
    off where the template has that switch), `{}` the template's own defaults.
    """
    if tokenizer is None:
        raise GenerationInputError("this target has no tokenizer: pass prompt token ids instead of text")
    if not text or not text.strip():
        raise GenerationInputError("the prompt is empty: type a message")
    if chat and getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, [{"role": "user", "content": text}], template_args)
    return tokenizer.encode(text, add_special_tokens=False)


def encode_chat(tokenizer, messages: list[dict], template_args: dict | None = None) -> list[int]:
    """Prompt ids for a conversation (`{"role", "content"}` dicts, the last one the user's) through
    the chat template, the assistant turn open; `template_args` as in `encode_prompt`."""
    if template_args is None:
        template_args = drafter_template_args(tokenizer)
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **(template_args or {}),
    )
    return list(ids)


class IncrementalDecoder:
    """Turns a growing list of token ids into newly printable text pieces."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, ids) -> str:
        """Add `ids`; return the text they complete (may be empty while a character is split)."""
        self.ids.extend(int(i) for i in ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        if text.endswith("\ufffd"):
            return ""
        new, self.text = text[len(self.text) :], text
        return new
