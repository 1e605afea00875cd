"""Prompt lookup on the host (no jax): what followed the latest earlier occurrence of a row's last
n tokens, and how far a declined draft agreed with the tokens a plain step produced."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def common_prefix(draft: np.ndarray, tokens: np.ndarray) -> int:
    """How many leading tokens of draft equal tokens (both 1-D)."""
    seen = min(len(draft), len(tokens))
    mismatch = np.flatnonzero(np.asarray(draft[:seen]) != np.asarray(tokens[:seen]))
    return int(mismatch[0]) if len(mismatch) else seen


def ngram_draft(ids: np.ndarray, k: int, ngram_min: int, ngram_max: int) -> np.ndarray:
    """What followed the latest earlier occurrence of the last n tokens (n = ngram_max down to ngram_min).

    Among matches the latest with k tokens after it wins (a loop of period 1 still yields k),
    else the latest match. At most k tokens; empty when nothing matches.
    """
    length = len(ids)
    for n in range(ngram_max, ngram_min - 1, -1):
        if length <= n:
            continue
        windows = sliding_window_view(ids[:-1], n)  # windows[s] ends at s + n - 1 <= length - 2
        ends = np.flatnonzero(np.all(windows == ids[-n:], axis=1)) + n - 1
        if len(ends) == 0:
            continue
        full = ends[ends <= length - 1 - k]
        end = full[-1] if len(full) else ends[-1]
        return ids[end + 1 : end + 1 + k]
    return ids[:0]
