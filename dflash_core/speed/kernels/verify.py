"""Greedy block verification in one launch: the target's argmax at every slot, accepted count, bonus.

Given the target's logits at the B block slots ([B, V]) and the B-1 draft ids, program
(row, split) finds the first maximum of one vocabulary slice of one slot and stores it as a
partial result. The last program to finish (an atomic counter) reduces the partials into the
target's argmax at every slot, the accepted count `a` (longest prefix of drafts equal to the
argmax at the previous slot) and the bonus token (the argmax at slot `a`), and writes them to a
2-element int64 device tensor. Nothing is copied to the host, so the caller decides when to
synchronise (one `.tolist()` per cycle in the engine).

Ties go to the first index, exactly like `torch.argmax`, so the kernel equals
`greedy_verify_reference` (below) bit for bit. The only state kept between calls is a per-device
counter that the last program resets, so consecutive calls (and CUDA-graph replays) need no
memset; it assumes one verification in flight per device at a time, as the batch-1 engine runs.
"""

import functools

import torch

from ...sampling import greedy_ids
from .backend import interpreting

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

_NO_INDEX = 2**31 - 1  # larger than any vocabulary index
BLOCK_V = 2048


def greedy_verify_reference(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """[accepted, bonus] as an int64 device tensor, in PyTorch: what the kernel computes."""
    choice = greedy_ids(target_logits)
    accepted = torch.cumprod(draft_ids == choice[:-1], dim=0).sum()
    # index_select, not choice[accepted]: a 0-dim tensor index is read on the host.
    return torch.stack([accepted, choice.index_select(0, accepted.view(1))[0]])


if triton is not None:

    def _verify_kernel(
        logits_ptr, draft_ptr, part_val_ptr, part_idx_ptr, ws_ptr, out_ptr,
        vocab, n_rows, n_splits, split_size, stride_l,
        NO_INDEX: tl.constexpr,
        BLOCK: tl.constexpr,
        ROWS: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        # Program (row, split) scans one slice of one row: a 150k vocabulary over 16 rows would
        # leave most SMs idle with one program per row.
        row = tl.program_id(0)
        split = tl.program_id(1)
        lo = split * split_size
        hi = tl.minimum(lo + split_size, vocab)
        offs0 = tl.arange(0, BLOCK)
        best_val = -float("inf")
        best_idx = lo
        for start in range(lo, hi, BLOCK):
            offs = start + offs0
            mask = offs < hi
            x = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=-float("inf")).to(tl.float32)
            chunk_max = tl.max(x, axis=0)
            # First index holding the chunk's max; a later chunk only wins if strictly greater.
            # With the same rule across splits below, this is torch.argmax's first-occurrence rule.
            chunk_idx = tl.min(tl.where(x == chunk_max, offs, NO_INDEX), axis=0)
            better = chunk_max > best_val
            best_idx = tl.where(better, chunk_idx, best_idx)
            best_val = tl.where(better, chunk_max, best_val)
        tl.store(part_val_ptr + row * n_splits + split, best_val)
        tl.store(part_idx_ptr + row * n_splits + split, best_idx)

        # acq_rel: this program's partial result is visible to whoever sees its increment, so the
        # program that sees the final count can reduce everybody's partials.
        finished = tl.atomic_add(ws_ptr, 1)
        is_last = finished == n_rows * n_splits - 1
        r = tl.arange(0, ROWS)
        c = tl.arange(0, SPLITS)
        # is_last broadcast by hand: the interpreter rejects a 2-D mask built from a scalar bool.
        last = (tl.zeros([ROWS, SPLITS], dtype=tl.int32) + is_last.to(tl.int32)) != 0
        valid = (r[:, None] < n_rows) & (c[None, :] < n_splits) & last
        part = r[:, None] * n_splits + c[None, :]
        # volatile: read from L2, where the other programs' stores landed, not from a stale L1.
        vals = tl.load(part_val_ptr + part, mask=valid, other=-float("inf"), volatile=True)
        idxs = tl.load(part_idx_ptr + part, mask=valid, other=NO_INDEX, volatile=True)
        row_max = tl.max(vals, axis=1)
        choice = tl.min(tl.where(vals == row_max[:, None], idxs, NO_INDEX), axis=1)
        has_draft = r < n_rows - 1
        draft = tl.load(draft_ptr + r, mask=has_draft & (tl.max(last.to(tl.int32), axis=1) != 0), other=0).to(tl.int32)
        accepted = tl.min(tl.where(has_draft & (draft != choice), r, n_rows - 1), axis=0)
        bonus = tl.sum(tl.where(r == accepted, choice, 0), axis=0)
        tl.store(out_ptr, accepted.to(tl.int64), mask=is_last)
        tl.store(out_ptr + 1, bonus.to(tl.int64), mask=is_last)
        tl.atomic_xchg(ws_ptr, 0, mask=is_last)


@functools.cache
def _compiled(interpret: bool):
    del interpret  # cache key only: triton.jit decides interpreter vs compiler when wrapping
    return triton.jit(_verify_kernel)


_workspaces: dict[torch.device, torch.Tensor] = {}
_PROGRAMS = 264  # enough (row, split) programs to cover an H100/H200's 132 SMs twice


def _workspace(device: torch.device) -> torch.Tensor:
    ws = _workspaces.get(device)
    if ws is None:
        ws = _workspaces[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return ws


def verify_triton(draft_ids, logits, *, block=None, split_size=None):
    """[accepted, bonus] (int64 device tensor) for greedy acceptance of `draft_ids` against `logits`.

    `block` (chunk width) and `split_size` (vocabulary slice per program, a multiple of `block`)
    are tuning knobs; the defaults spread the vocabulary over about two programs per SM.
    """
    n_rows, vocab = logits.shape
    if draft_ids.shape[0] != n_rows - 1:
        raise ValueError(f"{n_rows} block slots need {n_rows - 1} draft ids, got {draft_ids.shape[0]}")
    if vocab >= _NO_INDEX:
        raise ValueError("vocabulary too large for int32 indices")
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    block = block or min(BLOCK_V, triton.next_power_of_2(vocab))
    if split_size is None:
        chunks = triton.cdiv(vocab, block)
        # The interpreter runs programs one after another: there, fewer and longer is faster.
        programs = 1 if interpreting() else _PROGRAMS
        split_size = block * triton.cdiv(chunks, max(1, programs // n_rows))
    if split_size % block:
        raise ValueError(f"split_size {split_size} must be a multiple of block {block}")
    n_splits = triton.cdiv(vocab, split_size)
    draft = draft_ids.contiguous()
    if draft.numel() == 0:
        draft = torch.zeros(1, dtype=torch.long, device=logits.device)  # never read; needs a valid pointer
    part_val = torch.empty(n_rows * n_splits, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(n_rows * n_splits, dtype=torch.int32, device=logits.device)
    out = torch.empty(2, dtype=torch.int64, device=logits.device)
    _compiled(interpreting())[(n_rows, n_splits)](
        logits, draft, part_val, part_idx, _workspace(logits.device), out,
        vocab, n_rows, n_splits, split_size, logits.stride(0),
        NO_INDEX=_NO_INDEX,  # compiled kernels may only read constexpr globals: pass it in
        BLOCK=block,
        ROWS=triton.next_power_of_2(n_rows),
        SPLITS=triton.next_power_of_2(n_splits),
    )
    return out
