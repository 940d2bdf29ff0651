"""The first row count at which oneDNN's packed bf16 linears compute a block's rows differently from
each row alone (`batch_invariant.rows_alone_from`, up to MAX_BLOCK rows; None: never), for
SmolLM2-135M's linear shapes, with the rows kernel off (the libraries' path). From the repository root:

    DFLASH_CPU_ROWS=off python dev/measurements/trees-48-rows-amx-2026-12-07/onednn_rows.py
"""
import torch
from torch import nn

from dflash_core.speed.batch_invariant import MAX_BLOCK, rows_alone_from
from dflash_core.speed.cpu_linear import pack_linears

torch.set_num_threads(1)
for in_features, out_features in [(576, 1536), (1536, 576), (576, 576), (576, 192), (576, 49152)]:
    layer = nn.Sequential(nn.Linear(in_features, out_features, bias=False)).bfloat16()
    pack_linears(layer, calibrate=False)
    print(f"{in_features} -> {out_features} ({type(layer[0]).__name__}): blocks differ from {rows_alone_from(layer[0])} "
          f"rows (probed to {MAX_BLOCK})")
