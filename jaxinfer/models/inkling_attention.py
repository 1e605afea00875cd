"""Inkling's attention: no rotary embedding; each query's scores biased by a relative position bias it mixes from
its own hidden state.

Per head h the query token's relative state r_h = r_proj(x) (d_rel values) weighs a learned bank of bias-by-distance
profiles (`rel_table` [d_rel, E]): bias(q, s) = (r_h @ rel_table)[p - s] for a key s at distance p - s in [0, E),
zero beyond (E: `rel_extent` on the full layers, the window on the sliding ones). Scores are q . k / head_dim (q and
k RMS-normed per head) plus that bias; on the full layers past `log_scaling_n_floor` both are scaled by
tau = 1 + alpha log((p + 1) / floor).

The bias depends on the query's state and each key's distance, so neither the Pallas kernels nor the native CPU
kernels take it: the scores are formed over every position a query's row holds, on XLA (`dense_attention` with its
`bias`): the whole-sequence pass over its contiguous cache; an engine step per block of `BLOCK` tokens, each
token's row gathered from the pages (`blocked_attention.gather_pages`, dequantized where the pages are), as
DeepSeek Sparse Attention's index scores are (models/sparse_latent_attention). A step costs O(tokens x max_seq_len).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.models.attention import causal_window_mask, dense_attention
from jaxinfer.models.blocked_attention import gather_pages

BLOCK = 16  # query tokens of an engine step attending at once, at most
GATHER_BUDGET = 1 << 26  # float values a block's gathered keys may hold (256 MiB in float32)


def relative_bias(rel: jax.Array, table: jax.Array, positions: jax.Array, kv_len: int) -> jax.Array:
    """rel [B, T, H, R] through table [R, E] -> each query's bias over keys 0..kv_len-1: [B, T, H, S] float32."""
    logits = jnp.einsum("bthr,re->bthe", rel.astype(jnp.float32), table.astype(jnp.float32))
    distance = positions[..., None] - jnp.arange(kv_len)  # [B, T, S]
    extent = table.shape[1]
    index = jnp.broadcast_to(jnp.clip(distance, 0, extent - 1)[:, :, None, :], (*logits.shape[:3], kv_len))
    bias = jnp.take_along_axis(logits, index, axis=-1)
    return jnp.where(((distance >= 0) & (distance < extent))[:, :, None, :], bias, 0.0)


def log_scale(positions: jax.Array, floor: int, alpha: float) -> jax.Array:
    """tau [B, T] float32: 1 + alpha log(max((p + 1) / floor, 1))."""
    effective = (positions + 1).astype(jnp.float32)
    return 1.0 + alpha * jnp.log(jnp.maximum(effective / floor, 1.0))


def _grouped(bias: jax.Array, kv_heads: int) -> jax.Array:
    """[B, T, H, S] -> dense_attention's bias layout [B, KV, G, T, S]."""
    b, t, h, s = bias.shape
    return bias.reshape(b, t, kv_heads, h // kv_heads, s).transpose(0, 2, 3, 1, 4)


def biased_attention(q: jax.Array, k: jax.Array, v: jax.Array, rel: jax.Array, table: jax.Array,
                     positions: jax.Array, window: int, tau: jax.Array | None) -> jax.Array:
    """q [B, T, H, K] at positions [B, T] over k [B, KV, S, K] and v [B, KV, K, S] (keys at positions 0..S-1),
    scaled by 1 / K, biased, windowed, tau-scaled where given: [B, T, H, K]."""
    bias = relative_bias(rel, table, positions, k.shape[2])
    if tau is not None:
        q = (q.astype(jnp.float32) * tau[..., None, None]).astype(q.dtype)
        bias = bias * tau[..., None, None]
    mask = causal_window_mask(positions, k.shape[2], window)
    return dense_attention(q, k, v, mask, 1.0 / q.shape[-1], bias=_grouped(bias, k.shape[1]))


def _row_block(q: jax.Array, rel: jax.Array, positions: jax.Array, tables: jax.Array, cache: RaggedPagedCache,
               layer: int, table: jax.Array, window: int, tau: jax.Array | None) -> jax.Array:
    """One block of tokens, each its own row: q [n, H, K], rel [n, H, R], positions [n], tables [n, W]."""
    pages = cache.pages
    dtype = q.dtype if pages.quantized else pages.value_dtype
    scales = (pages.k_scales, pages.v_scales) if pages.quantized else (None, None)
    k = gather_pages(pages, pages.k_pages, scales[0], layer, tables, dtype).transpose(1, 0, 2, 3)  # [n, KV, S, K]
    v = gather_pages(pages, pages.v_pages, scales[1], layer, tables, dtype).transpose(1, 0, 3, 2)  # [n, KV, K, S]
    out = biased_attention(q[:, None], k, v.astype(q.dtype), rel[:, None], table, positions[:, None], window,
                           None if tau is None else tau[:, None])
    return out[:, 0]


def block_tokens(tokens: int, capacity: int, kv_heads: int, head_dim: int) -> int:
    """Tokens per block: BLOCK, fewer where their gathered keys and values would pass GATHER_BUDGET, at least 1."""
    return max(1, min(BLOCK, tokens, GATHER_BUDGET // (2 * capacity * kv_heads * head_dim)))


def cached_attention(q: jax.Array, rel: jax.Array, table: jax.Array, cache: KVCache | RaggedPagedCache, layer: int,
                     positions: jax.Array, window: int, tau: jax.Array | None) -> jax.Array:
    """q [B, T, H, K] and rel [B, T, H, R] at positions [B, T] over `layer` of the cache after this step's keys and
    values were written: the whole-sequence pass's contiguous cache, or an engine step's ragged view (B = 1)."""
    if isinstance(cache, KVCache):
        k, v = cache.k[layer], cache.v[layer]
        if cache.quantized:
            raise ValueError("kv_dtype 'fp8' is not supported for Inkling's whole-sequence pass (its relative "
                             "position bias runs on XLA's dense path); use kv_dtype 'auto'")
        return biased_attention(q, k, v, rel, table, positions, window, tau)
    if not isinstance(cache, RaggedPagedCache):
        raise ValueError(f"Inkling's attention reads a contiguous cache or an engine step's pages, not a "
                         f"{type(cache).__name__}")
    tokens, tables = q.shape[1], cache.token_tables()
    kv_heads, head_dim = cache.pages.k_pages[layer].shape[0], q.shape[-1]
    block = block_tokens(tokens, tables.shape[1] * cache.pages.page_size, kv_heads, head_dim)
    count = -(-tokens // block)

    def blocks(x: jax.Array, fill: int = 0) -> jax.Array:
        x = jnp.pad(x, [(0, count * block - tokens)] + [(0, 0)] * (x.ndim - 1), constant_values=fill)
        return x.reshape(count, block, *x.shape[1:])

    taus = jnp.ones((tokens,), jnp.float32) if tau is None else tau[0]
    parts = (blocks(q[0]), blocks(rel[0]), blocks(positions[0], -1), blocks(tables), blocks(taus))
    out = jax.lax.map(lambda p: _row_block(*p[:4], cache, layer, table, window, None if tau is None else p[4]),
                      parts)
    return out.reshape(count * block, *out.shape[2:])[:tokens][None]
