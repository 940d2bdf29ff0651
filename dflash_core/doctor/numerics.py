"""Numerics checks: a drafter or LM head that was quantized, and what the drafter's dtype costs.

Quantized drafters (or draft KV caches) are a known way to lose nearly all acceptance (SGLang
39087, vLLM 53116 / 51581, llama.cpp 25725) while the output stays correct. DFlash2 picks its
candidates from the top-k of the LM head, so it needs a head that was never quantized.
"""

from __future__ import annotations

from .measure import clearly_better
from .report import Check

QUANT_TEXT = (
    "Quantizing stores each weight with fewer bits (8 or 4, or an 8-bit float) to save memory. The "
    "target's verification keeps the output correct either way, but a drafter is small and sensitive: "
    "quantized, its guesses drift from what the target would say, and acceptance can fall to almost "
    "nothing. The check reads the formats the drafter's files store quantized (a quantization_config, "
    "fp8 or int8 weights with their scales, GPTQ / AWQ packed weights), and looks for the tell-tale grid "
    "such weights keep even after being cast back to bf16 or float32. Quantization a server applies when "
    "it loads the drafter (vLLM's --quantization, say) is in none of the files, so this check cannot see "
    "it: the server checks, which compare the server's acceptance with this engine's, are what catch it. "
    "The LM head turns the drafter's last hidden state into token scores; DFlash2 picks its candidates "
    "from that head's top scores, so it needs the head unquantized."
)


def quantized_check(drafter_grids: dict[str, str], head_grid: str | None, *, head_is_targets: bool,
                    dflash2: bool, stored: dict[str, str] | None = None) -> Check:
    """drafter_grids: the drafter's own quantized tensors (name -> grid, `quantization.quantized_tensors`);
    head_grid: the grid of the head rows it drafts with; head_is_targets: those rows are the target's
    own, which verifies with the same values; stored: the formats its files store quantized (name ->
    format, `formats.stored_formats`; "config.json" for its quantization_config)."""
    stored = stored or {}
    numbers = {"drafter_stored_quantized": stored, "drafter_tensors_quantized": drafter_grids, "head": head_grid,
               "dflash2": dflash2}
    title = "quantized weights"
    if stored:
        weights = [name for name in stored if name != "config.json"]
        example = f" ({len(weights)} weights, e.g. {weights[0]})" if weights else ""
        kinds = list(dict.fromkeys(stored.values()))
        more = f"; {len(kinds) - 2} more" if len(kinds) > 2 else ""
        return Check("numerics.quantized", title, "FAIL",
                     f"the drafter's files store it quantized: {'; '.join(kinds[:2])}{more}{example}",
                     QUANT_TEXT, "quantized drafter weights", numbers)
    if drafter_grids:
        kinds = sorted(set(drafter_grids.values()))
        return Check("numerics.quantized", title, "FAIL",
                     f"{len(drafter_grids)} drafter tensors lie on a quantization grid ({', '.join(kinds)}), "
                     f"e.g. {next(iter(drafter_grids))}", QUANT_TEXT, "quantized drafter weights", numbers)
    if head_grid is not None:
        where = "the target's own head" if head_is_targets else "the drafter's copy of the head rows"
        summary = f"drafter layers unquantized; the head rows it drafts with are {head_grid} ({where})"
        if dflash2:
            return Check("numerics.quantized", title, "FAIL", summary + ": DFlash2 needs an unquantized head",
                         QUANT_TEXT, "quantized LM head under a DFlash2 drafter", numbers)
        if not head_is_targets:
            return Check("numerics.quantized", title, "WARN", summary + ": servers that draft with this copy "
                         "score drafts differently from the target", QUANT_TEXT, "quantized copy of the head rows",
                         numbers)
        return Check("numerics.quantized", title, "PASS", summary + ", the same rows the target verifies with",
                     QUANT_TEXT, numbers=numbers)
    return Check("numerics.quantized", title, "PASS", "no drafter tensor or head row lies on a quantization grid",
                 QUANT_TEXT, numbers=numbers)


DTYPE_TEXT = (
    "The drafter usually runs in bf16 (half the memory traffic of float32). Lower precision changes its "
    "scores slightly; that should cost little acceptance. The check runs the same drafter in float32 on "
    "the same prompts: if float32 accepts clearly more, the drafter's precision is what costs tau."
)


def dtype_check(dtype: str, tau: float, tau_float32: float | None) -> Check:
    """tau at the drafter's run dtype against tau with the same drafter in float32 (None: it runs in float32)."""
    numbers = {"drafter_dtype": dtype, "tau": tau, "tau_float32": tau_float32}
    title = "drafter dtype vs float32"
    if tau_float32 is None:
        return Check("numerics.dtype", title, "PASS", f"the drafter runs in float32 (tau {tau:.2f})", DTYPE_TEXT,
                     numbers=numbers)
    summary = f"tau {tau:.2f} in {dtype}, {tau_float32:.2f} in float32"
    if clearly_better(tau_float32, tau):
        return Check("numerics.dtype", title, "FAIL", summary, DTYPE_TEXT, f"{dtype} drafter numerics", numbers)
    if tau_float32 - tau >= 0.15:
        return Check("numerics.dtype", title, "WARN", summary, DTYPE_TEXT, f"{dtype} costs some acceptance", numbers)
    return Check("numerics.dtype", title, "PASS", summary, DTYPE_TEXT, numbers=numbers)
