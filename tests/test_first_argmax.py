"""first_argmax (the greedy pick of every step) against NumPy's argmax: first maximum, any width."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.sampling.sampler import first_argmax


@pytest.mark.parametrize("width", [7, 100, 256, 4096, 4104, 32001, 49152, 151936])
def test_first_maximum_of_random_rows_with_ties_and_small_value_sets(width: int) -> None:
    rng = np.random.default_rng(width)
    rows = rng.normal(size=(6, width)).astype(np.float32)
    rows[1] = rng.integers(0, 3, width)  # many ties at the top
    rows[2] = -np.inf  # a fully masked row: index 0
    rows[3, [width // 3, width - 1]] = 50.0  # a tie between an early entry and the last one
    rows[4, -1] = 50.0  # the maximum in the last entry
    rows[5, 0] = 50.0
    got = np.asarray(jax.jit(first_argmax)(jnp.asarray(rows)))
    np.testing.assert_array_equal(got, np.argmax(rows, axis=-1))
    assert got.dtype == np.int32


def test_leading_axes_and_rows_without_a_maximum() -> None:
    x = np.random.default_rng(0).normal(size=(3, 4, 512)).astype(np.float32)
    np.testing.assert_array_equal(first_argmax(jnp.asarray(x)), np.argmax(x, axis=-1))
    nan_row = np.full((1, 512), np.nan, np.float32)
    assert int(first_argmax(jnp.asarray(nan_row))[0]) == 512  # out of range, as the two-pass form gave
