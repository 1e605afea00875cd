"""Attention sinks (GPT-OSS): every jnp path and the GPU kernel against the definition; the kernels that have
none (native CPU, TPU) routed around.

The definition is transformers': the sink logit joins each head's scores as one more column of the
softmax, whose probability is then dropped (a key with a zero value).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_blocked_attention import DIM, HEADS, KV, PAGE, WIDTH, _cache, _dense

import pallas_kernels
from jaxinfer.models.attention import causal_window_mask, dense_attention, native_kernel_applies
from jaxinfer.models.blocked_attention import (
    NEG_INF,
    blocked_rows_attention,
    blocked_token_attention,
    softmax_with_sinks,
)

SINKS = jnp.array([2.0, -1.0, 0.5, 4.0], jnp.float32)  # one per query head; large ones take most of the mass


def by_definition(scores: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """softmax([scores, sink])[..., :-1] with the sink broadcast over the last axis."""
    joined = np.concatenate([scores, np.broadcast_to(sinks, scores[..., :1].shape)], axis=-1)
    joined = np.exp(joined - joined.max(-1, keepdims=True))
    return (joined / joined.sum(-1, keepdims=True))[..., :-1]


def test_softmax_with_sinks_is_the_definition_and_fully_masked_rows_stay_finite():
    scores = np.array(jax.random.normal(jax.random.key(0), (4, 3, 9)) * 3)
    scores[1, 2] = NEG_INF  # a query that sees no key
    sinks = np.asarray(SINKS)[:, None, None]
    got = np.asarray(softmax_with_sinks(jnp.asarray(scores), jnp.asarray(sinks)))
    np.testing.assert_allclose(got, by_definition(scores, sinks), rtol=1e-6, atol=1e-7)
    assert np.isfinite(got).all() and np.all(got[1, 2] == 0)
    assert np.all(got.sum(-1) < 1)  # the sinks keep a share
    np.testing.assert_array_equal(np.asarray(softmax_with_sinks(jnp.asarray(scores), None)),
                                  np.asarray(jax.nn.softmax(jnp.asarray(scores), axis=-1)))


def test_dense_attention_with_sinks_is_the_definition():
    b, t, s = 2, 5, 7
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (b, t, HEADS, DIM))
    k = jax.random.normal(keys[1], (b, KV, s, DIM))
    v = jax.random.normal(keys[2], (b, KV, DIM, s))
    positions = jnp.broadcast_to(jnp.arange(2, 2 + t), (b, t))
    mask = causal_window_mask(positions, s, 0)
    got = np.asarray(dense_attention(q, k, v, mask, sinks=SINKS))
    group = HEADS // KV
    qg = np.asarray(q).reshape(b, t, KV, group, DIM)
    scores = np.einsum("btkgd,bksd->bkgts", qg, np.asarray(k)) * DIM**-0.5
    scores = np.where(np.asarray(mask)[:, None, None], scores, -np.inf)
    probs = by_definition(scores, np.asarray(SINKS).reshape(1, KV, group, 1, 1))
    expected = np.einsum("bkgts,bkds->btkgd", probs, np.asarray(v)).reshape(b, t, HEADS, DIM)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _rows(rows: int, seed: int) -> tuple[jax.Array, ...]:
    """Random rows over the blocked tests' pages: q [rows, T, H, K], lengths, table, query_lens (one padding row)."""
    rng = np.random.default_rng(seed)
    steps = 6 if rows > 1 else 1
    lengths = np.array([30, 300, 7, 0, 130, 2], np.int32)[:rows]
    query_lens = np.minimum(np.array([6, 1, 7, 0, 3, 2], np.int32)[:rows], steps)
    table = np.stack([rng.permutation(3 * WIDTH)[:WIDTH] for _ in range(rows)]).astype(np.int32)
    q = jax.random.normal(jax.random.key(seed), (rows, steps, HEADS, DIM), jnp.float32)
    return q, jnp.asarray(lengths), jnp.asarray(table), jnp.asarray(query_lens)


@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("quantized", [False, True])
def test_blocked_and_reference_paged_attention_with_sinks_equal_dense(window, quantized):
    """The CPU's blocked attention (rows and one-query tokens) and the Pallas kernels' jnp reference."""
    cache = _cache(3 + window, quantized)
    q, lengths, table, query_lens = _rows(6, window)
    dense = np.asarray(_dense(q, cache, window, lengths, table, query_lens, SINKS))
    live = np.arange(q.shape[1])[None, :] < np.asarray(query_lens)[:, None]
    rows = jax.jit(blocked_rows_attention, static_argnums=(2, 3, 7))(
        q, cache, 0, window, lengths, table, query_lens, jnp.float32, None, None, SINKS)
    np.testing.assert_allclose(np.asarray(rows)[live], dense[live], rtol=2e-5, atol=2e-5)
    scales = dict(k_scales=cache.k_scales[0], v_scales=cache.v_scales[0]) if quantized else {}
    reference = pallas_kernels.ragged_paged_attention(
        q, cache.k_pages[0], cache.v_pages[0], lengths, table, query_lens, sliding_window=window or None,
        backend="reference", sinks=SINKS, **scales)
    np.testing.assert_allclose(np.asarray(reference)[live], dense[live], rtol=2e-5, atol=2e-5)
    one = jnp.minimum(query_lens, 1)  # each row's last query alone: the engine's one-query rows
    last = q[jnp.arange(6), jnp.maximum(query_lens - 1, 0)][:, None]
    tokens = blocked_token_attention(last, cache, 0, window, lengths, table, one, jnp.float32, None, None, SINKS)
    expected = np.asarray(_dense(last, cache, window, lengths, table, one, SINKS))
    np.testing.assert_allclose(np.asarray(tokens)[np.asarray(one) > 0], expected[np.asarray(one) > 0],
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("quantized", [False, True])
def test_gpu_kernel_with_sinks_equals_the_reference(splits, quantized):
    """The Triton kernel (interpreted) adds the sinks when it combines its partial results, split or not."""
    cache = _cache(11, quantized)
    q, lengths, table, query_lens = _rows(6, 5)
    scales = dict(k_scales=cache.k_scales[0], v_scales=cache.v_scales[0]) if quantized else {}
    pools = (cache.k_pages[0], cache.v_pages[0])
    run = functools.partial(pallas_kernels.ragged_paged_attention, sliding_window=20, sinks=SINKS, **scales)
    kernel = run(q, *pools, lengths, table, query_lens, backend="gpu", interpret=True, num_splits=splits)
    reference = run(q, *pools, lengths, table, query_lens, backend="reference")
    np.testing.assert_allclose(np.asarray(kernel), np.asarray(reference), rtol=2e-5, atol=2e-5)
    decode = functools.partial(pallas_kernels.paged_attention, q[:, 0], *pools, jnp.maximum(lengths, 1), table,
                               sinks=SINKS, **scales)
    np.testing.assert_allclose(np.asarray(decode(backend="gpu", interpret=True, num_splits=splits)),
                               np.asarray(decode(backend="reference")), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("quantized", [False, True])
def test_tpu_kernel_with_sinks_equals_the_reference(quantized):
    """The Mosaic kernel (TPU interpret mode) starts each row's online softmax from its sink."""
    dim = 64  # the TPU kernel's head sizes are multiples of 64
    keys = jax.random.split(jax.random.key(3), 3)
    shape = (KV, 3 * 4, PAGE, dim)
    k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys[:2])
    scales = {}
    if quantized:  # int8 pages with per-token scales
        (k, k_scales), (v, v_scales) = pallas_kernels.quantize_kv(k), pallas_kernels.quantize_kv(v)
        scales = dict(k_scales=k_scales, v_scales=v_scales)
    lengths, query_lens = jnp.array([20, 45, 3], jnp.int32), jnp.array([4, 1, 3], jnp.int32)
    table = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    q = jax.random.normal(keys[2], (3, 4, HEADS, dim), jnp.float32)
    run = functools.partial(pallas_kernels.ragged_paged_attention, q, k, v, lengths, table, query_lens,
                            sliding_window=30, sinks=SINKS, **scales)
    np.testing.assert_allclose(np.asarray(run(backend="tpu", interpret=True)), np.asarray(run(backend="reference")),
                               rtol=2e-5, atol=2e-5)


def test_layers_with_sinks_leave_the_native_cpu_kernels():
    """The native CPU kernels have no sinks: such layers take XLA's path."""
    assert native_kernel_applies(None) and not native_kernel_applies(None, SINKS)
    assert not native_kernel_applies(5.0)
