"""One draft-step attention call in bfloat16, SDPA against the masked-attention kernel: 9 query heads
on 3 key/value heads of 64, 4 block rows sharing one mask row over the drafter's static cache of
1,280 positions (the app's lanes: 1,024 plus the padding), 150 or 600 of them in use, 1 thread, µs
per call over 1,000 calls (docs/benchmarks.md, "The drafter's attention on the kernel"). From the
repository root:

    python dev/measurements/compiled-lanes-drafter-attention-2026-12-07/drafter_attention_call.py
"""
import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from dflash_core.speed.kernels import cpu_attention

torch.set_num_threads(1)
assert cpu_attention.prepare(), "the CPU kernels did not build here"
q = torch.randn(1, 9, 4, 64).bfloat16()
k, v = torch.randn(2, 1, 3, 1280, 64).bfloat16()
calls = {
    "SDPA": "F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)",
    "kernel": "cpu_attention.masked_attention(q, k, v, mask, 0.125)",
}
for used in (150, 600):
    mask = (torch.arange(1280) < used)[None]
    names = {"F": F, "cpu_attention": cpu_attention, "q": q, "k": k, "v": v, "mask": mask}
    times = {name: Timer(call, globals=names).timeit(1000).mean * 1e6 for name, call in calls.items()}
    print(f"{used} of 1280 positions in use: " + ", ".join(f"{name} {us:.0f} µs" for name, us in times.items()))
