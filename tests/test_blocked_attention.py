"""Blocked attention over paged K/V against dense attention over each row's whole page table."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.models.attention import causal_window_mask, dense_attention
from jaxinfer.models.blocked_attention import BLOCK_KEYS, LOOPED_ROWS, QUERY_BLOCK, blocked_rows_attention, gather_pages

PAGE, WIDTH, KV, HEADS, DIM = 16, 40, 2, 4, 32  # 640 addressable keys: three blocks of 256


def _cache(seed: int, quantized: bool) -> PagedKVCache:
    """One layer of random pages (int8 with random scales when quantized); the table is set per call."""
    keys = jax.random.split(jax.random.key(seed), 4)
    num_pages = 3 * WIDTH
    shape = (KV, num_pages, PAGE, DIM)
    if not quantized:
        k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys[:2])
        return PagedKVCache([k], [v], None, None, jnp.zeros((1, WIDTH), jnp.int32))
    k, v = (jax.random.randint(key, shape, -127, 128).astype(jnp.int8) for key in keys[:2])
    ks, vs = (jax.random.uniform(key, shape[:3], jnp.float32, 0.001, 0.02) for key in keys[2:])
    return PagedKVCache([k], [v], [ks], [vs], jnp.zeros((1, WIDTH), jnp.int32))


def _dense(q, cache, window, lengths, table, query_lens, sinks=None, chunk=0):
    """Every row's whole table gathered, then one dense attention (the path blocks replace)."""
    k = gather_pages(cache, cache.k_pages, cache.k_scales, 0, table, jnp.float32).swapaxes(0, 1)
    v = gather_pages(cache, cache.v_pages, cache.v_scales, 0, table, jnp.float32).transpose(1, 0, 3, 2)
    steps = jnp.arange(q.shape[1])
    positions = (lengths - query_lens)[:, None] + steps[None, :]
    mask = causal_window_mask(positions, k.shape[2], window, chunk) & (steps[None, :] < query_lens[:, None])[..., None]
    return dense_attention(q, k, v, mask, sinks=sinks)


@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("rows", [LOOPED_ROWS, LOOPED_ROWS + 2], ids=["row_loops", "shared_loop"])
def test_blocked_equals_dense_on_random_rows(window, quantized, rows):
    _check_random_rows(window, quantized, rows)


def test_blocked_equals_dense_within_attention_chunks():
    """Llama 4's chunks of 40 keys (not a page or block multiple): rows whose queries cross chunk boundaries,
    sharing one key loop that starts at the earliest row's chunk."""
    _check_random_rows(0, False, LOOPED_ROWS + 2, chunk=40)


def _check_random_rows(window: int, quantized: bool, rows: int, chunk: int = 0) -> None:
    """Blocked and dense attention agree on rows ending in different key blocks, one of them padding."""
    rng = np.random.default_rng(window + quantized)
    cache = _cache(window + 7 * quantized, quantized)
    steps = 24
    # Rows end in different blocks (one past 2 x BLOCK_KEYS); one row is padding.
    lengths = np.array([30, BLOCK_KEYS + 5, 2 * BLOCK_KEYS + 90, 0, 7, BLOCK_KEYS - 1], np.int32)[:rows]
    query_lens = np.array([24, 1, 17, 0, 7, 3], np.int32)[:rows]
    table = np.stack([rng.permutation(3 * WIDTH)[:WIDTH] for _ in range(rows)]).astype(np.int32)
    q = jax.random.normal(jax.random.key(rows), (rows, steps, HEADS, DIM), jnp.float32)
    args = (jnp.asarray(lengths), jnp.asarray(table), jnp.asarray(query_lens))
    blocked = jax.jit(blocked_rows_attention, static_argnums=(2, 3, 7, 11))(q, cache, 0, window, *args, jnp.float32,
                                                                             None, None, None, chunk)
    dense = _dense(q, cache, window, *args, chunk=chunk)
    live = np.arange(steps)[None, :] < query_lens[:, None]
    np.testing.assert_allclose(np.asarray(blocked)[live], np.asarray(dense)[live], rtol=2e-5, atol=2e-5)
    assert np.isfinite(np.asarray(blocked)).all()  # padding rows stay finite


@pytest.mark.parametrize("window, steps", [(0, 2 * QUERY_BLOCK), (150, 2 * QUERY_BLOCK), (0, QUERY_BLOCK + 64)])
def test_long_chunks_split_into_query_blocks_equal_dense(window, steps):
    """Chunks over QUERY_BLOCK queries (a multiple, or a last block shorter than the rest): each
    query block stops at (or, windowed, starts near) its own keys."""
    rng = np.random.default_rng(window)
    cache = _cache(window, False)
    lengths = np.array([steps, WIDTH * PAGE - 3, steps + 40], np.int32)  # from 0; ending late; ragged
    query_lens = np.array([steps, steps, steps - 70], np.int32)
    table = np.stack([rng.permutation(3 * WIDTH)[:WIDTH] for _ in range(3)]).astype(np.int32)
    q = jax.random.normal(jax.random.key(window), (3, steps, HEADS, DIM), jnp.float32)
    args = (jnp.asarray(lengths), jnp.asarray(table), jnp.asarray(query_lens))
    blocked = jax.jit(blocked_rows_attention, static_argnums=(2, 3, 7))(q, cache, 0, window, *args, jnp.float32)
    dense = _dense(q, cache, window, *args)
    live = np.arange(steps)[None, :] < query_lens[:, None]
    np.testing.assert_allclose(np.asarray(blocked)[live], np.asarray(dense)[live], rtol=2e-5, atol=2e-5)


def test_padding_only_step_is_finite():
    cache = _cache(0, False)
    zeros = jnp.zeros(2, jnp.int32)
    out = blocked_rows_attention(
        jnp.ones((2, 3, HEADS, DIM)), cache, 0, 0, zeros, jnp.zeros((2, WIDTH), jnp.int32), zeros, jnp.float32
    )
    assert np.isfinite(np.asarray(out)).all()
