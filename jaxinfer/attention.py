"""One attention interface over whatever KV cache the model carries.

`attend` reads the cache after the current step's K/V were written, so a query at position p
sees keys 0..p (within the layer's sliding window). The contiguous cache uses the dense `jnp`
path, or on CPU for a few queries per sequence (decode, verification) a native kernel that
reads only the visible keys; the paged cache dispatches to `pallas_kernels` (the Pallas kernel, or its `jnp`
reference, as the cache's backend says). Queries of one call sit at consecutive positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas_kernels
from jaxinfer.cpu_kernels import decode_attention, decode_attention_applies
from jaxinfer.kv_cache import KVCache
from jaxinfer.paged_kv_cache import PagedKVCache

NEG_INF = -1e30  # finite, so fully-masked rows (padding) give a uniform softmax, not NaN
ATTENTION_BACKENDS = ("auto", "reference", "pallas")


def resolve_backend(name: str) -> str:
    """"auto" -> Pallas kernels on TPU/GPU, the jnp reference on CPU."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend {name!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
    if name == "auto":
        return "reference" if jax.default_backend() == "cpu" else "pallas"
    return name


def causal_window_mask(q_positions: jax.Array, kv_len: int, window: int) -> jax.Array:
    """[B, T, S] bool: key s is visible to the query at position p iff s <= p and p - s < window (if > 0)."""
    s = jnp.arange(kv_len)[None, None, :]
    p = q_positions[:, :, None]
    visible = s <= p
    return visible & (p - s < window) if window > 0 else visible


def dense_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float | None = None
) -> jax.Array:
    """GQA attention: q [B,T,H,K], k [B,KV,S,K], v [B,KV,K,S], mask [B,T,S] -> [B,T,H,K]; f32 softmax."""
    b, t, h, d = q.shape
    kv_heads = k.shape[1]
    scale = d**-0.5 if scale is None else scale
    qg = q.reshape(b, t, kv_heads, h // kv_heads, d).astype(k.dtype)
    # float32 results keep bf16 operands on XLA:CPU's bf16 dot path (see layers.linear).
    scores = jnp.einsum("btkgd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask[:, None, None, :, :], scores, NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bkds->btkgd", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(b, t, h, d).astype(q.dtype)


def paged_attend(q: jax.Array, cache: PagedKVCache, layer: int, positions: jax.Array, window: int) -> jax.Array:
    """Attention over the paged cache: the decode kernel for one query, the ragged one for several."""
    lengths = positions[:, -1] + 1
    backend = "reference" if cache.backend == "reference" else None
    scales = dict(k_scales=cache.k_scales[layer], v_scales=cache.v_scales[layer]) if cache.quantized else {}
    common = dict(sliding_window=window or None, interpret=cache.interpret, backend=backend, **scales)
    kv = (cache.k_pages[layer], cache.v_pages[layer])
    if q.shape[1] == 1:
        out = pallas_kernels.paged_attention(q[:, 0], *kv, lengths, cache.page_table, **common)
        return out[:, None]
    query_lens = jnp.full_like(lengths, q.shape[1])
    return pallas_kernels.ragged_paged_attention(q, *kv, lengths, cache.page_table, query_lens, **common)


def attend(
    q: jax.Array, cache: KVCache | PagedKVCache, layer: int, positions: jax.Array, window: int
) -> jax.Array:
    """Attention of q [B, T, H, K] at positions [B, T] over `layer` of the cache."""
    if isinstance(cache, PagedKVCache):
        return paged_attend(q, cache, layer, positions, window)
    k, v = cache.k[layer], cache.v[layer]
    if cache.cpu_kernels and decode_attention_applies(q.shape[1], k.dtype):
        return decode_attention(q, k, v, positions, window)
    return dense_attention(q, k, v, causal_window_mask(positions, k.shape[2], window))
