"""What the aot_compile scripts here share: the default pair's target (dtype `auto`, 1 thread) with
a static cache of `capacity` after an eager 4-token prefill, and the one-token step's two inputs
(made in inference mode, as the engine's static buffers are); and timing a loaded step on them."""
import time

import torch

from dflash_core import Target, load_pair
from dflash_core.bench.run import DEFAULT_DRAFTER
from dflash_core.loading.pair import keep_compiled_code
from dflash_core.speed.kernels import cpu_attention

torch.set_num_threads(1)
keep_compiled_code()
PAIR = load_pair("default:smollm2", DEFAULT_DRAFTER, dtype="auto")


def prefilled(capacity: int = 1024):
    """(target, ids, positions): the step `Target._step(target, ids, positions)` writes position 4."""
    target = Target(PAIR.target.model, PAIR.target.tokenizer, static_cache=True)
    target.reset(capacity)
    cpu_attention.prepare()
    target.forward(torch.tensor([[1, 2, 3, 4]]))
    with torch.inference_mode():
        return target, torch.tensor([[5]]), torch.tensor([[4]])


def ms_per_step(loaded, target, ids, positions, steps: int = 20) -> float:
    """Mean milliseconds of `loaded(target, ids, positions)` over `steps` calls (in inference mode)."""
    start = time.perf_counter()
    for _ in range(steps):
        with target.kv.forward(1):
            loaded(target, ids, positions)
    return (time.perf_counter() - start) / steps * 1e3
