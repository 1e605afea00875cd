"""Whisper's audio encoder and the cross-attention keys and values each decoder layer reads from it.

The encoder runs once per request, beside the engine's steps (runtime/audio_runner): two convolutions over the
log-mel features [M, 2F] (kernel 3; the second of stride 2) with GELU, the sinusoidal position table added,
pre-LayerNorm layers (bidirectional attention, fc2(gelu(fc1(x)))), a final LayerNorm: [F, D]. Each decoder
layer's `encoder_attn.k_proj` (no bias) and `v_proj` turn that into its keys and values, which `encode_into_slot`
writes into the request's row slot (cache/cross_pool).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.cache.cross_pool import write_cross
from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.models.norms import layer_norm

EPS = 1e-5


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EncoderLayer:
    """One encoder layer (pre-LayerNorm, biases as HF's: none on k)."""

    attn_norm: jax.Array  # [D]
    attn_norm_bias: jax.Array  # [D]
    wq: jax.Array  # [D, H, K]
    bq: jax.Array  # [H, K]
    wk: jax.Array  # [D, H, K]
    wv: jax.Array  # [D, H, K]
    bv: jax.Array  # [H, K]
    wo: jax.Array  # [H, K, D]
    bo: jax.Array  # [D]
    mlp_norm: jax.Array  # [D]
    mlp_norm_bias: jax.Array  # [D]
    w_up: jax.Array  # [D, F]
    b_up: jax.Array  # [F]
    w_down: jax.Array  # [F, D]
    b_down: jax.Array  # [D]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CrossProjection:
    """One decoder layer's cross-attention keys and values projection (`encoder_attn.k_proj` / `v_proj`)."""

    wk: jax.Array  # [D, H, K]
    wv: jax.Array  # [D, H, K]
    bv: jax.Array  # [H, K]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class AudioEncoder:
    """The encoder and the decoder layers' cross projections: everything the per-request program reads."""

    conv1: jax.Array  # [D, M, 3] (torch Conv1d layout)
    conv1_bias: jax.Array  # [D]
    conv2: jax.Array  # [D, D, 3]
    conv2_bias: jax.Array  # [D]
    positions: jax.Array  # [F, D] sinusoids
    layers: list[EncoderLayer]
    final_norm: jax.Array  # [D]
    final_norm_bias: jax.Array  # [D]
    cross: list[CrossProjection]  # one per decoder layer


def conv1d(x: jax.Array, w: jax.Array, b: jax.Array, stride: int) -> jax.Array:
    """x [B, C, L] through a kernel-3, padding-1 Conv1d w [O, C, 3] -> [B, O, L // stride]."""
    out = jax.lax.conv_general_dilated(x, w, (stride,), [(1, 1)], dimension_numbers=("NCH", "OIH", "NCH"),
                                       precision=jax.lax.Precision.HIGHEST)
    return out + b[None, :, None]


def encoder_layer(x: jax.Array, lw: EncoderLayer) -> jax.Array:
    """x [B, F, D] through one layer: every frame attends to every frame."""
    h = layer_norm(x, lw.attn_norm, EPS, lw.attn_norm_bias)
    q = jnp.einsum("bfd,dhk->bfhk", h, lw.wq) + lw.bq
    k = jnp.einsum("bfd,dhk->bfhk", h, lw.wk)
    v = jnp.einsum("bfd,dhk->bfhk", h, lw.wv) + lw.bv
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) * q.shape[-1] ** -0.5
    attn = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype), v)
    x = x + jnp.einsum("bfhk,hkd->bfd", attn, lw.wo) + lw.bo
    h = layer_norm(x, lw.mlp_norm, EPS, lw.mlp_norm_bias)
    return x + jax.nn.gelu(h @ lw.w_up + lw.b_up, approximate=False) @ lw.w_down + lw.b_down


def encode(weights: AudioEncoder, features: jax.Array) -> jax.Array:
    """Log-mel features [B, M, 2F] -> the encoder's output [B, F, D]."""
    x = jax.nn.gelu(conv1d(features.astype(weights.conv1.dtype), weights.conv1, weights.conv1_bias, 1),
                    approximate=False)
    x = jax.nn.gelu(conv1d(x, weights.conv2, weights.conv2_bias, 2), approximate=False)
    x = jnp.swapaxes(x, 1, 2) + weights.positions
    for lw in weights.layers:
        x = encoder_layer(x, lw)
    return layer_norm(x, weights.final_norm, EPS, weights.final_norm_bias)


def cross_keys_values(weights: AudioEncoder, encoded: jax.Array) -> tuple[list[jax.Array], list[jax.Array]]:
    """Each decoder layer's cross-attention keys and values [F, H, K] of one request's output [F, D]."""
    keys = [jnp.einsum("fd,dhk->fhk", encoded, c.wk) for c in weights.cross]
    values = [jnp.einsum("fd,dhk->fhk", encoded, c.wv) + c.bv for c in weights.cross]
    return keys, values


def encode_into_slot(weights: AudioEncoder, pages: PagedKVCache, features: jax.Array, slot: jax.Array
                     ) -> PagedKVCache:
    """pages with row slot `slot`'s cross-attention keys and values made from one request's features [M, 2F]."""
    encoded = encode(weights, features[None])[0]
    return write_cross(pages, slot, *cross_keys_values(weights, encoded))
