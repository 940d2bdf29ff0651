"""Block verification in one launch: the target's choice at every block slot, accepted count, bonus.

Given the target's logits at the B block slots ([B, V]) and the B-1 draft ids, every program
takes one slot, finds the target's choice there and, for slots 0..B-2, whether the draft token
after it matches. The last program to finish (an atomic counter) reduces those into the
accepted count `a` (longest matching prefix) and the bonus token (the choice at slot `a`) and
writes them to a 2-element int64 device tensor. Nothing is copied to the host, so the caller
decides when to synchronise (one `.tolist()` per cycle in the engine).

Two choice rules (SPEC §4):
  - greedy: row-wise argmax; ties go to the first index, exactly like `torch.argmax`;
    the vocabulary is scanned in chunks, so it need not be a multiple of the chunk.
  - sampled ("deterministic draft, sample the target per slot, accept while equal"): the
    target's sample at each slot is the Gumbel-max draw argmax(logits / T + g), with
    g = -log(-log(u)) from caller-supplied uniforms u [B, V], restricted to tokens whose
    tempered score is >= a per-row cutoff (top-k / top-p, see `verify.truncation_cutoff`).
    Gumbel-max on exact uniforms samples softmax(logits / T) over the kept tokens, and because
    kernel and reference consume the same uniforms their outputs can be compared exactly.

Results are exact, not approximate: greedy outputs equal `verify.greedy_verify_reference`
bit for bit; sampled outputs equal `verify.match_sampled_verify_reference` unless two candidates
differ by less than one float32 ulp after the log (the kernel's and PyTorch's `log` may round
differently in the last bit).

The reduction uses a small per-device workspace [counter, min mismatch] that the last program
resets, so consecutive calls (and CUDA-graph replays) need no memset; it assumes one
verification in flight per device at a time, which is how the batch-1 engine runs.
"""

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

_NO_MISMATCH = 2**31 - 1
BLOCK_V = 2048

if triton is not None:

    def _verify_kernel(
        logits_ptr, draft_ptr, u_ptr, cutoff_ptr, choice_ptr, ws_ptr, out_ptr,
        vocab, n_rows, stride_l, stride_u, temperature,
        SAMPLED: tl.constexpr,
        HAS_CUTOFF: tl.constexpr,
        NO_MISMATCH: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        offs0 = tl.arange(0, BLOCK)
        best_val = -float("inf")
        best_idx = 0
        if HAS_CUTOFF:
            cutoff = tl.load(cutoff_ptr + row)
        for start in range(0, vocab, BLOCK):
            offs = start + offs0
            mask = offs < vocab
            x = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=-float("inf")).to(tl.float32)
            if SAMPLED:
                # Divide (not multiply by 1/T) so the tempered scores round like the reference's.
                x = x / temperature
                if HAS_CUTOFF:
                    x = tl.where(x >= cutoff, x, -float("inf"))
                u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.5).to(tl.float32)
                x = x + -tl.log(-tl.log(u))
                x = tl.where(mask, x, -float("inf"))
            chunk_max = tl.max(x, axis=0)
            # First index holding the chunk's max; a later chunk only wins if strictly greater,
            # which together reproduce torch.argmax's first-occurrence tie rule.
            chunk_idx = tl.min(tl.where(x == chunk_max, offs, vocab), axis=0)
            better = chunk_max > best_val
            best_idx = tl.where(better, chunk_idx, best_idx)
            best_val = tl.where(better, chunk_max, best_val)
        tl.store(choice_ptr + row, best_idx)

        has_draft = row < n_rows - 1
        draft = tl.load(draft_ptr + row, mask=has_draft, other=0).to(tl.int32)
        tl.atomic_min(ws_ptr + 1, row, mask=has_draft & (draft != best_idx))
        # acq_rel atomics order this program's choice store and mismatch before the count,
        # so the program that sees the final count sees everybody's results.
        finished = tl.atomic_add(ws_ptr, 1)
        is_last = finished == n_rows - 1
        first_mismatch = tl.atomic_xchg(ws_ptr + 1, NO_MISMATCH, mask=is_last)
        accepted = tl.minimum(first_mismatch, n_rows - 1)
        # Read through an atomic so the value comes from L2, not a stale L1 line.
        bonus = tl.atomic_add(choice_ptr + accepted, 0, mask=is_last)
        tl.store(out_ptr, accepted.to(tl.int64), mask=is_last)
        tl.store(out_ptr + 1, bonus.to(tl.int64), mask=is_last)
        tl.atomic_xchg(ws_ptr, 0, mask=is_last)


@functools.cache
def _compiled(interpret: bool):
    del interpret  # cache key only: triton.jit decides interpreter vs compiler when wrapping
    return triton.jit(_verify_kernel)


_workspaces: dict[torch.device, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    ws = _workspaces.get(device)
    if ws is None:
        ws = _workspaces[device] = torch.tensor([0, _NO_MISMATCH], dtype=torch.int32, device=device)
    return ws


def verify_triton(draft_ids, logits, *, temperature=None, cutoff=None, uniforms=None) -> torch.Tensor:
    """[accepted, bonus] (int64 device tensor). Greedy when `uniforms` is None, else sampled."""
    from . import interpreting

    n_rows, vocab = logits.shape
    if draft_ids.shape[0] != n_rows - 1:
        raise ValueError(f"{n_rows} block slots need {n_rows - 1} draft ids, got {draft_ids.shape[0]}")
    if vocab >= _NO_MISMATCH:
        raise ValueError("vocabulary too large for int32 indices")
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    sampled = uniforms is not None
    if sampled:
        if temperature is None or temperature <= 0:
            raise ValueError("sampled verification needs a temperature > 0")
        uniforms = uniforms if uniforms.stride(-1) == 1 else uniforms.contiguous()
        if uniforms.shape != logits.shape:
            raise ValueError(f"uniforms {tuple(uniforms.shape)} must match logits {tuple(logits.shape)}")
    if cutoff is not None:
        cutoff = cutoff.to(torch.float32).contiguous()
    draft = draft_ids.contiguous()
    if draft.numel() == 0:
        draft = torch.zeros(1, dtype=torch.long, device=logits.device)  # never read; needs a valid pointer
    choices = torch.empty(n_rows, dtype=torch.int32, device=logits.device)
    out = torch.empty(2, dtype=torch.int64, device=logits.device)
    _compiled(interpreting())[(n_rows,)](
        logits, draft, uniforms if sampled else logits, cutoff if cutoff is not None else logits,
        choices, _workspace(logits.device), out,
        vocab, n_rows, logits.stride(0), uniforms.stride(0) if sampled else 0,
        float(temperature) if sampled else 1.0,
        SAMPLED=sampled,
        HAS_CUTOFF=sampled and cutoff is not None,
        NO_MISMATCH=_NO_MISMATCH,  # compiled kernels may only read constexpr globals: pass it in
        BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)),
    )
    return out
