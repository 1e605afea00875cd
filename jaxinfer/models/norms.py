"""RMSNorm, the normalisation of most supported families, and LayerNorm (Cohere's bias-free; StarCoder2's and
Nemotron's with a bias, Nemotron's weight stored less 1)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.invariant_weight import InvariantWeight, in_row_blocks


def rms_norm(x: jax.Array, weight: jax.Array | InvariantWeight | None, eps: float, weight_offset: float = 0.0,
             scale_first: bool = False) -> jax.Array:
    """RMSNorm computed in float32; Gemma (offset 1, or Gemma 4's `scale_first` without it) scales before the
    cast, Llama after, as HF does; a None weight (NanoChat's weightless norms) does not scale.

    An InvariantWeight norms the rows in fixed blocks: XLA vectorizes a row's sum of squares
    differently from 8 rows on (XLA:CPU), so it would move with the step's token count."""
    if isinstance(weight, InvariantWeight):
        inner = weight.weight
        rows = in_row_blocks(lambda block: rms_norm(block, inner, eps, weight_offset, scale_first),
                             x.reshape(-1, x.shape[-1]))
        return rows.reshape(x.shape)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight is None:
        return normed.astype(x.dtype)
    if weight_offset or scale_first:
        return (normed * (weight_offset + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * normed.astype(x.dtype)


def layer_norm(x: jax.Array, weight: jax.Array | InvariantWeight | None, eps: float, bias: jax.Array | None = None,
               weight_offset: float = 0.0) -> jax.Array:
    """LayerNorm over x's last axis: mean and variance in float32, scaled (by weight_offset + weight: Nemotron's
    LayerNorm1P) and biased before the cast, as HF does. weight [D], or Cohere's q/k norms' [heads, K] (a weight
    per head and dim), or None (OLMo 1's, unscaled); bias like the weight, or None (Cohere)."""
    if isinstance(weight, InvariantWeight):
        inner = weight.weight

        def block_norm(block: jax.Array) -> jax.Array:
            return layer_norm(block.reshape(-1, *inner.shape), inner, eps, bias, weight_offset).reshape(block.shape)

        return in_row_blocks(block_norm, x.reshape(-1, math.prod(inner.shape))).reshape(x.shape)
    x32 = x.astype(jnp.float32)
    centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    normed = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    out = normed if weight is None else (weight_offset + weight.astype(jnp.float32)) * normed
    return (out if bias is None else out + bias.astype(jnp.float32)).astype(x.dtype)


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """x scaled to unit L2 norm over its last axis, in float32 (nGPT's, Dory's: not RMS 1), without a weight."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def config_norm(x: jax.Array, weight: jax.Array | InvariantWeight | None, bias: jax.Array | None,
                cfg: ModelConfig) -> jax.Array:
    """The norm the config names: LayerNorm (`cfg.layer_norm`, with its bias), the unit L2 norm (`cfg.unit_norms`,
    weightless) or RMSNorm, each with the config's epsilon and weight offset."""
    if cfg.unit_norms:
        return l2_norm(x, cfg.rms_norm_eps)
    if cfg.layer_norm:
        return layer_norm(x, weight, cfg.rms_norm_eps, bias, cfg.norm_weight_offset)
    return rms_norm(x, weight, cfg.rms_norm_eps, cfg.norm_weight_offset, cfg.norm_scale_first)
