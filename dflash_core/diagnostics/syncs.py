"""Counting host synchronisations: how often the host waits for the device during decoding.

A CUDA cycle should wait for the GPU once (to learn how many drafts were accepted); every extra
`.item()`, `.tolist()`, `int(tensor)`, `if tensor:`, `rows[zero_dim_index]` or
`torch.cuda.synchronize()` stalls the launch queue. `SyncCounter` counts those host reads on CPU
tensors too (a CPU run makes the same calls a CUDA run would): every read of one value, from
Python or from inside C++ (indexing with a 0-dim tensor, `bool()` of a mask), is the aten op
`_local_scalar_dense`, seen by a dispatch mode; `tolist` and `torch.cuda.synchronize` are patched.
On CUDA it also counts what `torch.cuda.set_sync_debug_mode("warn")` reports (syncs inside
library calls, e.g. copies to pageable memory or `nonzero`).
"""

from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Python-level reads that do not pass through `_local_scalar_dense`.
HOST_READS = ("tolist",)
# A one-value read reaches a dispatch mode as `_local_scalar_dense`, or under inference mode
# (where `item` and `is_nonzero` are not decomposed before the mode sees them) as those: never as both.
SCALAR_READS = (
    torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.is_nonzero.default,
)


class _ScalarReads(TorchDispatchMode):
    """Counts the ops behind every read of one tensor value."""

    def __init__(self, counted):
        super().__init__()
        self._counted = counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SCALAR_READS:
            return self._counted(func, *args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class SyncCounter:
    """Context manager: `count` host reads and synchronisations while active (see the module doc)."""

    def __init__(self, cuda_debug: bool | None = None):
        self.count = 0
        self.cuda_debug = torch.cuda.is_available() if cuda_debug is None else cuda_debug
        self._saved = {}

    def _counted(self, fn, *args, **kwargs):
        """Call `fn`, a host read, counting it once."""
        self.count += 1
        seen = len(self._caught) if self._caught is not None else 0
        try:
            return fn(*args, **kwargs)
        finally:
            if self._caught is not None:
                del self._caught[seen:]  # CUDA's report of this same read: counted once

    def _wrap(self, fn):
        def counted(*args, **kwargs):
            return self._counted(fn, *args, **kwargs)

        return counted

    def take(self) -> int:
        """The count so far (CUDA's own reports included), reset to zero."""
        if self.cuda_debug and self._caught is not None:
            self.count += sum("synchronizing" in str(w.message) for w in self._caught)
            self._caught.clear()
        count, self.count = self.count, 0
        return count

    def __enter__(self):
        self._caught = None
        self._mode = _ScalarReads(self._counted)
        self._mode.__enter__()
        for name in HOST_READS:
            self._saved[name] = (torch.Tensor.__dict__.get(name), getattr(torch.Tensor, name))
            setattr(torch.Tensor, name, self._wrap(self._saved[name][1]))
        self._sync = torch.cuda.synchronize
        torch.cuda.synchronize = self._wrap(self._sync)
        if self.cuda_debug:
            # The debug mode reports syncs inside library calls too; those a patched read causes
            # are dropped by `_wrap`, the rest are added by `take`.
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.cuda_debug:
            torch.cuda.set_sync_debug_mode("default")
            self._warnings.__exit__(*exc)
        torch.cuda.synchronize = self._sync
        for name, (own, _inherited) in self._saved.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)
        self._saved = {}
        self._mode.__exit__(*exc)
        return False


def host_reads_per_cycle(target, drafting: bool = True) -> tuple[int, str]:
    """How many host reads one decoding cycle on `target` makes, and which path that is.

    One everywhere: the accepted count. The CPU batch-invariant path (bf16 on CPU) adds one per
    attention layer (a hybrid's linear-attention layers take no mask) when it verifies a block,
    where row-wise attention checks the causal mask on the host (`batch_invariant._visible_keys`);
    a host read costs nothing on CPU and that path never runs on CUDA, so the one-sync rule it
    would break is a CUDA rule.
    """
    from ..speed.batch_invariant import is_batch_invariant

    if drafting and is_batch_invariant(target.model):
        attending = sum(hasattr(layer, "self_attn") for layer in target.layers)
        return 1 + attending, "cpu batch-invariant: the accepted count and one mask check per attention layer"
    return 1, f"{target.device.type}: the accepted count only"
