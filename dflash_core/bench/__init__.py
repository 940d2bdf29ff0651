"""Benchmarks: `python -m dflash_core.bench` races DFlash against plain decoding and its peers on
the prompt sets (`run.py`), or on the reference benchmark's datasets with `--dataset`
(`paper_table.py`, `datasets.py`); a first word picks one of the other measurements instead.

    python -m dflash_core.bench [options]              the main benchmark
    python -m dflash_core.bench SUBCOMMAND [options]   one of SUBCOMMANDS; --help lists its options
"""

# Subcommand -> (module in this package, what it measures).
SUBCOMMANDS = {
    "cycle": ("cycle", "one cycle's draft / verify / bookkeeping against one plain step"),
    "explain-cost": ("explain_cost", "what the cycle explanation (explain=K) costs per cycle"),
    "drafter-costs": ("drafter_costs", "training throughput and per-cycle costs per drafter shape"),
    "linear-rows": ("linear_rows", "every linear layer of the target at a few row counts: oneDNN, MKL and the rows kernel"),
    "row-invariance": ("row_invariance", "whether the packed linear kernel computes a block's rows as rows alone"),
}
