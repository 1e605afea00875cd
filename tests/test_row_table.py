"""Embedding lookups from a RowTable: exact rows, and no widened copy of the table in a decode loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models.norms import rms_norm
from jaxinfer.models.row_table import RowTable, as_row_table, full_table, take_rows

VOCAB, WIDTH = 16384, 256


def random_table(dtype) -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).standard_normal((VOCAB, WIDTH)), dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_rows_are_the_tables_rows_bit_for_bit(dtype) -> None:
    table = random_table(dtype)
    rows = as_row_table(table)
    ids = jnp.asarray([[0, 5, VOCAB - 1], [7, 7, 3]], jnp.int32)
    got = jax.jit(take_rows)(rows, ids)
    assert got.dtype == table.dtype and got.shape == (2, 3, WIDTH)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(table)[np.asarray(ids)])
    np.testing.assert_array_equal(np.asarray(full_table(rows)), np.asarray(table))


def decode_like_loop(table, tokens: jax.Array) -> jax.Array:
    """Eight steps of lookup + float32 norm, as a decode loop does them."""

    def body(i, carry):
        x = take_rows(table, carry[:, None])[:, 0]
        h = rms_norm(x, jnp.ones((WIDTH,), x.dtype), 1e-6)
        return (jnp.argmax(h.astype(jnp.float32), axis=-1) + i) % VOCAB

    return jax.lax.fori_loop(0, 8, body, tokens)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the widened copy is XLA:CPU's (no bf16 gather)")
def test_decode_loop_keeps_no_copy_of_the_table() -> None:
    """The lookup must not make XLA:CPU convert the whole bf16 table (it would hoist that out of the loop)."""
    rows = as_row_table(random_table(jnp.bfloat16))
    assert isinstance(rows, RowTable)
    compiled = jax.jit(decode_like_loop).lower(rows, jnp.zeros((4,), jnp.int32)).compile()
    table_bytes = VOCAB * WIDTH * 2
    assert compiled.memory_analysis().temp_size_in_bytes < table_bytes / 4
