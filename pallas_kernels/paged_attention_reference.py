"""Pure-jnp paged attention: the test oracle and the CPU fallback.

Decode attention is ragged attention with one query per sequence, so both entry
points share one implementation. Softmax runs in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels._paged_common import default_sm_scale, validate_paged_inputs


def _gather_pages(
    pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    scales: jax.Array | None,  # [num_kv_heads, num_pages, page_size]
    page_indices: jax.Array,  # [batch, pages_per_seq]
) -> jax.Array:
    """[batch, num_kv_heads, pages_per_seq * page_size, head_dim] f32, dequantized."""
    num_kv_heads, _, page_size, head_dim = pages.shape
    batch, pages_per_seq = page_indices.shape
    gathered = pages[:, page_indices].astype(jnp.float32)  # [kvh, b, pps, ps, d]
    if scales is not None:
        gathered = gathered * scales[:, page_indices][..., None]
    gathered = gathered.reshape(num_kv_heads, batch, pages_per_seq * page_size, head_dim)
    return gathered.transpose(1, 0, 2, 3)


def _ragged_mask(
    lengths: jax.Array,  # [batch]
    query_lens: jax.Array,  # [batch]
    max_q: int,
    num_keys: int,
    sliding_window: int | None,
    attention_chunk: int | None = None,
) -> jax.Array:
    """[batch, max_q, num_keys] bool: which key each query attends."""
    query_idx = jnp.arange(max_q)[None, :, None]
    key_pos = jnp.arange(num_keys)[None, None, :]
    query_pos = (lengths - query_lens)[:, None, None] + query_idx
    mask = (query_idx < query_lens[:, None, None]) & (key_pos <= query_pos)
    if sliding_window is not None:
        mask = mask & (query_pos - key_pos < sliding_window)
    if attention_chunk is not None:
        mask = mask & (key_pos // attention_chunk == query_pos // attention_chunk)
    return mask


def _softmax(logits: jax.Array, sinks: jax.Array | None, num_kv_heads: int) -> jax.Array:
    """Softmax of logits [b, kv, g, q, s] over keys; with sinks, each head's sink logit is one more
    key whose value is zero (it only takes its share of the mass)."""
    if sinks is None:
        return jax.nn.softmax(logits, axis=-1)
    sink = sinks.astype(jnp.float32).reshape(num_kv_heads, -1)[None, :, :, None, None]
    best = jnp.maximum(logits.max(-1, keepdims=True), sink)
    weights = jnp.exp(logits - best)
    return weights / (weights.sum(-1, keepdims=True) + jnp.exp(sink - best))


def _alibi(
    slopes: jax.Array, lengths: jax.Array, query_lens: jax.Array, max_q: int, num_keys: int, num_kv_heads: int
) -> jax.Array:
    """[b, kv, g, q, s] f32 ALiBi bias: each head's slope times (key position - query position)."""
    query_pos = (lengths - query_lens)[:, None] + jnp.arange(max_q)[None, :]  # [b, q]
    distance = jnp.arange(num_keys)[None, None, :] - query_pos[:, :, None]  # [b, q, s]
    slope = slopes.astype(jnp.float32).reshape(num_kv_heads, -1)[None, :, :, None, None]
    return slope * distance[:, None, None].astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("sm_scale", "soft_cap", "sliding_window", "attention_chunk"))
def ragged_paged_attention_reference(
    q: jax.Array,  # [batch, max_q, num_q_heads, head_dim]
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    lengths: jax.Array,  # [batch] int32, tokens in each sequence (queries included)
    page_indices: jax.Array,  # [batch, pages_per_seq] int32
    query_lens: jax.Array,  # [batch] int32, valid queries: the last query_lens[b] tokens
    *,
    sm_scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    attention_chunk: int | None = None,  # Llama 4: a query sees only its own chunk of positions
    k_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    v_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    sinks: jax.Array | None = None,  # [num_q_heads]: attention-sink logits (keys without values)
    alibi_slopes: jax.Array | None = None,  # [num_q_heads]: ALiBi slopes, score + slope * (key pos - query pos)
) -> jax.Array:
    """Causal multi-query paged attention; rows i >= query_lens[b] are zeros."""
    batch, max_q, num_q_heads, head_dim = q.shape
    validate_paged_inputs(
        num_q_heads, head_dim, k_pages, v_pages, k_scales, v_scales, sliding_window
    )
    num_kv_heads = k_pages.shape[0]
    group = num_q_heads // num_kv_heads
    k = _gather_pages(k_pages, k_scales, page_indices)
    v = _gather_pages(v_pages, v_scales, page_indices)
    mask = _ragged_mask(lengths, query_lens, max_q, k.shape[2], sliding_window, attention_chunk)
    # Keys nobody attends may be stale or uninitialised pages: keep their NaNs out.
    needed = jnp.any(mask, axis=1)[:, None, :, None]
    k = jnp.where(needed, k, 0.0)
    v = jnp.where(needed, v, 0.0)

    q5 = q.astype(jnp.float32).reshape(batch, max_q, num_kv_heads, group, head_dim)
    hi = jax.lax.Precision.HIGHEST
    logits = jnp.einsum("bqkgd,bksd->bkgqs", q5, k, precision=hi)
    logits = logits * default_sm_scale(head_dim, sm_scale)
    if soft_cap is not None:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    if alibi_slopes is not None:
        logits = logits + _alibi(alibi_slopes, lengths, query_lens, max_q, k.shape[2], num_kv_heads)
    logits = jnp.where(mask[:, None, None], logits, -jnp.inf)
    row_valid = jnp.any(mask, axis=-1)[:, None, None, :, None]
    weights = _softmax(jnp.where(row_valid, logits, 0.0), sinks, num_kv_heads)
    weights = jnp.where(row_valid, weights, 0.0)
    out = jnp.einsum("bkgqs,bksd->bqkgd", weights, v, precision=hi)
    return out.reshape(batch, max_q, num_q_heads, head_dim).astype(q.dtype)


def paged_attention_reference(
    q: jax.Array,  # [batch, num_q_heads, head_dim]
    k_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, num_pages, page_size, head_dim]
    lengths: jax.Array,  # [batch] int32, >= 1
    page_indices: jax.Array,  # [batch, pages_per_seq] int32
    *,
    sm_scale: float | None = None,
    soft_cap: float | None = None,
    sliding_window: int | None = None,
    attention_chunk: int | None = None,  # Llama 4: a query sees only its own chunk of positions
    k_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    v_scales: jax.Array | None = None,  # [num_kv_heads, num_pages, page_size] f32
    sinks: jax.Array | None = None,  # [num_q_heads]
    alibi_slopes: jax.Array | None = None,  # [num_q_heads]
) -> jax.Array:
    """Decode attention of the token at position lengths-1: [batch, num_q_heads, head_dim]."""
    query_lens = jnp.ones_like(lengths)
    out = ragged_paged_attention_reference(
        q[:, None], k_pages, v_pages, lengths, page_indices, query_lens,
        sm_scale=sm_scale, soft_cap=soft_cap, sliding_window=sliding_window, attention_chunk=attention_chunk,
        k_scales=k_scales, v_scales=v_scales, sinks=sinks, alibi_slopes=alibi_slopes,
    )
    return out[:, 0]
