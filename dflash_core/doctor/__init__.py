"""The acceptance doctor: when a pair accepts less than it should, say why.

`python -m dflash_core doctor --target T --drafter D [--server URL]` (`cli.py`) runs `diagnose`
(`diagnose.py`), which returns a `Report` of typed `Check`s (`report.py`), each PASS / WARN / FAIL
/ SKIP with its numbers, the cause it names, and an explanation in plain words:

- measured acceptance (tau, per slot) against the drafter card's figure (`acceptance.py`);
- tau with thinking on and off where the chat template has the switch (`template.py`);
- quantized drafter or head weights, and the drafter's dtype against float32 (`numerics.py`,
  `quantization.py`: grids of weights cast back; `formats.py`: formats the files store quantized);
- target_layer_ids against the target's depth and probed one layer off, RoPE settings in both
  config fields, the mask token, the draft vocabulary map (`wiring.py`);
- against a vLLM server: its block, its tau and its outputs on the same prompt ids (`server.py`).

Decoding for the checks is in `measure.py`. docs/doctor.md shows a run on the shipped pair.
"""

from .diagnose import DoctorSettings, default_prompts, diagnose
from .measure import DoctorPrompt, Measurement, read_prompts
from .report import Check, Report, Status

__all__ = ["Check", "DoctorPrompt", "DoctorSettings", "Measurement", "Report", "Status", "default_prompts", "diagnose",
           "read_prompts"]
