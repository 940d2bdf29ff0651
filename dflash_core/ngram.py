"""The n-gram search behind prompt lookup, in plain Python (no torch): where the context's end
occurred before, and what followed it.

The replay app reads it too: a recorded prompt-lookup cycle holds its drafts, not where they were
copied from, and the search is deterministic, so the place is found again from the recorded context.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_NGRAM_SIZES = (3, 2, 1)  # the n-gram lengths searched, longest first


@dataclass(frozen=True)
class Match:
    """An earlier occurrence of the context's last `n` tokens at `start`, and the up to
    `max_tokens` tokens that followed it (`tokens`, the draft)."""

    n: int
    start: int
    tokens: tuple[int, ...]


def find_match(context: list[int], ngram_sizes, max_tokens: int) -> Match | None:
    """The latest earlier occurrence of the last n tokens of `context` followed by `max_tokens`
    tokens (else the one followed by the most), for the first n of `ngram_sizes` (longest first)
    that occurs; None when none does."""
    length = len(context)
    for n in ngram_sizes:
        if n >= length:
            continue
        tail = context[length - n :]
        best: Match | None = None
        # Latest start first: recent text is the likeliest to repeat. A match right before the
        # end has a short continuation (in a run of one token, a single one), so the latest match
        # with a full continuation wins, else the longest continuation found.
        for start in range(length - n - 1, -1, -1):
            if context[start : start + n] == tail:
                found = tuple(context[start + n : start + n + max_tokens])
                if len(found) == max_tokens:
                    return Match(n, start, found)
                if best is None or len(found) > len(best.tokens):
                    best = Match(n, start, found)
        if best is not None and best.tokens:
            return best
    return None


def lookup(context: list[int], ngram_sizes, max_tokens: int) -> list[int]:
    """The draft `find_match` gives: the tokens that followed the match, [] when there is none."""
    match = find_match(context, ngram_sizes, max_tokens)
    return list(match.tokens) if match is not None else []
