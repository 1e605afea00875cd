"""HY-V4's attention: DeepSeek Sparse Attention (`models.sparse_latent_attention`) with sinks, an output gate and
the indexer's choice shared across layers.

- Latent attention as DeepSeek-V3's with a low-rank query, its rope rotate-half (transformers' apply_rotary_pos_emb).
- The lightning indexer (`models.lightning_indexer`) rotates the last qk_rope_head_dim dims of its keys and queries
  (`rope_last`) and norms its keys with rms_norm_eps.
- A "shared" layer (`indexer_types`) holds no indexer: its queries read the positions the last full layer chose
  in this step (`Choice`, handed from layer to layer with the streams). Its cache row keeps the DSA width with zero
  index-key columns, so every layer's row is alike (the cache has one row width): I of R + P + I values wasted.
- Each head's softmax has a learned sink logit (`sinks`, float32); each head's output is gated by
  sigmoid(gate_proj(h)) before o_proj.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.latent_attention import latent_projections, latent_rows, per_head
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.lightning_indexer import index_key, index_query
from jaxinfer.models.rope import CosSin
from jaxinfer.models.self_attention import KV_HEADS, Q_HEADS
from jaxinfer.models.sparse_latent_attention import attend_chosen, sparse_choice
from jaxinfer.parallel.array_info import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class GatedSinks:
    """What HY-V4 adds to a DSA layer's attention (H heads of V value dims)."""

    attn_gate: Weight  # [D, H, V] self_attn.gate_proj
    sinks: jax.Array  # [H] float32 self_attn.sinks


def gated_sinks_leaves(cfg: ModelConfig) -> dict[str, ArrayInfo]:
    """The fields of `GatedSinks` as ArrayInfos (per head: sharded as the heads)."""
    D, H, V = cfg.hidden_size, cfg.num_heads, cfg.latent_attention.v_head_dim
    return dict(attn_gate=ArrayInfo((D, H, V), ("embed", "q_heads", "head_dim")),
                sinks=ArrayInfo((H,), ("q_heads",), init_value=0.0, dtype="float32"))


def gated_sinks_hf_leaves(cfg: ModelConfig, prefix: str = "model.layers.{i}.self_attn.") -> dict[str, HFLeaf]:
    """Where they live in a checkpoint as HY-V4 ships it (transformers renames them gate_proj and sinks)."""
    D, H, V = cfg.hidden_size, cfg.num_heads, cfg.latent_attention.v_head_dim
    return {"attn_gate": HFLeaf(prefix + "linear_gate.weight", "in_heads", (H * V, D), H, V),
            "sinks": HFLeaf(prefix + "learnable_sink_param", "same", (H,))}


def gated_sparse_attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin,
    chosen: jax.Array | None,
) -> tuple[jax.Array, Any, jax.Array]:
    """Attention of the normed input h [B, T, D] (lw: a DSA layer with `GatedSinks`; its indexer fields None on a
    shared layer, which reads `chosen`): [B, T, D], the cache, and the positions [B, T, k] it attended."""
    layout, indexer = cache.layout, cfg.latent_attention.indexer
    q_low, q, kv = latent_projections(h, lw, cfg)
    q_nope, q_pe, row = latent_rows(q, kv, lw, cfg, rope)
    full = lw.index_wq is not None
    key = index_key(h, lw, indexer, rope) if full else jnp.zeros((*row.shape[:-1], indexer.index_head_dim))
    row = layout.constrain(jnp.concatenate([row, key.astype(row.dtype)], -1), KV_HEADS)
    cache = cache.write(layer, row, row, positions)
    if full:
        chosen = sparse_choice(*index_query(h, q_low, lw, indexer, rope), cache, layer, positions, cfg)
    if chosen is None:
        raise ValueError("a shared HY-V4 layer needs an earlier full layer's choice: the first layer's indexer_types "
                         "must be 'full'")
    q_latent = per_head(layout.constrain(q_nope, Q_HEADS), lw.w_uk, "bthn,hrn->bthr")
    weighted = attend_chosen(jnp.concatenate([q_latent, q_pe], -1), chosen, cache, layer, positions, cfg, lw.sinks)
    heads = per_head(weighted, lw.w_uv, "bthr,hvr->bthv")
    heads = heads * jax.nn.sigmoid(linear(h, lw.attn_gate).astype(jnp.float32)).astype(heads.dtype)
    return linear(layout.constrain(heads, Q_HEADS), lw.wo, contract=2), cache, chosen
