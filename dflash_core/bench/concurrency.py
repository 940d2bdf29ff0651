"""`python -m dflash_core.bench --peer vllm --concurrency 1,2,4,8,16,32`: vLLM plain against vLLM DFlash
across concurrency (`dflash_core/vllm/sweep.py`), printed as a markdown table and a JSON line.

The servers are given by `--vllm-url` (default: the DFlash server of `scripts/serve_vllm.sh`) and
`--vllm-plain-url` (default: the next port). The JSON (also written to `--json PATH`) records the
settings, the servers, the CPU's vector extensions and the load average after each level, beside
every level's figures.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from ..vllm.sweep import (
    NATURAL,
    Bounds,
    Level,
    check_servers,
    check_settings,
    natural_prompts,
    stops_paying,
    sweep,
    uneven_levels,
)


def cpu_class() -> str:
    """The CPU's vector extensions that decide its kernels (the docs' `grep -o -w` line)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags) or "none of avx2/avx512"


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown_table(levels: list[Level]) -> str:
    """The sweep as a markdown table, one row per level."""
    head = ("| concurrency | requests | plain tok/s | DFlash tok/s | speedup | plain latency mean / p90 (s) "
            "| DFlash latency mean / p90 (s) | acceptance length | DFlash = plain |")
    lines = [head, "| --- " * 9 + "|"]
    for lv in levels:
        p, d = lv.plain, lv.dflash
        if p is None or d is None:
            lines.append(f"| {lv.level} | {lv.note} | | | | | | | |")
            continue
        same, compared = lv.identical
        lines.append(
            f"| {lv.level} | {d.requests} | {p.tok_s:.1f} | {d.tok_s:.1f} | {_cell(lv.speedup, '.2f')}x "
            f"| {_cell(p.mean_latency_s, '.1f')} / {_cell(p.p90_latency_s, '.1f')} "
            f"| {_cell(d.mean_latency_s, '.1f')} / {_cell(d.p90_latency_s, '.1f')} "
            f"| {_cell(d.acceptance_length, '.2f')} | {same}/{compared} |" + (f" {lv.note}" if lv.note else ""))
    return "\n".join(lines)


def add_sweep_args(parser) -> None:
    """The options of `--concurrency` on the benchmark's command line."""
    group = parser.add_argument_group("throughput across concurrency (with --peer vllm)")
    group.add_argument("--concurrency", metavar="LIST",
                       help=f"levels of simultaneous requests, e.g. 1,2,4,8,16,32 (at most {Bounds.max_levels} "
                            f"levels, each 1 to {Bounds.max_level}): vLLM plain against vLLM DFlash, servers given "
                            "by --vllm-url")
    group.add_argument("--vllm-url", default="http://127.0.0.1:8765",
                       help="the vLLM DFlash server (default: scripts/serve_vllm.sh's)")
    group.add_argument("--vllm-plain-url", help="the plain vLLM server (default: --vllm-url's port + 1)")
    group.add_argument("--rounds", type=int, default=4,
                       help="requests each simultaneous client sends one after another, per level (default 4)")
    group.add_argument("--one-at-a-time", action="store_true",
                       help="at each level, DFlash's requests and then plain's (default: both at once; for servers "
                            "that share cores or a GPU)")
    group.add_argument("--max-seconds", type=float, default=900.0,
                       help="time budget of the whole sweep; later levels are reported unrun (default 900)")
    group.add_argument("--json", metavar="PATH", help="also write the sweep's JSON here")


def run_cli(args) -> int:
    """The benchmark's `--concurrency` mode: sweep, print the table and the JSON line, write `--json`."""
    settings = check_settings(args.concurrency, args.max_new_tokens, args.rounds, args.max_seconds,
                              together=not args.one_at_a_time)
    dflash, plain, k = check_servers(args.vllm_url, args.vllm_plain_url)
    prompts = natural_prompts(args.num_prompts, args.prompts)
    print(f"DFlash (K = {k}) at {dflash.url}, plain at {plain.url}, model {dflash.name}; {len(prompts)} prompts, "
          f"{settings.max_new_tokens} new tokens, {settings.rounds} requests per client, "
          f"{'both servers at once' if settings.together else 'one server at a time'}; levels "
          f"{','.join(map(str, settings.levels))}", flush=True)
    uneven = uneven_levels(settings, len(prompts))
    if uneven:
        print(f"note: at levels {','.join(map(str, uneven))}, {settings.rounds} requests per client send the "
              f"{len(prompts)} prompts unequally often: their figures are over another mix of prompts "
              "(pick --num-prompts dividing level x --rounds)", flush=True)
    started, load_before = time.strftime("%Y-%m-%dT%H:%M:%S%z"), os.getloadavg()
    levels, loads = [], []
    for lv in sweep(dflash, plain, settings, prompts):
        levels.append(lv)
        loads.append(os.getloadavg()[0])
        tail = f"{lv.speedup:.2f}x" if lv.speedup is not None else lv.note
        print(f"  level {lv.level}: {tail} (1-minute load average {loads[-1]:.2f})", flush=True)
    result = {
        "started": started, "servers": {"dflash": dflash.url, "plain": plain.url}, "model": dflash.name,
        "num_speculative_tokens": k, "prompts": len(prompts), "prompt_file": str(args.prompts or NATURAL.name),
        **asdict(settings), "cpu_flags": cpu_class(), "cpus": os.cpu_count(),
        "load_average_before": load_before, "load_average_after_each_level": loads,
        "uneven_prompt_mix": uneven, "stops_paying_at": stops_paying(levels), "levels": [lv.to_dict() for lv in levels],
    }
    print(markdown_table(levels))
    where = result["stops_paying_at"]
    print(f"speculation stops paying at concurrency {where}" if where else "DFlash still pays at the highest level")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0
