"""KV quantization (int8, fp8 e4m3) with one absmax scale per token per head."""

from __future__ import annotations

import jax
import jax.numpy as jnp

INT8_MAX = 127.0
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_kv(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[..., head_dim] float -> (int8 [..., head_dim], f32 scales [...]); x ~= int8 * scale."""
    x32 = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(x32), axis=-1)
    # An all-zero vector keeps scale 1 so dequantization never divides by zero.
    scales = jnp.where(absmax > 0.0, absmax / INT8_MAX, 1.0)
    values = jnp.clip(jnp.round(x32 / scales[..., None]), -INT8_MAX, INT8_MAX)
    return values.astype(jnp.int8), scales


def quantize_kv_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[..., head_dim] float -> (float8_e4m3fn [..., head_dim], f32 scales [...]); x ~= fp8 * scale."""
    x32 = x.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(x32), axis=-1)
    scales = jnp.where(absmax > 0.0, absmax / FP8_MAX, 1.0)
    # e4m3fn has no infinity: a value rounding past 448 would become NaN, so clip first.
    values = jnp.clip(x32 / scales[..., None], -FP8_MAX, FP8_MAX)
    return values.astype(jnp.float8_e4m3fn), scales


def dequantize_kv(values: jax.Array, scales: jax.Array, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """Inverse of `quantize_kv` / `quantize_kv_fp8`: values [..., head_dim] * scales [...] -> dtype."""
    return (values.astype(jnp.float32) * scales[..., None]).astype(dtype)
