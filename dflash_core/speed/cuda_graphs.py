"""CUDA graphs for the two fixed-shape steps of a cycle: the draft forward and the verify forward.

At batch 1 a cycle is a few hundred small kernels (the target's layers over B tokens, the
drafter's layers over its block), and the GPU finishes each one sooner than Python launches the
next. A CUDA graph records the launches of one step once and replays them with a single call.
Replaying is only correct when nothing the launches depend on has moved:

- shapes: one graph per key, the key holding the input shapes (verify: B tokens; draft: a block
  of B slots after a context padded to B rows), so a new shape can never replay an old graph;
- addresses: inputs are copied into static buffers before every replay, and outputs are read from
  the tensors the capture returned (each replay overwrites them, so read them before the next);
- host values: every position and cache offset reaches the step as a device tensor, and the
  caches are written in place. Hence graphs need the static caches (the target's `StaticCache`,
  the drafter's fixed-capacity `DrafterCache`): `Target(..., cuda_graphs=True)` refuses to run
  without `static_cache=True`.

Steps must also be idempotent (running one twice on the same inputs leaves the same state), since
the capture runs them a few times to warm up. The caller decides which shapes are worth a graph
(the decoding loop: the verify forward of every cycle and the steady-state draft step); any other
call runs the same step eagerly. A capture that fails leaves its key eager for good, with one
`FallbackWarning` per distinct error (`fallbacks.notice`).

The capture/replay machinery is a backend object with `capture(step, inputs, tag) -> (handle, outputs)`
and `replay(handle)`: `CudaGraphBackend` here, `compiled_steps.CompiledBackend` (torch.compile, whose
replay returns fresh outputs in place of the captured ones), a CPU stand-in in tests/test_cuda_graphs.py.
"""

from __future__ import annotations

import torch

from .fallbacks import notice


class CudaGraphBackend:
    """`torch.cuda.CUDAGraph`: warm-up runs on a side stream, then one capture."""

    def __init__(self, warmup: int = 2):
        self.warmup = warmup

    def capture(self, step, inputs, tag=None):
        device = inputs[0].device if inputs else torch.device("cuda")  # no inputs: the current CUDA device
        if device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need CUDA tensors, not {device.type}")
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup):  # lazy allocations, Triton compiles and caches: not in the graph
                    step(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA calls (e.g. the app's other model) must not void this capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = step(*inputs)
        return graph, outputs

    def replay(self, graph) -> None:
        graph.replay()


class StepGraphs:
    """Captured steps, keyed by the caller's tag plus the inputs' shapes, dtypes and devices."""

    def __init__(self, backend=None):
        self.backend = backend or CudaGraphBackend()
        self.graphs: dict = {}  # key -> (handle, static inputs, outputs), or None: runs eagerly

    def __call__(self, tag, step, *inputs):
        """`step(*inputs)`, replayed from a graph captured on the first call with this key."""
        key = (tag, *((x.shape, x.dtype, x.device) for x in inputs))
        if key not in self.graphs:
            self.graphs[key] = self._capture(tag, step, inputs)
        entry = self.graphs[key]
        if entry is None:
            return step(*inputs)
        handle, static, outputs = entry
        for buffer, x in zip(static, inputs):
            buffer.copy_(x)
        fresh = self.backend.replay(handle)
        return outputs if fresh is None else fresh

    def _capture(self, tag, step, inputs):
        static = tuple(x.clone() for x in inputs)
        try:
            handle, outputs = self.backend.capture(step, static, tag)
        except Exception as exc:  # noqa: BLE001 - a graph is an optimisation; the step still runs eagerly
            notice(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); those steps run eagerly")
            return None
        return handle, static, outputs

    def __reduce__(self):
        # Saving a compiled step pickles the objects its guards pass through (a Target, a run's
        # drafting state) with their attributes; the steps captured here are this process's, not data.
        return type(self), (self.backend,)

    def clear(self) -> None:
        """Forget every graph (their buffers, e.g. a reallocated cache, are gone)."""
        self.graphs.clear()
