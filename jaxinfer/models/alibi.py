"""ALiBi: attention with linear biases in place of position embeddings (BLOOM, MPT).

Each head h adds slope_h * (key position - query position) to its scaled scores: 0 on the diagonal, more negative
the further back a key lies. The slopes are a static per-head vector (`cfg.alibi_slopes`), the same for every
layer. Relative distance rather than BLOOM's slope * key position: a constant per query row leaves the softmax as it
is, and the values stay small near the keys that matter.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def bloom_slopes(num_heads: int) -> tuple[float, ...]:
    """BLOOM's (and the ALiBi paper's) slopes: 2^(-8 i / n) for i = 1..n at the power of two n <= num_heads; the
    heads past it take every other slope of the next power of two (transformers' `build_alibi_tensor`)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base**p for p in range(1, closest + 1)]
    if closest != num_heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra**p for p in range(1, 1 + 2 * min(closest, num_heads - closest), 2)]
    return tuple(slopes)


def mpt_slopes(num_heads: int, bias_max: float = 8.0) -> tuple[float, ...]:
    """MPT's slopes: 2^(-bias_max i / n) for i = 1..n at the power of two n >= num_heads; for other head counts the
    odd-indexed ones, then the even-indexed, cut to num_heads (transformers' `build_mpt_alibi_tensor`)."""
    padded = 2 ** math.ceil(math.log2(num_heads))
    slopes = [2.0 ** -(i * bias_max / padded) for i in range(1, padded + 1)]
    if padded != num_heads:
        slopes = (slopes[1::2] + slopes[::2])[:num_heads]
    return tuple(slopes)


def slopes_array(slopes: tuple[float, ...]) -> jax.Array | None:
    """The slopes as a float32 [H] array for the attention paths; None for a model without ALiBi."""
    return jnp.asarray(slopes, jnp.float32) if slopes else None


def grouped_slopes(slopes: jax.Array, kv_heads: int) -> jax.Array:
    """Slopes [H] as [KV, G] float32 (query head h = kv head * G + g), as the grouped scores are laid out."""
    return slopes.astype(jnp.float32).reshape(kv_heads, -1)


def distance(key_positions: jax.Array, query_positions: jax.Array) -> jax.Array:
    """key - query position, float32: keys [..., S] against queries [..., T] -> [..., T, S]."""
    return (key_positions[..., None, :] - query_positions[..., :, None]).astype(jnp.float32)
