"""Checks against a vLLM server: its block, its tau on the same prompt ids, and its outputs.

The server is asked through `vllm_client.complete` (greedy chat completions with vLLM's
per-request speculative-decoding record); this engine then decodes the very prompt ids the
server's chat template made, so both sides see the same input. A server far below this engine on
the same drafter points at the server (its wiring, numerics or version), not at the drafter.
"""

from __future__ import annotations

from .measure import clearly_better
from .report import Check

BLOCK_TEXT = (
    "A DFlash drafter is trained to fill a block of a fixed size. A server is told how many drafts to "
    "make per cycle (vLLM's num_speculative_tokens, K), and the block it drafts is K + 1. More slots "
    "than the drafter was trained for are untrained guesses; fewer cap tau below what the drafter can "
    "do. Servers accept either without an error, so a mismatch runs silently slower."
)


def block_size_check(k: int | None, block_size: int) -> Check:
    numbers = {"num_speculative_tokens": k, "drafter_block_size": block_size}
    title = "server block size"
    if k is None:
        return Check("server.block_size", title, "SKIP", "the server reported no speculative-decoding record "
                     "(start it with --per-request-spec-decode-metrics detailed)", BLOCK_TEXT, numbers=numbers)
    summary = f"num_speculative_tokens {k} (block {k + 1}); the drafter was trained for block {block_size}"
    if k + 1 > block_size:
        cause = f"server block {k + 1} larger than the drafter's {block_size} (K should be {block_size - 1})"
        return Check("server.block_size", title, "FAIL", summary + f": slots past {block_size} are untrained",
                     BLOCK_TEXT, cause, numbers)
    if k + 1 < block_size:
        cause = f"server block {k + 1} smaller than the drafter's {block_size} (K should be {block_size - 1})"
        return Check("server.block_size", title, "WARN", summary + f": tau cannot exceed {k + 1}", BLOCK_TEXT, cause,
                     numbers)
    return Check("server.block_size", title, "PASS", summary, BLOCK_TEXT, numbers=numbers)


TAU_TEXT = (
    "The same prompts go to the server and to this engine, with the same drafter at the same block "
    "size. Both verify greedily, so both should accept about as often. If the server accepts clearly "
    "less, the drafter is fine and the server reads it differently (layer ids, RoPE, dtype, a bug)."
)


def server_tau_check(server_tau: float | None, engine_tau: float, block_size: int) -> Check:
    numbers = {"server_tau": server_tau, "engine_tau": engine_tau, "block_size": block_size}
    title = "server tau vs this engine"
    if server_tau is None:
        return Check("server.tau", title, "SKIP", "the server reported no per-request acceptance "
                     "(start it with --per-request-spec-decode-metrics detailed)", TAU_TEXT, numbers=numbers)
    summary = f"server tau {server_tau:.2f}, this engine {engine_tau:.2f} on the same prompt ids at block {block_size}"
    if clearly_better(engine_tau, server_tau):
        return Check("server.tau", title, "FAIL", summary + ": the server accepts clearly less with the same drafter",
                     TAU_TEXT, "the server, not the drafter: it accepts far less than this engine", numbers)
    return Check("server.tau", title, "PASS", summary, TAU_TEXT, numbers=numbers)


OUTPUT_TEXT = (
    "At temperature 0 speculative decoding must give exactly the target's own greedy answer, drafter or "
    "not. The check compares the server's answers with this engine's plain decoding of the same prompt "
    "ids. A difference where the target's top two scores are within rounding (a near-tie) is low "
    "precision, not a bug; anywhere else the server is not lossless."
)


def server_outputs_check(verdicts: dict[str, object]) -> Check:
    """verdicts: prompt id -> `lossless.Verdict` of the server's output against plain decoding."""
    kinds = {pid: v.kind for pid, v in verdicts.items()}
    numbers = {"verdicts": {pid: v.to_dict() for pid, v in verdicts.items()}}
    same = sum(k == "identical" for k in kinds.values())
    summary = f"{same}/{len(kinds)} outputs identical to this engine's plain decoding"
    title = "server outputs vs plain decoding"
    diverged = [pid for pid, k in kinds.items() if k == "diverged"]
    if diverged:
        first = verdicts[diverged[0]]
        return Check("server.outputs", title, "FAIL", summary + f"; {diverged[0]} {first.message()}", OUTPUT_TEXT,
                     "the server's output differs from the target's greedy answer", numbers)
    ties = [pid for pid, k in kinds.items() if k == "near_tie"]
    if ties:
        return Check("server.outputs", title, "WARN", summary + f"; {len(ties)} part at a near-tie ({ties[0]})",
                     OUTPUT_TEXT, "outputs part at near-ties (low precision)", numbers)
    return Check("server.outputs", title, "PASS", summary, OUTPUT_TEXT, numbers=numbers)


PROMPT_TEXT = (
    "The server builds the prompt with its own copy of the chat template. If it makes other token ids "
    "than this engine for the same message (another template, or the thinking switch left at its "
    "default), the two sides are not decoding the same input."
)


def server_prompt_check(mismatched: list[str], total: int) -> Check:
    numbers = {"prompts": total, "different_prompt_ids": mismatched}
    if mismatched:
        return Check("server.prompt_ids", "server chat template", "WARN",
                     f"{len(mismatched)}/{total} prompts get other token ids from the server's template "
                     f"(e.g. {mismatched[0]}); compared on the server's ids", PROMPT_TEXT,
                     "the server's chat template differs", numbers)
    return Check("server.prompt_ids", "server chat template", "PASS",
                 f"{total}/{total} prompts get the same token ids from the server's template", PROMPT_TEXT,
                 numbers=numbers)
