"""torch.profiler over one eager forward of 1 and of 16 tokens after a 200-token context, the
default target in bf16 (batch-invariant), 1 thread: the ops that take the most time, by self CPU time.

    python dev/measurements/rows-kernel-amx-2026-12-07/profile_verify.py
"""

import torch

from dflash_core import load_pair

if __name__ == "__main__":
    torch.set_num_threads(1)
    target = load_pair("default:smollm2", None, dtype="bfloat16").target
    context = torch.randint(0, 40000, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for rows in (1, 16):
            block = torch.randint(0, 40000, (1, rows), generator=torch.Generator().manual_seed(1))
            for _ in range(3):  # warm-up
                target.reset(260)
                target.forward(context, last_logits_only=True)
                target.forward(block)
            target.reset(260)
            target.forward(context, last_logits_only=True)
            with torch.profiler.profile() as prof:
                target.forward(block)
            print(f"one forward of {rows} token(s)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6))
