"""Chat template arguments: how a user message is wrapped for a pair, and a name for what was used.

Qwen3's chat template thinks by default (`enable_thinking` true): the answer opens with a
`<think>` section. The released z-lab Qwen3 DFlash drafters were trained on non-thinking chat, so
with thinking on acceptance collapses (users of the reference report about 25% instead of 60%)
and the output fills with thinking text. A pair therefore carries the template arguments its
drafter was trained with (`app/serve/pairs.json`), and the CLI and the benchmark take `--thinking on|off`;
without either, thinking is off wherever the template has the switch, as the first released DFlash
drafters (Qwen3, Llama-3.1) were trained that way; the Qwen3.5/3.6 pairs in `app/serve/pairs.json` turn it
on, as z-lab's README runs those drafters. Templates without the switch (SmolLM2's ChatML) get no
arguments.
"""

from __future__ import annotations

from .errors import GenerationInputError

THINKING_CHOICES = ("on", "off")
# What the released DFlash drafters were trained with (non-thinking chat).
DRAFTER_TRAINED_ARGS = {"enable_thinking": False}


def has_thinking_switch(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads `enable_thinking` (Qwen3 and its relatives)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates
        template = " ".join(str(t) for t in template.values())
    return "enable_thinking" in str(template)


def template_args(tokenizer, thinking: str | None = None, trained: dict | None = None) -> dict:
    """Keyword arguments for `apply_chat_template`.

    thinking: "on" or "off" as the user asked, or None for `trained` (the pair's own arguments;
    None means `DRAFTER_TRAINED_ARGS`). `enable_thinking` is dropped where the template has no
    such switch, and asking for it there is an error naming the choice.
    """
    args = dict(DRAFTER_TRAINED_ARGS if trained is None else trained)
    switch = has_thinking_switch(tokenizer)
    if thinking is not None:
        if thinking not in THINKING_CHOICES:
            raise GenerationInputError(f"thinking must be one of {THINKING_CHOICES}, got {thinking!r}")
        if not switch:
            raise GenerationInputError(
                f"thinking {thinking!r} was asked for, but this target's chat template has no enable_thinking switch"
            )
        args["enable_thinking"] = thinking == "on"
    elif not switch:
        args.pop("enable_thinking", None)
    return args


def describe_template(tokenizer, args: dict, chat: bool = True) -> str:
    """The template a prompt went through, in words (status line, benchmark JSON)."""
    if tokenizer is None or not chat or not getattr(tokenizer, "chat_template", None):
        return "no chat template (raw text)"
    words = "the target's chat template"
    if "enable_thinking" in args:
        words += f", thinking {'on' if args['enable_thinking'] else 'off'} (enable_thinking={args['enable_thinking']})"
    others = {k: v for k, v in args.items() if k != "enable_thinking"}
    if others:
        words += ", " + ", ".join(f"{k}={v!r}" for k, v in sorted(others.items()))
    return words
