"""In-place KV-cache write on CPU (see cache_write.cc); the contiguous cache uses it when its `cpu_kernels` is set."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu.build import load

TARGET = "jaxinfer_cache_write"


def write_positions(cache: jax.Array, updates: jax.Array, positions: jax.Array, transposed: bool) -> jax.Array:
    """cache [B, KV, S, K] (or [B, KV, K, S] if transposed) with updates [B, T, KV, K] stored at positions [B, T].

    Positions outside [0, S) are dropped. The result reuses the cache's buffer.
    """
    if not load("cache_write.cc", "JaxinferCacheWrite", TARGET):
        raise RuntimeError("the cache-write CPU kernel is unavailable here (see the log); use cpu_kernels=False")
    call = jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct(cache.shape, cache.dtype), input_output_aliases={0: 0}, vmap_method="sequential"
    )
    return call(cache, updates.astype(cache.dtype), positions.astype(jnp.int32), transposed=transposed)
