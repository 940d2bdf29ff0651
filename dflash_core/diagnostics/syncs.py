"""Counting host synchronisations: how often the host waits for the device during decoding.

A CUDA cycle should wait for the GPU once (to learn how many drafts were accepted); every extra
`.item()`, `.tolist()`, `int(tensor)`, `if tensor:` or `torch.cuda.synchronize()` stalls the
launch queue. `SyncCounter` counts those host reads by patching them, which works on CPU tensors
too (a CPU run makes the same calls a CUDA run would), and on CUDA also counts what
`torch.cuda.set_sync_debug_mode("warn")` reports (syncs inside library calls, e.g. copies to
pageable memory or `nonzero`).
"""

from __future__ import annotations

import warnings

import torch

# Tensor methods that hand a device value to the host, hence wait for the device.
HOST_READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")


class SyncCounter:
    """Context manager: `count` host reads and synchronisations while active (see the module doc)."""

    def __init__(self, cuda_debug: bool | None = None):
        self.count = 0
        self.cuda_debug = torch.cuda.is_available() if cuda_debug is None else cuda_debug
        self._saved = {}

    def _wrap(self, fn):
        def counted(*args, **kwargs):
            self.count += 1
            seen = len(self._caught) if self._caught is not None else 0
            try:
                return fn(*args, **kwargs)
            finally:
                if self._caught is not None:
                    del self._caught[seen:]  # CUDA's report of this same read: counted once

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
        return False


def host_reads_per_cycle(target, drafting: bool = True) -> tuple[int, str]:
    """How many host reads one decoding cycle on `target` makes, and which path that is.

    One everywhere: the accepted count. The CPU batch-invariant path (bf16 on CPU) adds one per
    layer when it verifies a block, where row-wise attention checks the causal mask on the host
    (`batch_invariant._causal_prefix`); a host read costs nothing on CPU and that path never runs
    on CUDA, so the one-sync rule it would break is a CUDA rule.
    """
    from ..batch_invariant import is_batch_invariant

    if drafting and is_batch_invariant(target.model):
        return 1 + target.num_layers, "cpu batch-invariant: the accepted count and one mask check per layer"
    return 1, f"{target.device.type}: the accepted count only"
