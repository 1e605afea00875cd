"""Row ordering on integer keys and in top-k parts gives exactly what jnp.sort and lax.top_k give."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.sampling.row_order import from_sort_keys, sort_keys, sorted_descending, top_k_in_parts

# XLA:CPU compares subnormals as zero (and -0 as 0): those orders may differ between the two sorts, the values
# compare equal, so no threshold drawn from them does.
SPECIAL = np.array([np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1.0, -1.0], np.float32)


def rows_with_ties(seed: int, shape: tuple[int, int], levels: int) -> np.ndarray:
    """Random float32 rows drawing from few distinct values (many ties), special values mixed in."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(levels).astype(np.float32) * rng.choice([1e-30, 1.0, 1e30], levels)
    x = rng.choice(np.concatenate([values, SPECIAL]), shape)
    return x.astype(np.float32)


@pytest.mark.parametrize("seed", range(3))
def test_keys_order_floats_as_floats_order_and_map_back_bit_for_bit(seed):
    x = jnp.asarray(rows_with_ties(seed, (4, 3000), levels=40))
    keys = sort_keys(x)
    assert keys.dtype == jnp.int32
    assert np.array_equal(np.asarray(from_sort_keys(keys)).view(np.int32), np.asarray(x).view(np.int32))
    assert np.array_equal(np.asarray(sorted_descending(x)), np.asarray(jnp.sort(x, axis=-1)[:, ::-1]))
    by_key = np.take_along_axis(np.asarray(x), np.argsort(np.asarray(keys), axis=-1), axis=-1)
    assert np.all(by_key[:, 1:] >= by_key[:, :-1])


@pytest.mark.parametrize("k", [1, 7, 16, 17, 20, 40])
def test_top_k_in_parts_is_top_k_ties_included(k):
    x = jnp.asarray(rows_with_ties(k, (5, 1500), levels=12))
    x = jnp.where(jnp.isinf(x), 0.5, x)  # finite rows: every part's picks are new entries
    values, indices = top_k_in_parts(x, k)
    expected_values, expected_indices = jax.lax.top_k(x, k)
    assert np.array_equal(np.asarray(indices), np.asarray(expected_indices))
    assert np.array_equal(np.asarray(values), np.asarray(expected_values))
