"""`Logprob`, vLLM's per-token log-probability record, and the per-position dict layout built from it.

A position's logprobs are a dict keyed by token id: the top k tokens (ranks 1..k) and the token
actually there (sampled, or the prompt's own), with its rank in the whole distribution. No jax.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

TokenText = Callable[[int], "str | None"]  # a token's own text, or None without a tokenizer


@dataclasses.dataclass(frozen=True)
class Logprob:
    """A token's log-probability, its rank (1 = most likely) and its text, as vLLM's `Logprob`.

    `float(lp)` is the log-probability, so code written for the old plain-float values only
    needs a `float(...)` around them.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None

    def __float__(self) -> float:
        return self.logprob


def position_logprobs(
    token: int, logprob: float, rank: int, top_ids: Sequence[int], top_values: Sequence[float], text: TokenText
) -> dict[int, Logprob]:
    """One position's dict: the top tokens in order (ranks 1..k), then `token` with its own rank."""
    entry = {t: Logprob(float(v), i + 1, text(t)) for i, (t, v) in enumerate(zip(top_ids, top_values))}
    entry[token] = Logprob(float(logprob), rank, text(token))
    return entry


def no_text(token: int) -> None:
    """The TokenText of a model without a tokenizer."""
    return None
