"""Compile the app's first compiled step (the plain lane's one-token verify) on the default pair as
the app loads it (dtype `auto`), 1 thread, with inductor's cache as it is; run under
`TORCH_LOGS=trace_source` and feed the log to `by_source.py` (README.md).
"""
import time

import torch

from app.pairs.compiled import CompiledLanes
from dflash_core import load_pair
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code

torch.set_num_threads(1)
keep_compiled_code()
pair = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")
lanes = CompiledLanes(pair.target, pair.drafter)
t = time.perf_counter(); lanes.compile(lanes.steps[0]); print("step0", lanes.steps[0].describe(), time.perf_counter() - t)
