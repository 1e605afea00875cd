"""Qwen4-Exp's QSA attention (transformers' `Qwen4ExpTextQSAIndexer` and `Qwen4ExpTextAttention`): Qwen3.5's gated
attention, each query seeing only the key blocks its indexer scores highest.

The keys are cut into blocks of `indexer_block` tokens from position 0. A block's index key is the mean of its
tokens' raw index keys, RMS-normed and rotated at the block's first position; a query's index heads (normed and
rotated at its own position) score each complete block it sees as the sum over heads of relu(q . key) over
sqrt(dim). Each query attends to the tokens of its top `indexer_budget / indexer_block` blocks and to every token
after its last complete block (itself included). DeepSeek-V3.2's indexer (models/lightning_indexer) scores single
tokens instead, and weights its heads.

Whole sequences only (each row from position 0, all of it in the step): a block's keys are this step's.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.config.qwen4_exp import Qwen4ExpFields
from jaxinfer.models.layers import linear
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, apply_rope
from jaxinfer.models.self_attention import output_gate, project_qkv


def block_keys(keys: jax.Array, norm: jax.Array, rope: CosSin, block: int, eps: float) -> jax.Array:
    """Raw index keys [B, T, I] -> each complete block's key [B, T // block, I]: the mean, normed, rotated at the
    block's first position (rope: every position's tables)."""
    B, T, I = keys.shape
    n = T // block
    pooled = jnp.mean(keys[:, :n * block].reshape(B, n, block, I).astype(jnp.float32), axis=2).astype(keys.dtype)
    pooled = rms_norm(pooled, norm, eps, 1.0)
    cos, sin = (t[:, ::block][:, :n] for t in rope)
    return apply_rope(pooled[:, :, None], cos, sin)[:, :, 0]


def chosen_blocks(scores: jax.Array, complete: jax.Array, keep: int) -> jax.Array:
    """scores [B, T, N] of each query's blocks, complete [T] the blocks each query sees whole -> [B, T, N] bool:
    its `keep` best-scored complete blocks (all of them where it has fewer)."""
    N = scores.shape[-1]
    seen = jnp.arange(N) < complete[:, None]
    top = jax.lax.top_k(jnp.where(seen, scores, -jnp.inf), min(keep, N))[1]  # [B, T, keep]
    return jnp.any(top[..., None] == jnp.arange(N), axis=-2) & seen


def selected_keys(lw: Any, h: jax.Array, rope: CosSin, fields: Qwen4ExpFields, eps: float) -> jax.Array:
    """Which keys each query of the normed h [B, T, D] attends to: [B, T, T] bool (causal included)."""
    B, T, _ = h.shape
    Hi, I, r = fields.indexer_heads, fields.indexer_dim, fields.indexer_block
    qk = linear(h, lw.index_qk)
    q = apply_rope(rms_norm(qk[..., :Hi * I].reshape(B, T, Hi, I), lw.index_q_norm, eps, 1.0), *rope)
    steps = jnp.arange(T)
    complete = (steps + 1) // r  # blocks each query sees whole
    causal = steps[None, :] <= steps[:, None]
    tail = steps[None, :] >= (complete * r)[:, None]  # past the query's last complete block
    if T < r:
        return jnp.broadcast_to(causal, (B, T, T))
    keys = block_keys(qk[..., Hi * I:], lw.index_k_norm, rope, r, eps)
    dots = jnp.einsum("bthi,bni->bthn", q.astype(jnp.float32), keys.astype(jnp.float32))
    scores = jnp.sum(jax.nn.relu(dots), axis=2) / math.sqrt(I)  # [B, T, N]
    chosen = chosen_blocks(scores, complete, fields.indexer_budget // r)  # [B, T, N]
    in_block = jnp.take(chosen, jnp.minimum(steps // r, chosen.shape[-1] - 1), axis=-1)  # [B, T, T]
    return causal & (tail | in_block)


def qsa_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                  rope: CosSin) -> tuple[jax.Array, Any]:
    """Gated attention of the normed h [B, T, D] over its own keys, each query's cut to its selected ones; this
    step's K/V written to the cache as any attention layer's."""
    B, T, _ = h.shape
    H, KV, K = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q, k, v = project_qkv(h, lw, cfg, rope, cache.layout)
    cache = cache.write(layer, k, v, positions)
    mask = selected_keys(lw, h, rope, cfg.qwen4_exp, cfg.rms_norm_eps)
    q = q.reshape(B, T, KV, H // KV, K).astype(jnp.float32)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k.astype(jnp.float32)) * K**-0.5
    probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores, -jnp.inf), axis=-1)
    attn = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(jnp.float32)).reshape(B, T, H, K).astype(h.dtype)
    attn = attn * output_gate(cfg, linear(h, lw.attn_gate))
    return linear(attn, lw.wo, contract=2), cache
