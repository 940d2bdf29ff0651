"""The numbers a finished race reports: speedup, tau, tokens/s, TTFT and the lossless check.

Times are each side's own compute clock (see `race.py`), so the speedup is the one a benchmark
running the two decoders separately would measure.
"""

from __future__ import annotations

from dflash_core import Summary
from dflash_core.lossless import Verdict, first_difference

__all__ = ["first_difference", "race_report", "seconds_per_token"]


def seconds_per_token(summary: Summary) -> float:
    return summary.total_s / len(summary.output_ids) if summary.output_ids else 0.0


def race_report(
    dflash: Summary, plain: Summary, temperature: float, block_size: int, verdict: Verdict | None = None,
    stopped: bool = False,
) -> dict:
    """The JSON summary of a race (also the last update of the `compare` API).

    verdict: the engine's lossless check of a greedy race (`dflash_core.lossless.compare`).
    stopped: the race was cut short, so the outputs are prefixes; they are compared for the
    lossless check only when both sides reached the same length.
    """
    d_spt, p_spt = seconds_per_token(dflash), seconds_per_token(plain)
    # Only greedy decoding must give the same tokens; sampled runs legitimately differ.
    checked = temperature == 0.0 and not (stopped and len(dflash.output_ids) != len(plain.output_ids))
    diff = first_difference(dflash.output_ids, plain.output_ids)
    return {
        "stopped": stopped,
        "tau": round(dflash.tau, 4),
        "speedup": round(p_spt / d_spt, 4) if d_spt > 0 else 0.0,
        "identical": (diff is None) if checked else None,
        "first_difference": diff if checked else None,
        # identical / near_tie (rounding of a tie, with where and by how much) / diverged (a bug)
        "lossless": verdict.to_dict() if checked and verdict is not None else None,
        "dflash_tok_s": round(dflash.tokens_per_s, 3),
        "plain_tok_s": round(plain.tokens_per_s, 3),
        "dflash_ttft_s": round(dflash.ttft_s, 4),
        "plain_ttft_s": round(plain.ttft_s, 4),
        "dflash_tokens": len(dflash.output_ids),
        "plain_tokens": len(plain.output_ids),
        "dflash_s": round(dflash.total_s, 4),
        "plain_s": round(plain.total_s, 4),
        "cycles": len(dflash.blocks),
        "block_size": block_size,
        "temperature": temperature,
        "acceptance_histogram": dflash.acceptance_histogram,
        "per_position_acceptance": [round(x, 4) for x in dflash.per_position_acceptance],
    }

