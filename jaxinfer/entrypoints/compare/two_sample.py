"""A two-sample test of sampled token distributions: chi-square statistics under a permutation test (NumPy).

For each prompt, A's and B's sampled completions form a 2 x K table of token counts at every
position; the statistic sums the tables' chi-square statistics over positions and prompts. Its
null distribution comes from relabelling whole completions at random within each prompt, so the
p-value is exact for any sample size and sparse vocabulary (no chi-square approximation, no SciPy),
and tokens of one completion stay together however they depend on each other.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

PERMUTATIONS = 2000
CHUNK = 250  # permutations scored at once: bounds the [chunk, categories] product's memory


@dataclasses.dataclass(frozen=True)
class TwoSampleResult:
    """The test's outcome: a small p-value says A and B sample from different distributions."""

    p_value: float
    statistic: float
    prompts: int
    samples_a: int  # completions per prompt
    samples_b: int
    positions: int


def _one_hot_blocks(pooled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-hot [N, sum_t K_t] of each position's tokens (a block per position), and each column's total."""
    blocks = []
    for column in pooled.T:
        _, codes = np.unique(column, return_inverse=True)
        blocks.append(np.eye(codes.max() + 1, dtype=np.float64)[codes])
    one_hot = np.concatenate(blocks, axis=1)
    return one_hot, one_hot.sum(axis=0)


def _statistics(labels: np.ndarray, one_hot: np.ndarray, totals: np.ndarray, n_a: int) -> np.ndarray:
    """Chi-square statistics [R] summed over positions, for label rows [R, N] (1 = A's completion).

    With both margins fixed, B's deviation from its expected count mirrors A's, so each category
    adds d^2 N^2 / (n_a n_b c) where d is A's count minus its expectation and c the category total.
    """
    n = one_hot.shape[0]
    deviation = labels @ one_hot - n_a * totals / n
    return (deviation**2 * n * n / (n_a * (n - n_a) * totals)).sum(axis=1)


def permutation_chi_square(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], permutations: int = PERMUTATIONS, seed: int = 0
) -> TwoSampleResult:
    """Test that A and B sample the same token distributions; per prompt, a [n_a, T] and b [n_b, T] token ids."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need samples of the same non-zero number of prompts, got {len(a)} and {len(b)}")
    rng = np.random.default_rng(seed)
    observed, null = 0.0, np.zeros(permutations)
    for sa, sb in zip(a, b):
        sa, sb = np.asarray(sa), np.asarray(sb)
        if sa.ndim != 2 or sb.ndim != 2 or sa.shape[1] != sb.shape[1] or min(len(sa), len(sb)) < 1:
            raise ValueError(f"samples of one prompt must be [n, T] arrays of equal T, got {sa.shape} and {sb.shape}")
        one_hot, totals = _one_hot_blocks(np.concatenate([sa, sb]))
        labels = np.zeros(len(sa) + len(sb))
        labels[: len(sa)] = 1
        observed += _statistics(labels[None], one_hot, totals, len(sa))[0]
        for start in range(0, permutations, CHUNK):
            count = min(CHUNK, permutations - start)
            shuffled = np.stack([rng.permutation(labels) for _ in range(count)])
            null[start : start + count] += _statistics(shuffled, one_hot, totals, len(sa))
    # The observed labelling counts as one of the permutations, so p is never 0 (a valid p-value).
    p_value = (1 + np.count_nonzero(null >= observed - 1e-9 * max(observed, 1.0))) / (1 + permutations)
    return TwoSampleResult(float(p_value), float(observed), len(a), len(a[0]), len(b[0]), int(np.shape(a[0])[1]))
