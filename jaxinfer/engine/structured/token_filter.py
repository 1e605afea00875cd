"""vLLM's allowed_token_ids and bad_words as a packed mask per sampled position, made on the host the way a
structured-output constraint's is (llguidance's layout: token t is allowed when bit t % 32 of word t // 32
is set), so they cost the step programs nothing new: every step already takes a mask.

Host only, no jax. A bad word bans its last token where the output ends with the rest of it (vLLM's rule:
generated tokens only, the prompt does not count), so the filter keeps the output's last few tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def packed_words(vocab_size: int) -> int:
    """int32 words a row of the packed mask takes."""
    return -(-vocab_size // 32)


def packed_row(vocab_size: int, allowed: Sequence[int] | None) -> np.ndarray:
    """A packed row allowing `allowed` only (None: every token)."""
    if allowed is None:
        return np.full(packed_words(vocab_size), -1, np.int32)
    bits = np.zeros(packed_words(vocab_size) * 32, np.uint8)
    bits[np.asarray(allowed, np.int64)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32).copy()


def bad_word_ids(tokenizer: Any, words: Sequence[str]) -> list[tuple[int, ...]]:
    """Each word's token ids as written (stripped on the left) and, where a space before it makes other
    tokens of the same count (a word in mid-text), those too: vLLM's two spellings of a bad word."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        sequences.append(plain)
        if len(spaced) == len(plain) and spaced[0] != plain[0]:
            sequences.append(spaced)
    return [s for s in sequences if s]


class TokenFilter:
    """One sample's allowed ids and bad words: `row(drafts)` is the mask of the position after its output
    (and `drafts`); `accept` follows the output as tokens are generated."""

    def __init__(self, vocab_size: int, allowed: Sequence[int] | None, bad_words: Sequence[tuple[int, ...]]):
        self.base = packed_row(vocab_size, allowed)
        for word in bad_words:
            if len(word) == 1:  # a one-token word is banned everywhere
                self._ban(self.base, word[0])
        self.endings: dict[tuple[int, ...], list[int]] = {}  # a bad word's leading tokens -> its last ones
        for word in bad_words:
            if len(word) > 1:
                self.endings.setdefault(word[:-1], []).append(word[-1])
        self.lengths = sorted({len(prefix) for prefix in self.endings})
        self.tail: list[int] = []  # the output's last tokens, as many as the longest leading part

    @property
    def static(self) -> bool:
        """True when every position's mask is the same (allowed ids and one-token bad words only), so a
        call of several decode steps may apply one mask to all of them."""
        return not self.endings

    def accept(self, token: int) -> None:
        if self.lengths:
            self.tail = (self.tail + [token])[-self.lengths[-1]:]

    def row(self, drafts: Sequence[int] = ()) -> np.ndarray:
        """The mask of the next position: the allowed ids less each bad word's last token whose leading
        tokens the output (then `drafts`) ends with."""
        row = self.base.copy()
        history = self.tail + [int(t) for t in drafts]
        for length in self.lengths:
            for last in self.endings.get(tuple(history[-length:]), ()) if len(history) >= length else ():
                self._ban(row, last)
        return row

    @staticmethod
    def _ban(row: np.ndarray, token: int) -> None:
        row.view(np.uint32)[token // 32] &= np.uint32(0xFFFFFFFF ^ (1 << (token % 32)))
