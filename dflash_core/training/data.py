"""Training data as the loop sees it: sequences from datagen shards, the held-out split, the draft vocabulary.

Scripts that inspect the data (e.g. `dev/scripts/acceptance_by_confidence.py`) use these too, so they
split and truncate exactly as training does.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import torch

from .datagen import load_dataset


def heldout(sample_key: str, frac: float) -> bool:
    """Stable by-sample split: the same sample stays on the same side as the data grows."""
    digest = hashlib.sha1(sample_key.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < frac


def frequent_tokens(seqs, k: int, vocab_size: int, always=()) -> torch.Tensor:
    """The `k` ids most frequent in the responses (ties by id), plus `always`: a draft vocabulary.

    A drafter proposing only these pays for k rows of the LM head instead of the whole vocabulary;
    a response token outside them can never be drafted, so k should cover nearly all of the data.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, plen, _ in seqs:
        counts += torch.bincount(ids[plen:], minlength=vocab_size)
    for t in always:
        counts[t] = counts.max() + 1
    # Stable sort on -count keeps equal counts in id order.
    order = torch.sort(-counts, stable=True).indices
    return order[: min(k, vocab_size)].clone()


def load_sequences(data_dir: str | Path, max_len: int, min_response: int = 2,
                   shards: list[slice] | None = None):
    """[(ids int64 tensor, prompt_len, key)] from datagen shards, truncated to `max_len` tokens."""
    out = []
    for i, item in enumerate(load_dataset(data_dir, with_ids=True, shards=shards)):
        ids, plen, key = item
        ids = torch.as_tensor(np.asarray(ids[:max_len], dtype=np.int64))
        if len(ids) - plen >= min_response:
            out.append((ids, int(plen), key or f"#{i}"))
    return out


def shard_range(text: str) -> list[slice]:
    """'40:', ':12', '3:9' or '0:40:4', comma-separated for several -> slices over the shard list."""
    try:
        out = []
        for part in text.split(","):
            bounds = part.split(":")
            if not 2 <= len(bounds) <= 3:
                raise ValueError
            start, stop, *step = (int(b) if b.strip() else None for b in bounds)
            if step == [0]:  # a zero step selects nothing meaningful; slicing would raise later
                raise ValueError
            out.append(slice(start, stop, *step))
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected START:STOP[:STEP] (each may be empty), comma-separated for several, got {text!r}") from None
