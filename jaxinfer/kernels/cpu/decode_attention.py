"""Attention of a few queries over the contiguous KV cache on CPU (see decode_attention.cc)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.kernels.cpu.build import load

TARGET = "jaxinfer_decode_attention"
PAGED_TARGET = "jaxinfer_paged_decode_attention"
VALUE_DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2, "int8": 3}
MAX_QUERIES = 16  # per sequence; longer runs (prefill) are compute bound and stay with XLA's dots


def decode_attention_applies(num_queries: int, cache_dtype: jnp.dtype) -> bool:
    """Whether the kernel covers `num_queries` queries per sequence over a cache of `cache_dtype`.

    Only the shapes: whether kernels run at all is the cache's `cpu_kernels` field.
    """
    return 1 <= num_queries <= MAX_QUERIES and cache_dtype in (jnp.float32, jnp.bfloat16, jnp.float16)


def decode_attention(
    q: jax.Array, keys: jax.Array, values: jax.Array, positions: jax.Array, window: int, scale: float | None = None,
    chunk: int = 0,
) -> jax.Array:
    """q [B, T, H, D] over keys [B, KV, S, D] and values [B, KV, D, S] -> [B, T, H, D] in q's dtype.

    The query at positions[b, t] sees keys s <= positions[b, t] (within `window` when > 0, within its own
    `chunk` of positions when > 0).
    Queries are rounded to the cache dtype first, as the dense path does.
    """
    if not load("decode_attention.cc", "JaxinferDecodeAttention", TARGET):
        raise RuntimeError("the decode-attention CPU kernel is unavailable here (see the log); use cpu_kernels=False")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
    q32 = q.astype(keys.dtype).astype(jnp.float32)
    out = call(q32, keys, values, positions.astype(jnp.int32), scale=np.float32(scale), window=np.int64(window),
               chunk=np.int64(chunk))
    return out.astype(q.dtype)


def paged_decode_attention(
    q: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    page_table: jax.Array,
    positions: jax.Array,
    window: int,
    value_dtype: jnp.dtype,
    scale: float | None = None,
    k_scales: jax.Array | None = None,
    v_scales: jax.Array | None = None,
    chunk: int = 0,
) -> jax.Array:
    """q [B, T, H, D] over pools [KV, P, page, D] through page_table [B, W] -> [B, T, H, D] in q's dtype.

    The pools may hold 16-bit floats as uint16 bits; value_dtype names what they hold. int8 pools
    come with float32 scales [KV, P, page] (value = int8 * scale); q then keeps its own dtype.
    """
    if not load("decode_attention.cc", "JaxinferPagedDecodeAttention", PAGED_TARGET):
        raise RuntimeError("the decode-attention CPU kernel is unavailable here (see the log); use cpu_kernels=False")
    quantized = jnp.dtype(value_dtype) == jnp.int8
    if quantized != (k_scales is not None and v_scales is not None):
        raise ValueError(f"int8 pools need k_scales and v_scales, and only they take scales (value_dtype {value_dtype})")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    call = jax.ffi.ffi_call(PAGED_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
    q32 = q.astype(q.dtype if quantized else value_dtype).astype(jnp.float32)
    empty = jnp.zeros((0,), jnp.float32)
    out = call(
        q32, k_pool, v_pool, page_table.astype(jnp.int32), positions.astype(jnp.int32),
        empty if k_scales is None else k_scales, empty if v_scales is None else v_scales, scale=np.float32(scale),
        window=np.int64(window), chunk=np.int64(chunk), value_dtype=np.int64(VALUE_DTYPES[jnp.dtype(value_dtype).name]),
    )
    return out.astype(q.dtype)
