"""RMSNorm, the normalisation of every supported family but Cohere, and Cohere's bias-free LayerNorm."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxinfer.models.invariant_weight import InvariantWeight, in_row_blocks


def rms_norm(x: jax.Array, weight: jax.Array | InvariantWeight, eps: float, weight_offset: float = 0.0) -> jax.Array:
    """RMSNorm computed in float32; Gemma (offset 1) scales before the cast, Llama after, as HF does.

    An InvariantWeight norms the rows in fixed blocks: XLA vectorizes a row's sum of squares
    differently from 8 rows on (XLA:CPU), so it would move with the step's token count."""
    if isinstance(weight, InvariantWeight):
        inner = weight.weight
        rows = in_row_blocks(lambda block: rms_norm(block, inner, eps, weight_offset), x.reshape(-1, x.shape[-1]))
        return rows.reshape(x.shape)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight_offset:
        return (normed * (weight_offset + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * normed.astype(x.dtype)


def layer_norm(x: jax.Array, weight: jax.Array | InvariantWeight, eps: float) -> jax.Array:
    """LayerNorm without a bias (Cohere) over x's last axis: mean and variance in float32, scaled before the
    cast, as HF does. weight [D], or Cohere's q/k norms' [heads, K] (a weight per head and dim)."""
    if isinstance(weight, InvariantWeight):
        inner = weight.weight
        rows = in_row_blocks(lambda block: layer_norm(block.reshape(-1, *inner.shape), inner, eps).reshape(block.shape),
                             x.reshape(-1, math.prod(inner.shape)))
        return rows.reshape(x.shape)
    x32 = x.astype(jnp.float32)
    centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    normed = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * normed).astype(x.dtype)
