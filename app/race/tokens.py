"""Per-token text pieces for display, decoded from token ids with the target's tokenizer.

A byte-level BPE token can hold part of a multi-byte character, so each piece is the growth of a
decoded window ending at that token; a token that only starts a character gets an empty piece and
the character is shown with the token that completes it.
"""

from __future__ import annotations

_WINDOW = 8  # tokens of left context: enough for any UTF-8 character split across tokens


class TokenPieces:
    """Remembers the pieces already computed, so a growing output is decoded once per token."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.pieces: list[str] = []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def extend(self, ids) -> list[str]:
        """Pieces for `ids` (the full output so far); reuses earlier work if it is a continuation."""
        ids = [int(i) for i in ids]
        if ids[: len(self.ids)] != self.ids:
            self.ids, self.pieces = [], []
        for i in range(len(self.ids), len(ids)):
            start = max(0, i - _WINDOW)
            before = self._decode(ids[start:i]) if i > start else ""
            after = self._decode(ids[start : i + 1])
            if after.endswith("\ufffd"):
                piece = ""  # an unfinished character: shown with the token that completes it
            else:
                # Pieces for earlier tokens that were left empty are owed their characters now.
                pending = 0
                while pending < i and self.pieces[i - 1 - pending] == "" and i - 1 - pending >= start:
                    pending += 1
                base = self._decode(ids[start : i - pending]) if i - pending > start else ""
                piece = after[len(base) :] if after.startswith(base) else after[len(before) :]
            self.ids.append(ids[i])
            self.pieces.append(piece)
        return list(self.pieces[: len(ids)])
