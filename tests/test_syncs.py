"""One host sync per decoding cycle, counted on CPU by patching the calls that read device values."""

from __future__ import annotations

import os

import pytest
import torch
from triton_support import interpreter_skip_reason

from dflash_core import Block, SamplingParams, Target, generate
from dflash_core.diagnostics.syncs import SyncCounter, host_reads_per_cycle


@pytest.mark.parametrize("inference", [False, True])
def test_counter_counts_host_reads_and_restores_them(inference):
    t = torch.arange(4)
    with torch.inference_mode(inference), SyncCounter(cuda_debug=False) as counter:
        index = t.sum() - 5  # a 0-dim tensor made here, as decoding makes them
        t.tolist(), t[0].item(), int(t[1]), float(t[2]), bool(t[3]), [10, 11][t[1]]
        torch.cuda.synchronize  # looked up, not called
        assert counter.take() == 6 and counter.take() == 0
        t[index], t.index_select(0, index.view(1))  # C++ reads the first index on the host, not the second
        assert counter.take() == 1
    assert "__int__" not in torch.Tensor.__dict__ and torch.Tensor.tolist is torch._C.TensorBase.tolist


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.9, seed=3)])
@pytest.mark.parametrize("draft_mode", ["sample", "argmax"])
@pytest.mark.parametrize("with_drafter", [True, False])
@pytest.mark.parametrize("static_cache, kernels", [(False, "torch"), (True, "torch"), (False, "triton")])
def test_one_host_sync_per_cycle(golden_pair, sampling, draft_mode, with_drafter, static_cache, kernels, monkeypatch):
    """Counted at the C++ level too (`_local_scalar_dense`): indexing with a 0-dim tensor reads the host."""
    if kernels == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernels run on CPU only in Triton's interpreter (TRITON_INTERPRET=1)")
    if kernels == "triton" and interpreter_skip_reason():
        pytest.skip(interpreter_skip_reason())
    if kernels == "triton" and draft_mode == "argmax":
        pytest.skip("the kernels are the same as for sampled drafts; interpreted Triton is slow")
    monkeypatch.setenv("DFLASH_KERNELS", kernels)
    target, drafter = golden_pair
    if static_cache:
        target = Target(target.model, static_cache=True)
    per_cycle = []
    with SyncCounter(cuda_debug=False) as counter:
        events = generate(target, [1, 2, 3, 4], drafter if with_drafter else None,
                          max_new_tokens=24 if kernels == "torch" else 10,
                          sampling=sampling, draft_mode=draft_mode)
        for event in events:
            if isinstance(event, Block):
                per_cycle.append(counter.take())
            else:
                counter.take()  # the prefill's first token is read once, outside the cycles
    assert len(per_cycle) >= 3 and per_cycle == [1] * len(per_cycle)


@pytest.mark.parametrize("with_drafter", [True, False])
def test_cpu_batch_invariant_path_reads_each_layers_mask(golden_dir, with_drafter):
    """The path `auto` takes on CPUs with native bf16 (batch-invariant), forced here on any CPU class."""
    from dflash_core import DFlashDrafter

    target = Target.from_pretrained(golden_dir / "target", dtype=torch.bfloat16, batch_invariant=True)
    drafter = DFlashDrafter.from_pretrained(golden_dir / "drafter", dtype=torch.bfloat16) if with_drafter else None
    bound, path = host_reads_per_cycle(target, drafting=with_drafter)
    per_cycle = []
    with SyncCounter(cuda_debug=False) as counter:
        for event in generate(target, [1, 2, 3, 4], drafter, max_new_tokens=16):
            count = counter.take()
            if isinstance(event, Block):
                per_cycle.append(count)
    assert (bound, path.split(":")[0]) == ((1 + target.num_layers, "cpu batch-invariant") if with_drafter else (1, "cpu"))
    assert len(per_cycle) >= 3 and per_cycle == [bound] * len(per_cycle)
