"""ZAYA's Compressed Convolutional Attention projection (CCA, https://huggingface.co/papers/2510.04476) as pure
functions: q, k and v for attention over the pages.

q and k projections go through two causal convs, a depthwise one of t0 taps, then one of t1 taps grouped per head
(each head's channels mixed), plus residual paths (q's from the mean of q and its head's k, k's from that mean per
K/V group); half of the value heads come from the current token's projection, half from the previous token's
(`v_proj_delayed`). A token therefore reads the projections of the t0 + t1 - 2 tokens before it: the same
segment-aware conv windows as LFM2's short conv (`ssd_chunks.conv_windows`), its slot's conv state holding the last
tokens' q/k projections and delayed values (zeros at a request's position 0, as transformers pads).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import LayerState
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.layers import linear
from jaxinfer.models.ssd_chunks import conv_windows, segments


def conv_channels(cfg: ModelConfig) -> tuple[int, int]:
    """(q/k channels, delayed value channels) a token's conv window holds."""
    return (cfg.num_heads + cfg.num_kv_heads) * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim // 2


def _two_convs(windows: jax.Array, lw: Any, groups: int) -> jax.Array:
    """The depthwise then grouped convs over windows [N, t0 + t1 - 1, C]: [N, C] float32."""
    t0, t1 = lw.conv_dw.shape[-1], lw.conv_grouped.shape[-1]
    dw = lw.conv_dw[:, 0].T.astype(jnp.float32)  # [t0, C]
    depthwise = jnp.stack([jnp.sum(windows[:, j:j + t0] * dw, axis=1) for j in range(t1)], axis=1)
    depthwise = depthwise + lw.conv_dw_bias.astype(jnp.float32)  # [N, t1, C]
    n, C = windows.shape[0], windows.shape[-1]
    per_group = depthwise.reshape(n, t1, groups, C // groups)
    grouped = lw.conv_grouped.astype(jnp.float32).reshape(groups, C // groups, C // groups, t1)  # [G, out, in, t1]
    out = jnp.einsum("ntgi,goit->ngo", per_group, grouped).reshape(n, C)
    return out + lw.conv_grouped_bias.astype(jnp.float32)


def cca_qkv(
    cfg: ModelConfig, lw: Any, h: jax.Array, positions: jax.Array, state: LayerState,
) -> tuple[jax.Array, jax.Array, jax.Array, LayerState]:
    """q [B, T, H, K], k and v [B, T, KV, K] of normed hidden states h [B, T, D], and the conv state after them."""
    B, T, D = h.shape
    H, KV, K = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    x = h.reshape(B * T, D)
    q, k, v_now, v_prev = (linear(x, w) for w in (lw.wq, lw.wk, lw.wv_now, lw.wv_prev))
    q, k = q.reshape(-1, H, K), k.reshape(-1, KV, K)
    qk_width, _ = conv_channels(cfg)
    inputs = jnp.concatenate([q.reshape(-1, H * K), k.reshape(-1, KV * K), v_prev], axis=-1).astype(jnp.float32)
    slots, flat, num_slots = state.token_slots, positions.reshape(-1), state.conv.shape[0]
    seg = segments(slots, flat, min(num_slots, B * T))
    windows = conv_windows(state.conv, inputs, slots, flat, seg)  # [BT, W, C + V]
    mixed = _two_convs(windows[..., :qk_width], lw, H + KV).astype(h.dtype)
    mean = (q + jnp.repeat(k, H // KV, axis=1)) * 0.5  # [BT, H, K]
    q = mixed[:, :H * K].reshape(-1, H, K) + mean
    k = mixed[:, H * K:].reshape(-1, KV, K) + mean.reshape(-1, KV, H // KV, K).mean(axis=2)
    previous = windows[:, -2, qk_width:].astype(h.dtype)  # the token before's delayed value (zeros at position 0)
    v = jnp.concatenate([v_now, previous], axis=-1).reshape(-1, KV, K)
    target = jnp.where(seg.valid, slots[seg.first], num_slots)  # past the segments: dropped
    conv = state.conv.at[target].set(windows[seg.last, 1:], mode="drop")
    shaped = (t.reshape(B, T, *t.shape[1:]) for t in (q, k, v))
    return *shaped, dataclasses.replace(state, conv=conv)


def cca_norm(q: jax.Array, k: jax.Array, temp: jax.Array) -> tuple[jax.Array, jax.Array]:
    """q and k scaled to L2 norm sqrt(head_dim) per head (the norm floored at the dtype's eps), k then times its K/V
    head's learned temperature `temp` [KV]."""
    eps, scale = jnp.finfo(q.dtype).eps, q.shape[-1] ** 0.5

    def unit(t: jax.Array) -> jax.Array:
        return t * (scale / jnp.maximum(jnp.linalg.norm(t, axis=-1, keepdims=True), eps))

    return unit(q), unit(k) * temp[:, None].astype(k.dtype)
