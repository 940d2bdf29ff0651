"""What the doctor decodes: its prompts, acceptance measured over them, and probe variants of a drafter.

Every figure is greedy decoding of the same prompt ids: the output is the target's own whatever
the drafter does, so two measurements differ only in how many drafts the target accepted. tau is
pooled over all cycles of all prompts (accepted drafts + 1 per cycle), as the benchmark pools it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from ..decoding import generate
from ..errors import GenerationInputError
from ..models.drafter import DFlashDrafter

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "assets" / "prompts"
# Two taus differ "clearly" when the better one is at least this much higher and keeps at least
# this many times the other's gain over plain decoding (tau - 1). A few hundred cycles measure tau
# to about 0.05, so a clear difference is a cause, not noise.
CLEAR_MARGIN = 0.3
CLEAR_RATIO = 1.5


@dataclass(frozen=True)
class DoctorPrompt:
    """A prompt by id: user text (put through the chat template) or token ids as given."""

    id: str
    text: str | None = None
    ids: tuple[int, ...] | None = None


def read_prompts(path: str | Path, limit: int | None = None) -> list[DoctorPrompt]:
    """JSON lines with "prompt" (text) or "prompt_ids" (token ids), and optionally "id"; with
    `limit`, that many spread over the file, as the benchmark picks them."""
    path = Path(path)
    if not path.is_file():
        raise GenerationInputError(f"prompt file not found: {path}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    prompts = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not (row.get("prompt") or row.get("prompt_ids")):
            raise GenerationInputError(f"{path} line {i + 1}: expected an object with \"prompt\" or \"prompt_ids\"")
        ids = row.get("prompt_ids")
        prompts.append(DoctorPrompt(str(row.get("id", f"{path.stem}:{i + 1}")), row.get("prompt"),
                                    None if ids is None else tuple(int(t) for t in ids)))
    if limit is not None and limit < len(prompts):
        prompts = prompts[:: max(1, len(prompts) // limit)][:limit]
    return prompts


def prompt_set_path(name: str) -> Path:
    """assets/prompts/<name>.jsonl for a set name (natural, heldout, ...), else `name` as a path."""
    path = PROMPTS_DIR / f"{name}.jsonl"
    return path if path.is_file() else Path(name)


@dataclass(frozen=True)
class Measurement:
    """Greedy decoding of a list of prompts with one drafter at one block size."""

    block_size: int
    cycles: int
    accepted: int  # draft tokens accepted over all cycles
    per_slot: tuple[float, ...]  # share of cycles whose draft slot k (1..B-1) was accepted
    outputs: tuple[tuple[int, ...], ...]
    taus: tuple[float, ...]  # per prompt

    @property
    def tau(self) -> float:
        return 1 + self.accepted / self.cycles if self.cycles else 1.0

    def to_dict(self) -> dict:
        return {"tau": round(self.tau, 3), "cycles": self.cycles, "block_size": self.block_size,
                "per_slot": [round(p, 3) for p in self.per_slot], "per_prompt_tau": [round(t, 3) for t in self.taus]}


def measure(target, drafter, prompts: list[list[int]], max_new_tokens: int, block_size: int | None = None,
            stop_ids=(), checkpoint=None) -> Measurement:
    """Decode every prompt greedily with `drafter` (None: plain decoding) and pool the acceptance.
    checkpoint: called after every decoding cycle; it may raise to end the measurement there."""
    summaries = [_decode(target, ids, drafter, max_new_tokens, block_size, stop_ids, checkpoint) for ids in prompts]
    blocks = [b for s in summaries for b in s.blocks]
    size = summaries[0].block_size if summaries else (block_size or 1)
    per_slot = tuple(sum(b.accepted >= k for b in blocks) / len(blocks) if blocks else 0.0 for k in range(1, size))
    return Measurement(size, len(blocks), sum(b.accepted for b in blocks), per_slot,
                       tuple(s.output_ids for s in summaries), tuple(s.tau for s in summaries))


def _decode(target, prompt_ids, drafter, max_new_tokens, block_size, stop_ids, checkpoint):
    for event in generate(target, prompt_ids, drafter, max_new_tokens=max_new_tokens, block_size=block_size,
                          stop_ids=stop_ids):
        if checkpoint is not None:
            checkpoint()
    return event


def clearly_better(a: float, b: float) -> bool:
    """Whether tau `a` is clearly above tau `b` (see CLEAR_MARGIN, CLEAR_RATIO)."""
    return a - b >= CLEAR_MARGIN and (a - 1) >= CLEAR_RATIO * max(b - 1, 0.0)


def variant(drafter: DFlashDrafter, *, target_layer_ids=None, rope_parameters=None,
            mask_token_id: int | None = None) -> DFlashDrafter:
    """The same drafter (shared weights) reading other target layers, rotating by other RoPE
    parameters or filling its block with another mask token, for a probe; `drafter` itself is left
    as it is."""
    probe = copy.copy(drafter)
    probe._modules = dict(drafter._modules)  # its own module table: replacing `rotary` must not reach the original
    probe.config = copy.deepcopy(drafter.config)
    if target_layer_ids is not None:
        probe.config.target_layer_ids = [int(i) for i in target_layer_ids]
    if mask_token_id is not None:
        probe.config.mask_token_id = int(mask_token_id)
    if rope_parameters is not None:
        probe.config.rope_parameters = dict(rope_parameters)
        probe.rotary = Qwen3RotaryEmbedding(probe.config).to(drafter.fc.weight.device)
    return probe
