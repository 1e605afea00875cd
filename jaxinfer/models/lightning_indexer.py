"""DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5): which earlier tokens each query attends.

Per token the indexer projects one index key k = LayerNorm(wk x) (index_head_dim I, its first qk_rope_head_dim dims
rotated), cached beside the token's latent row, and per query index_n_heads heads q_j = wq_b(normed q_a) (rotated
alike) with weights w_j = weights_proj(x) / sqrt(heads). A query's score of an earlier token is
sum_j w_j relu(q_j . k / sqrt(I)), in float32 as transformers computes it; the best `index_topk` tokens are the
ones its latent attention reads (`models.sparse_latent_attention`). transformers' reference skips DeepSeek's
Hadamard rotation (orthogonal: dot products unchanged) and fp8 scoring (a precision shortcut); so does this.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.config.latent_attention import LightningIndexer
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.layers import linear
from jaxinfer.models.norms import layer_norm
from jaxinfer.models.rope import CosSin, apply_rope
from jaxinfer.parallel.array_info import ArrayInfo


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class IndexerWeights:
    """A DSA layer's indexer (Q: q_lora_rank, J: index heads, I: index_head_dim)."""

    index_wq: jax.Array  # [Q, J, I] indexer.wq_b
    index_wk: jax.Array  # [D, I] indexer.wk
    index_k_norm: jax.Array  # [I]
    index_k_bias: jax.Array  # [I]
    index_weights: jax.Array  # [D, J] float32 indexer.weights_proj (kept float32, as transformers keeps it)


def indexer_leaves(cfg: ModelConfig) -> dict[str, ArrayInfo]:
    """The fields of `IndexerWeights` as ArrayInfos (replicated: the index key is every head's, like the row)."""
    mla, idx = cfg.latent_attention, cfg.latent_attention.indexer
    D, Q, J, I = cfg.hidden_size, mla.q_lora_rank, idx.index_n_heads, idx.index_head_dim
    return dict(
        index_wq=ArrayInfo((Q, J, I), (None, None, None)),
        index_wk=ArrayInfo((D, I), ("embed", None)),
        index_k_norm=ArrayInfo((I,), (None,), init_value=1.0),
        index_k_bias=ArrayInfo((I,), (None,), init_value=0.0),
        index_weights=ArrayInfo((D, J), ("embed", None), dtype="float32"),
    )


def indexer_hf_leaves(cfg: ModelConfig, prefix: str = "model.layers.{i}.self_attn.indexer.") -> dict[str, HFLeaf]:
    """Where the indexer's fields live: wq_b, wk, k_norm (weight and bias), weights_proj."""
    mla, idx = cfg.latent_attention, cfg.latent_attention.indexer
    D, Q, J, I = cfg.hidden_size, mla.q_lora_rank, idx.index_n_heads, idx.index_head_dim
    return {
        "index_wq": HFLeaf(prefix + "wq_b.weight", "in_heads", (J * I, Q), J, I),
        "index_wk": HFLeaf(prefix + "wk.weight", "transpose", (I, D)),
        "index_k_norm": HFLeaf(prefix + "k_norm.weight", "same", (I,)),
        "index_k_bias": HFLeaf(prefix + "k_norm.bias", "same", (I,)),
        "index_weights": HFLeaf(prefix + "weights_proj.weight", "transpose", (J, D)),
    }


def turned(x: jax.Array, idx: LightningIndexer, rope: CosSin | None) -> jax.Array:
    """x [B, T, heads, I] with its first rotary dims turned (its last with `rope_last`: HY-V4); unturned where rope
    is None (Mistral Large 4's NoPE layers)."""
    if rope is None:
        return x
    if not idx.rope_last:
        return apply_rope(x, *rope, idx.rope_interleaved)
    split = x.shape[-1] - rope[0].shape[-1]
    return jnp.concatenate([x[..., :split], apply_rope(x[..., split:], *rope, idx.rope_interleaved)], axis=-1)


def index_key(h: jax.Array, lw: IndexerWeights, idx: LightningIndexer, rope: CosSin | None) -> jax.Array:
    """Each token's index key [B, T, 1, I] of the normed input h [B, T, D], in h's dtype (what the cache keeps)."""
    k = layer_norm(linear(h, lw.index_wk), lw.index_k_norm, idx.key_norm_eps, lw.index_k_bias)[..., None, :]
    return turned(k, idx, rope)


def index_query(
    h: jax.Array, q_low: jax.Array, lw: IndexerWeights, idx: LightningIndexer, rope: CosSin | None,
) -> tuple[jax.Array, jax.Array]:
    """Each query's index heads [B, T, J, I] (from the normed low-rank query q_low [B, T, Q]; unturned where rope
    is None) and their weights [B, T, J] float32 (weights_proj of h in float32, over sqrt(J))."""
    q = turned(linear(q_low, lw.index_wq), idx, rope)
    weights = linear(h.astype(jnp.float32), lw.index_weights).astype(jnp.float32)
    return q, weights * idx.index_n_heads**-0.5


def index_scores(q: jax.Array, weights: jax.Array, keys: jax.Array) -> jax.Array:
    """Scores [N, S] float32 of queries q [N, J, I] with weights [N, J] over each query's keys [N, S, I]."""
    dots = jnp.einsum("nji,nsi->njs", q.astype(jnp.float32), keys.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)
    per_head = jax.nn.relu(dots * q.shape[-1] ** -0.5)
    return jnp.einsum("nj,njs->ns", weights, per_head, precision=jax.lax.Precision.HIGHEST)
