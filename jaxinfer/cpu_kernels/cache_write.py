"""In-place KV-cache write on CPU (see cache_write.cc), and when the contiguous cache should use it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.cpu_kernels.build import load

TARGET = "jaxinfer_cache_write"


def cache_write_applies() -> bool:
    """On a single CPU device, when the kernel builds; elsewhere the cache keeps XLA's scatter."""
    return (
        jax.default_backend() == "cpu"
        and jax.device_count() == 1
        and load("cache_write.cc", "JaxinferCacheWrite", TARGET)
    )


def write_positions(cache: jax.Array, updates: jax.Array, positions: jax.Array, transposed: bool) -> jax.Array:
    """cache [B, KV, S, K] (or [B, KV, K, S] if transposed) with updates [B, T, KV, K] stored at positions [B, T].

    Positions outside [0, S) are dropped. The result reuses the cache's buffer.
    """
    call = jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct(cache.shape, cache.dtype), input_output_aliases={0: 0}, vmap_method="sequential"
    )
    return call(cache, updates.astype(cache.dtype), positions.astype(jnp.int32), transposed=transposed)
