"""The thinking switch of a race: the visitor's choice, checked, and what it makes of a pair's prompt.

A Qwen3-style chat template reads `enable_thinking`: on, the answer opens with a `<think>` section;
off, with an empty one. A drafter is trained on one of the two (the pair's `chat_template_args` in
`app/pairs/pairs.json`, with their source there) and guesses the other badly: the race stays
lossless, but fewer drafts are accepted. The visitor may race either setting; every lane then
decodes the same prompt ids, so the race stays fair. Templates without the switch (SmolLM2's)
refuse a forced setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_core.errors import GenerationInputError
from dflash_core.loading import THINKING_CHOICES, has_thinking_switch, template_args

DEFAULT = "default"  # the pair's own arguments: what its drafter was trained with, where recorded
CHOICES = (DEFAULT, *THINKING_CHOICES)
NO_SWITCH = (
    "{label}: its chat template has no thinking switch (enable_thinking), so a race on it cannot turn "
    "thinking {choice}; leave thinking at the pair's default."
)
DIFFERS = "acceptance drops when the template differs from training"


def check_thinking(value) -> str | None:
    """The visitor's choice as `chat_template.template_args` takes it: "on", "off", or None for the
    pair's default (None, "" and "default"); GenerationInputError naming any other value."""
    if value is None or value == "" or value == DEFAULT:
        return None
    if isinstance(value, str) and value in THINKING_CHOICES:
        return value
    shown = str(value)[:40] if isinstance(value, str) else type(value).__name__
    raise GenerationInputError(f"thinking must be one of {', '.join(CHOICES)}, got {shown!r}.")


@dataclass(frozen=True)
class Thinking:
    """The thinking setting of a race's prompt.

    used: "on" or "off" as the prompt went through the template; None where it has no switch.
    trained: what the drafter was trained with; None where nothing records it.
    args: the `apply_chat_template` arguments that give `used`.
    """

    used: str | None
    trained: str | None
    args: dict = field(default_factory=dict)

    @property
    def differs(self) -> bool:
        return self.used is not None and self.trained is not None and self.used != self.trained

    def trained_words(self) -> str:
        """What the drafter was trained with, with a warning where the race uses the other setting."""
        if self.used is None:
            return "the chat template has no thinking switch"
        if self.trained is None:
            return "the drafter's thinking setting is not recorded"
        if self.differs:
            return f"⚠ the drafter was trained with thinking {self.trained}: {DIFFERS}"
        return f"the drafter was trained with thinking {self.trained}"

    def words(self) -> str:
        """The setting used and the trained one, in words (a replay's note)."""
        if self.used is None:
            return self.trained_words()
        return f"thinking {self.used}; {self.trained_words()}"


def recorded_thinking(trace: dict) -> Thinking | None:
    """The thinking setting a trace records (`settings.thinking`, `pair.trained_thinking`, both checked
    by `validate_trace`); None where the race's template had no switch, or the trace records no
    settings (a vLLM pair's race: its servers applied the template)."""
    used = trace.get("settings", {}).get("thinking")
    return None if used is None else Thinking(used, trace["pair"].get("trained_thinking"))


def thinking_of(args: dict | None) -> str | None:
    """ "on" / "off" as template arguments set `enable_thinking`; None where they leave it out."""
    if not args or "enable_thinking" not in args:
        return None
    return "on" if args["enable_thinking"] else "off"


def race_thinking(tokenizer, choice: str | None, trained_args: dict | None, label: str) -> Thinking:
    """The thinking setting of a race on a pair: `choice` ("on", "off", None for the pair's default)
    through the target's template, beside `trained_args` (the pair's `chat_template_args`; None: not
    recorded, and the engine's default applies). GenerationInputError where the template has no
    switch and `choice` forces one."""
    switch = has_thinking_switch(tokenizer)
    if choice is not None and not switch:
        raise GenerationInputError(NO_SWITCH.format(label=label, choice=choice))
    args = template_args(tokenizer, choice, trained_args)
    if not switch:
        return Thinking(None, None, args)
    used = thinking_of(args) or _template_default(tokenizer)
    return Thinking(used, thinking_of(trained_args), args)


def _template_default(tokenizer) -> str | None:
    """Whether the template thinks when `enable_thinking` is not given: its text for a message
    compared with the text of each setting (None where it matches neither)."""
    messages = [{"role": "user", "content": "Hi"}]

    def text(**kwargs) -> str:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)

    plain = text()
    return next((word for word in THINKING_CHOICES if text(enable_thinking=word == "on") == plain), None)
