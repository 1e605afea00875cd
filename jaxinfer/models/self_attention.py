"""The self-attention block shared by every family: q/k/v projections, biases, q/k norms, rotary
embeddings, the cache write, attention over the cache and the output projection.

Layer weights are duck-typed: any dataclass with the fields `wq wk wv wo` and the optional
`bq bk bv bo q_norm k_norm` (`q_norm_bias k_norm_bias`: Phi's q/k LayerNorms'), `sinks` where the config has
attention sinks (GPT-OSS), `attn_gate` [D, H, K] where the attention output is gated per head and dim by
sigmoid(h @ attn_gate) before wo (Qwen3-Next), and `head_gate` [D, H] where it is gated per head alone (LFM3); the
gate's function is `cfg.output_gate` (Laguna's softplus, in float32 as transformers computes it).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.alibi import slopes_array
from jaxinfer.models.attention import attend
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.invariant_weight import InvariantWeight
from jaxinfer.models.layers import linear, linears
from jaxinfer.models.norms import layer_norm, rms_norm
from jaxinfer.models.rope import CosSin, apply_rope
from jaxinfer.parallel.array_info import ArrayInfo

# Logical axes of activations; the rules table maps them like the weights' (see sharding.py).
HIDDEN = ("batch", "tokens", "embed")  # [B, T, D]
Q_HEADS = ("batch", "tokens", "q_heads", "head_dim")  # [B, T, H, K]
KV_HEADS = ("batch", "tokens", "kv_heads", "head_dim")  # [B, T, KV, K]


def project_qkv(
    x: jax.Array, lw: Any, cfg: ModelConfig, rope: CosSin | None, layout: Any,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [B,T,H,K], k/v [B,T,KV,K] with biases, DBRX's clamp, q/k norms and rotary embeddings (none where rope is None)
    applied."""
    q, k, v = linears(x, [lw.wq, lw.wk, lw.wv])
    q, k, v = layout.constrain(q, Q_HEADS), layout.constrain(k, KV_HEADS), layout.constrain(v, KV_HEADS)
    if lw.bq is not None:
        q, k, v = q + lw.bq, k + lw.bk, v + lw.bv
    if cfg.clip_qkv is not None:  # DBRX
        q, k, v = (jnp.clip(t, -cfg.clip_qkv, cfg.clip_qkv) for t in (q, k, v))
    if lw.q_norm is not None and not cfg.qk_norm_after_rope:
        q = qk_norm(q, lw.q_norm, cfg, getattr(lw, "q_norm_bias", None))
        k = qk_norm(k, lw.k_norm, cfg, getattr(lw, "k_norm_bias", None))
    if cfg.qk_weightless_norm:  # Muse Glimmer
        q, k = rms_norm(q, None, cfg.rms_norm_eps), rms_norm(k, None, cfg.rms_norm_eps)
    if rope is not None:  # None: a NoPE layer (SmolLM3), positions reach it only through the causal mask
        cos, sin = rope
        q, k = apply_rope(q, cos, sin, cfg.rope_interleaved), apply_rope(k, cos, sin, cfg.rope_interleaved)
    if lw.q_norm is not None and cfg.qk_norm_after_rope:  # HunYuan normalises the rotated q and k
        q, k = qk_norm(q, lw.q_norm, cfg), qk_norm(k, lw.k_norm, cfg)
    return q, k, v


def qk_norm(x: jax.Array, weight: jax.Array, cfg: ModelConfig, bias: jax.Array | None = None) -> jax.Array:
    """q or k [B, T, heads, K] normed per head: RMSNorm with one [K] weight, or over all heads' dims at once
    (`cfg.qk_norm_whole`, OLMo 2), or a LayerNorm (`cfg.layer_norm`): Cohere's with a weight per head and dim,
    Phi's with one [K] weight and bias every head shares."""
    if cfg.layer_norm:
        return layer_norm(x, weight, cfg.rms_norm_eps, bias)
    norm = whole_heads_norm if cfg.qk_norm_whole else rms_norm
    return norm(x, weight, cfg.rms_norm_eps, cfg.norm_weight_offset)


def whole_heads_norm(x: jax.Array, weight: jax.Array | InvariantWeight, eps: float,
                     weight_offset: float = 0.0) -> jax.Array:
    """RMSNorm of x [B, T, heads, K] over all its heads' dims at once (weight [heads, K]; batch_invariant's
    InvariantWeight of one stays one around the flattened weight)."""
    inner = weight.weight if isinstance(weight, InvariantWeight) else weight
    flat_weight = InvariantWeight(inner.reshape(-1)) if isinstance(weight, InvariantWeight) else inner.reshape(-1)
    flat = rms_norm(x.reshape(*x.shape[:2], -1), flat_weight, eps, weight_offset)
    return flat.reshape(x.shape)


def query_temperature(positions: jax.Array, beta: float, period: int) -> jax.Array:
    """Llama 4's per-position query scale [B, T, 1, 1]: 1 within the first `period` positions, growing with the
    log of how many periods lie behind (Ministral 3). Padding (position -1) reads as position 0."""
    periods = jnp.floor(jnp.maximum(positions, 0).astype(jnp.float32) / period)
    return (1 + beta * jnp.log(1 + periods))[:, :, None, None]


def self_attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin | None
) -> tuple[jax.Array, Any]:
    """Attention of the normed input h [B,T,D] over the cache (after writing this step's K/V): [B,T,D]."""
    layout = cache.layout
    q, k, v = project_qkv(h, lw, cfg, rope, layout)
    if cfg.query_scale_beta:
        q = q * query_temperature(positions, cfg.query_scale_beta, cfg.query_scale_period).astype(q.dtype)
    cache = cache.write(layer, k, v, positions)
    window = cfg.layer_windows[layer]
    attn = attend(q, cache, layer, positions, window, scale=cfg.attn_scale, soft_cap=cfg.attn_soft_cap,
                  sinks=getattr(lw, "sinks", None), chunk=cfg.layer_chunks[layer], alibi=slopes_array(cfg.alibi_slopes))
    if cfg.attn_out_norm:  # Muse Spark
        attn = rms_norm(attn, None, cfg.rms_norm_eps)
    gate = getattr(lw, "attn_gate", None)
    if gate is not None:
        attn = attn * output_gate(cfg, linear(h, gate))
    head_gate = getattr(lw, "head_gate", None)
    if head_gate is not None:
        attn = attn * output_gate(cfg, linear(h, head_gate))[..., None]
    out = linear(layout.constrain(attn, Q_HEADS), lw.wo, contract=2)
    return (out if lw.bo is None else out + lw.bo), cache


def output_gate(cfg: ModelConfig, logits: jax.Array) -> jax.Array:
    """The attention output's gate from its logits: sigmoid, or softplus in float32 (Laguna), in the logits' dtype."""
    if cfg.output_gate == "softplus":
        return jax.nn.softplus(logits.astype(jnp.float32)).astype(logits.dtype)
    return jax.nn.sigmoid(logits)


def attention_leaves(cfg: ModelConfig) -> dict[str, ArrayInfo | None]:
    """The attention fields of a layer as ArrayInfos (None where the config has no such leaf)."""
    D, H, KV, K = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    norm = 0.0 if cfg.norm_weight_offset else 1.0
    sinks = dict(sinks=ArrayInfo((H,), ("q_heads",))) if cfg.attn_sinks else {}
    # Per head: one [K] weight every head shares; whole (OLMo 2) and Cohere's LayerNorms: a weight per head and dim.
    per_head_and_dim = cfg.qk_norm_whole or cfg.layer_norm
    q_norm, k_norm = (((H, K), ("q_heads", "head_dim")), ((KV, K), ("kv_heads", "head_dim"))) if per_head_and_dim \
        else (((K,), ("head_dim",)),) * 2
    return dict(
        wq=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")),
        wk=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        wv=ArrayInfo((D, KV, K), ("embed", "kv_heads", "head_dim")),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        bq=ArrayInfo((H, K), ("q_heads", "head_dim")) if cfg.qkv_bias else None,
        bk=ArrayInfo((KV, K), ("kv_heads", "head_dim")) if cfg.qkv_bias else None,
        bv=ArrayInfo((KV, K), ("kv_heads", "head_dim")) if cfg.qkv_bias else None,
        bo=ArrayInfo((D,), ("embed",)) if cfg.o_bias else None,
        q_norm=ArrayInfo(*q_norm, init_value=norm) if cfg.qk_norm else None,
        k_norm=ArrayInfo(*k_norm, init_value=norm) if cfg.qk_norm else None,
        **sinks,
    )


def attention_hf_leaves(cfg: ModelConfig, prefix: str = "model.layers.{i}.self_attn.") -> dict[str, HFLeaf]:
    """Where the attention fields live in a checkpoint with separate q/k/v projections."""
    H, KV, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    leaves = {
        "wq": HFLeaf(prefix + "q_proj.weight", "in_heads", (H * K, D), H, K),
        "wk": HFLeaf(prefix + "k_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wv": HFLeaf(prefix + "v_proj.weight", "in_heads", (KV * K, D), KV, K),
        "wo": HFLeaf(prefix + "o_proj.weight", "out_heads", (D, H * K), H, K),
    }
    if cfg.qkv_bias:
        leaves["bq"] = HFLeaf(prefix + "q_proj.bias", "bias_heads", (H * K,), H, K)
        leaves["bk"] = HFLeaf(prefix + "k_proj.bias", "bias_heads", (KV * K,), KV, K)
        leaves["bv"] = HFLeaf(prefix + "v_proj.bias", "bias_heads", (KV * K,), KV, K)
    if cfg.o_bias:
        leaves["bo"] = HFLeaf(prefix + "o_proj.bias", "same", (D,))
    if cfg.qk_norm and cfg.qk_norm_whole:
        leaves["q_norm"] = HFLeaf(prefix + "q_norm.weight", "bias_heads", (H * K,), H, K)
        leaves["k_norm"] = HFLeaf(prefix + "k_norm.weight", "bias_heads", (KV * K,), KV, K)
    elif cfg.qk_norm and cfg.layer_norm:  # Cohere stores them [heads, K]
        leaves["q_norm"] = HFLeaf(prefix + "q_norm.weight", "same", (H, K))
        leaves["k_norm"] = HFLeaf(prefix + "k_norm.weight", "same", (KV, K))
    elif cfg.qk_norm:
        leaves["q_norm"] = HFLeaf(prefix + "q_norm.weight", "same", (K,))
        leaves["k_norm"] = HFLeaf(prefix + "k_norm.weight", "same", (K,))
    if cfg.attn_sinks:
        leaves["sinks"] = HFLeaf(prefix + "sinks", "same", (H,))
    return leaves
