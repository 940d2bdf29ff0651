"""Chat template arguments: how a user message is wrapped for a pair, and a name for what was used.

Qwen3's chat template thinks by default (`enable_thinking` true): the answer opens with a
`<think>` section. The released z-lab Qwen3 DFlash drafters were trained on non-thinking chat, so
with thinking on acceptance collapses (users of the reference report about 25% instead of 60%)
and the output fills with thinking text. A pair therefore carries the template arguments its
drafter was trained with (`app/pairs/pairs.json`), and the CLI and the benchmark take `--thinking on|off`;
without either, thinking is off wherever the template has the switch, as the first released DFlash
drafters (Qwen3, Llama-3.1) were trained that way; the Qwen3.5/3.6 pairs in `app/pairs/pairs.json` turn it
on, as z-lab's README runs those drafters. Templates without the switch (SmolLM2's ChatML) get no
arguments. Templates that take a reasoning level instead (`reasoning_effort`, `reasoning_strength`)
get it from the benchmark's `--thinking LEVEL` (`reasoning_args`).
"""

from __future__ import annotations

from ..errors import GenerationInputError

THINKING_CHOICES = ("on", "off")
# What the released DFlash drafters were trained with (non-thinking chat).
DRAFTER_TRAINED_ARGS = {"enable_thinking": False}
# Template variables that take a reasoning level ("low", "high", ...) instead of an on/off switch,
# in the order the reference benchmark (`dflash` 0.1.0) looks for them.
LEVEL_KEYS = ("reasoning_strength", "reasoning_effort")


def _template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates
        template = " ".join(str(t) for t in template.values())
    return str(template)


def has_thinking_switch(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads `enable_thinking` (Qwen3 and its relatives)."""
    return "enable_thinking" in _template_text(tokenizer)


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


def reasoning_args(tokenizer, reasoning: str | None = None, trained: dict | None = None) -> dict:
    """`template_args` for `--thinking VALUE`, where VALUE may also be a reasoning level.

    "on", "off" and None go to `template_args`. Any other word is a level for the template's
    `reasoning_strength` or `reasoning_effort` (the first one its text reads), passed alone, as
    the reference benchmark passes it; a template that reads neither is an error naming what it has.
    """
    if reasoning is None or reasoning in THINKING_CHOICES:
        return template_args(tokenizer, reasoning, trained)
    text = _template_text(tokenizer)
    key = next((k for k in LEVEL_KEYS if k in text), None)
    if key is None:
        has = "only the enable_thinking switch (on or off)" if has_thinking_switch(tokenizer) else "no reasoning switch"
        raise GenerationInputError(
            f"reasoning level {reasoning!r} was asked for, but this target's chat template reads neither "
            f"{' nor '.join(LEVEL_KEYS)}: it has {has}"
        )
    return {key: reasoning}


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
