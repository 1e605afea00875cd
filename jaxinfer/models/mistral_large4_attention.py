"""Mistral Large 4's attention: DeepSeek-V3.2's sparse latent attention (`models.sparse_latent_attention`) with
learned rotary frequencies, learned per-head query scales and NoPE layers.

- LeRoPE: the rotary frequencies (YaRN's over the qk_rope_head_dim dims, adjacent pairs) times exp(alpha), one
  learned alpha per frequency (transformers' `rotary_emb.alpha`, every layer's and the indexer's).
- Softmax scaling: each head's query times scale_h * log(position + 1) + bias_h (`softmax_scaling.scale/bias`),
  the attention's and the indexer's each their own; one factor per head and position, so it commutes with the
  rotation and the absorption into the latent.
- No low-rank query: q_proj of the normed input; the indexer's queries are wq_b of LayerNorm(h) (`q_input_norm`).
- A NoPE layer (`no_rope_layers` 0) rotates nothing: its kv_a_proj gives the latent alone and every one of the
  query's qk_nope_head_dim + qk_rope_head_dim dims is a key dim of kv_b_proj. Its cache row keeps MLA's width
  ([c, 0, index key]: the zero rope columns score nothing) and its w_uk covers all of the query's dims.
- kv_a_layernorm takes rms_norm_eps (DeepSeek's its default 1e-6).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.latent_attention import per_head
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.lightning_indexer import index_key, index_query
from jaxinfer.models.norms import layer_norm, rms_norm
from jaxinfer.models.rope import CosSin, apply_rope, attention_factor, layer_rope, rope_inv_freq
from jaxinfer.models.self_attention import KV_HEADS, Q_HEADS
from jaxinfer.models.sparse_latent_attention import sparse_attend
from jaxinfer.parallel.array_info import ArrayInfo

QUERY_NORM_EPS = 1e-6  # the indexer's q_input_norm: a LayerNorm built with eps 1e-6 whatever the config says


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class Large4Scales:
    """What Mistral Large 4 adds to a DSA layer (H heads, J index heads, P rope dims)."""

    query_scale: jax.Array  # [H] self_attn.softmax_scaling.scale
    query_bias: jax.Array  # [H] self_attn.softmax_scaling.bias
    index_query_scale: jax.Array  # [J] indexer.softmax_scaling.scale
    index_query_bias: jax.Array  # [J] indexer.softmax_scaling.bias
    index_q_norm: jax.Array  # [D] indexer.q_input_norm.weight
    index_q_norm_bias: jax.Array  # [D] indexer.q_input_norm.bias
    rope_alpha: jax.Array  # [P / 2] float32 rotary_emb.alpha (the model's one, read into every layer)


def scale_leaves(cfg: ModelConfig) -> dict[str, ArrayInfo]:
    """The fields of `Large4Scales` as ArrayInfos (replicated: a few values each)."""
    H, J = cfg.num_heads, cfg.latent_attention.indexer.index_n_heads
    D, P = cfg.hidden_size, cfg.latent_attention.qk_rope_head_dim
    return dict(
        query_scale=ArrayInfo((H,), (None,), init_value=0.0),
        query_bias=ArrayInfo((H,), (None,), init_value=1.0),
        index_query_scale=ArrayInfo((J,), (None,), init_value=0.0),
        index_query_bias=ArrayInfo((J,), (None,), init_value=1.0),
        index_q_norm=ArrayInfo((D,), (None,), init_value=1.0),
        index_q_norm_bias=ArrayInfo((D,), (None,), init_value=0.0),
        rope_alpha=ArrayInfo((P // 2,), (None,), init_value=0.0, dtype="float32"),
    )


def learned_rope(positions: jax.Array, alpha: jax.Array, cfg: ModelConfig, layer: int) -> CosSin:
    """cos, sin [B, T, P] float32 of the config's rotary frequencies times exp(alpha), as transformers' LeRoPE."""
    theta, scaling = layer_rope(cfg, layer)
    inv_freq = jnp.asarray(rope_inv_freq(cfg.rotary_dim, theta, scaling), jnp.float32)
    freqs = positions.astype(jnp.float32)[..., None] * (inv_freq * jnp.exp(alpha.astype(jnp.float32)))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    factor = jnp.float32(attention_factor(scaling))
    return jnp.cos(emb) * factor, jnp.sin(emb) * factor


def position_scales(positions: jax.Array, scale: jax.Array, bias: jax.Array, dtype: Any) -> jax.Array:
    """Each head's query factor [B, T, heads, 1]: scale * log(position + 1) + bias in `dtype`, as transformers'
    MistralLarge4TextSoftmaxScaling (padding's position -1 read as 0: finite)."""
    log_pos = jnp.log(jnp.maximum(positions, 0).astype(jnp.float32) + 1).astype(dtype)
    return (scale.astype(dtype) * log_pos[..., None] + bias.astype(dtype))[..., None]


def large4_attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin | None,
) -> tuple[jax.Array, Any]:
    """Sparse latent attention of the normed input h [B, T, D] (rope None: a NoPE layer): [B, T, D]."""
    layout, mla = cache.layout, cfg.latent_attention
    R, N, P = mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim
    rope = None if rope is None else learned_rope(positions, lw.rope_alpha, cfg, layer)
    q, kv = linears(h, [lw.wq, lw.wkv_a])
    latent = rms_norm(kv[..., :R], lw.kv_a_norm, cfg.rms_norm_eps)[..., None, :]
    if rope is None:
        q_nope, q_pe, k_pe = q, jnp.zeros_like(q[..., :P]), jnp.zeros_like(latent[..., :P])
    else:
        q_nope = q[..., :N]
        q_pe, k_pe = (apply_rope(x, *rope, interleaved=True) for x in (q[..., N:], kv[..., None, R:]))
    row = jnp.concatenate([latent, k_pe, index_key(h, lw, mla.indexer, rope).astype(latent.dtype)], axis=-1)
    row = layout.constrain(row, KV_HEADS)
    cache = cache.write(layer, row, row, positions)
    q_latent = per_head(layout.constrain(q_nope, Q_HEADS), lw.w_uk, "bthn,hrn->bthr")
    q = jnp.concatenate([q_latent, q_pe], axis=-1) * position_scales(positions, lw.query_scale, lw.query_bias, q.dtype)
    index_input = layer_norm(h, lw.index_q_norm, QUERY_NORM_EPS, lw.index_q_norm_bias)
    index_q, index_w = index_query(h, index_input, lw, mla.indexer, rope)
    index_q = index_q * position_scales(positions, lw.index_query_scale, lw.index_query_bias, index_q.dtype)
    weighted = sparse_attend(q, index_q, index_w, cache, layer, positions, cfg)
    heads = per_head(weighted, lw.w_uv, "bthr,hvr->bthv")
    return linear(layout.constrain(heads, Q_HEADS), lw.wo, contract=2), cache
