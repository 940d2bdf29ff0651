"""The chat template check: tau with thinking on and off, where the template has the switch.

Qwen3-style templates open the answer with a `<think>` section unless `enable_thinking` is false. A
drafter trained on one setting accepts far less under the other (z-lab/dflash issue 60: tau 2.7-3.9
and 0.26-0.36x speed with the wrong one), and the output stays correct, so nothing else shows it.
"""

from __future__ import annotations

from .measure import clearly_better
from .report import Check

TEXT = (
    "The chat template wraps a message before the model sees it. Some templates have a thinking switch: "
    "with it on, the model first writes its reasoning in a <think> section. A drafter learns to guess "
    "the text it was trained on, so one trained without thinking guesses a thinking answer badly, and "
    "the reverse. The check measures tau with the switch on and off: the setting with clearly more "
    "acceptance is the one the drafter was trained with."
)


def template_check(used: str, taus: dict[str, float]) -> Check:
    """used: "on" or "off", the setting the pair decodes with; taus: tau by setting, both measured."""
    other = "off" if used == "on" else "on"
    summary = f"tau {taus['off']:.2f} thinking off, {taus['on']:.2f} thinking on; this pair uses {used}"
    numbers = {"used": used, "tau_thinking_off": taus["off"], "tau_thinking_on": taus["on"]}
    if clearly_better(taus[other], taus[used]):
        return Check("template", "chat template (thinking)", "FAIL",
                     summary + f": the drafter was trained with thinking {other}", TEXT,
                     f"wrong thinking setting: the drafter was trained with thinking {other}", numbers)
    if clearly_better(taus[used], taus[other]):
        summary += f": the drafter was trained with thinking {used}, as used"
    return Check("template", "chat template (thinking)", "PASS", summary, TEXT, numbers=numbers)
