"""ALiBi (BLOOM, MPT): the CPU's blocked path and the Pallas kernels' jnp reference against the dense path (itself
checked against transformers by test_hf_parity's BLOOM and MPT), the slopes against transformers' tables, and the
native CPU kernels routed around.

ALiBi: each head's scaled scores plus slope * (key position - query position), then the masked softmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from test_blocked_attention import DIM, HEADS, KV, _cache

import pallas_kernels
from jaxinfer.models.alibi import bloom_slopes, mpt_slopes
from jaxinfer.models.attention import (
    _rows_kernel,
    causal_window_mask,
    dense_alibi_bias,
    dense_attention,
    native_kernel_applies,
)
from jaxinfer.models.blocked_attention import blocked_rows_attention, gather_pages

SLOPES = jnp.asarray(bloom_slopes(HEADS), jnp.float32)  # 4 heads: 1/4, 1/16, 1/64, 1/256


def test_slopes_are_transformers_tables():
    """BLOOM's and MPT's rules (powers of two, and the interleaved ones of other head counts), values
    transformers' `build_alibi_tensor` / `build_mpt_alibi_tensor` give."""
    assert bloom_slopes(4) == (0.25, 0.0625, 0.015625, 0.00390625)
    np.testing.assert_allclose(bloom_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    assert mpt_slopes(4) == (0.25, 0.0625, 0.015625, 0.00390625)
    np.testing.assert_allclose(mpt_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    np.testing.assert_allclose(mpt_slopes(4, bias_max=16), [2**-4, 2**-8, 2**-12, 2**-16])


def test_blocked_rows_and_paged_reference_with_alibi_equal_dense():
    """The CPU's blocked attention, the kernels' jnp reference and (on the short row) the GPU kernel as attend
    calls it: rows at different offsets over paged keys, one crossing a key block (300 keys: blocks of 256), one
    padding. (The one-query rows of decode steps run in test_families' BLOOM engine test.)"""
    cache = _cache(5, False)
    rng = np.random.default_rng(0)
    lengths, query_lens = jnp.array([300, 0, 7], jnp.int32), jnp.array([3, 0, 7], jnp.int32)
    table = jnp.asarray(np.stack([rng.permutation(cache.k_pages[0].shape[1])[:40] for _ in range(3)]), jnp.int32)
    q = jax.random.normal(jax.random.key(2), (3, 7, HEADS, DIM), jnp.float32)
    k = gather_pages(cache, cache.k_pages, None, 0, table, jnp.float32).swapaxes(0, 1)
    v = gather_pages(cache, cache.v_pages, None, 0, table, jnp.float32).transpose(1, 0, 3, 2)
    positions = (lengths - query_lens)[:, None] + jnp.arange(7)[None, :]
    mask = causal_window_mask(positions, k.shape[2], 0) & (jnp.arange(7)[None, :] < query_lens[:, None])[..., None]
    dense = np.asarray(dense_attention(q, k, v, mask, bias=dense_alibi_bias(SLOPES, positions, k.shape[2], KV)))
    live = np.arange(7)[None, :] < np.asarray(query_lens)[:, None]
    rows = jax.jit(blocked_rows_attention, static_argnums=(2, 3, 7))(q, cache, 0, 0, lengths, table, query_lens,
                                                                      jnp.float32, alibi=SLOPES)
    np.testing.assert_allclose(np.asarray(rows)[live], dense[live], rtol=2e-5, atol=2e-5)
    reference = pallas_kernels.ragged_paged_attention(q, cache.k_pages[0], cache.v_pages[0], lengths, table,
                                                      query_lens, backend="reference", alibi_slopes=SLOPES)
    np.testing.assert_allclose(np.asarray(reference)[live], dense[live], rtol=2e-5, atol=2e-5)
    # attend's kernel call hands the slopes on: the Triton kernel, interpreted, through `_rows_kernel` (the short row)
    kernel = _rows_kernel(q[2:], cache.k_pages[0], cache.v_pages[0], lengths[2:], table[2:, :1], query_lens[2:],
                          window=0, interpret=True, backend="gpu", alibi=SLOPES)
    np.testing.assert_allclose(np.asarray(kernel)[0], dense[2], rtol=2e-5, atol=2e-5)


def test_alibi_layers_leave_the_native_cpu_kernels():
    """The native CPU kernels take no slopes: such layers take XLA's path."""
    assert native_kernel_applies(None) and not native_kernel_applies(None, None, SLOPES)
