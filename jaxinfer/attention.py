"""One attention interface over whatever KV cache the model carries.

`attend` reads the cache after the current step's K/V were written, so a query at position p
sees keys 0..p (within the layer's sliding window). The reference path is plain `jnp`; the
paged cache dispatches to the Pallas kernels in `pallas_kernels/`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.kv_cache import KVCache

NEG_INF = -1e30  # finite, so fully-masked rows (padding) give zeros-safe softmax, not NaN


def causal_window_mask(q_positions: jax.Array, kv_len: int, window: int) -> jax.Array:
    """[B, T, S] bool: key s is visible to the query at position p iff s <= p and p - s < window (if > 0)."""
    s = jnp.arange(kv_len)[None, None, :]
    p = q_positions[:, :, None]
    visible = s <= p
    return visible & (p - s < window) if window > 0 else visible


def dense_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float | None = None
) -> jax.Array:
    """GQA attention: q [B,T,H,K], k/v [B,S,KV,K], mask [B,T,S] -> [B,T,H,K]; softmax in float32."""
    b, t, h, d = q.shape
    kv_heads = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    qg = q.reshape(b, t, kv_heads, h // kv_heads, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(q.dtype)).astype(jnp.float32) * scale
    scores = jnp.where(mask[:, None, None, :, :], scores, NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(q.dtype))
    return out.reshape(b, t, h, d)


def attend(
    q: jax.Array, cache: KVCache, layer: int, positions: jax.Array, window: int
) -> jax.Array:
    """Attention of q [B, T, H, K] at positions [B, T] over `layer` of the cache."""
    k, v = cache.layer_kv(layer)
    mask = causal_window_mask(positions, k.shape[1], window)
    return dense_attention(q, k, v, mask)
