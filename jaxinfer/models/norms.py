"""RMSNorm, the one normalisation every supported family uses."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, weight_offset: float = 0.0) -> jax.Array:
    """RMSNorm computed in float32; Gemma (offset 1) scales before the cast, Llama after, as HF does."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight_offset:
        return (normed * (weight_offset + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * normed.astype(x.dtype)
