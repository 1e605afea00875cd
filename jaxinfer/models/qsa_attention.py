"""Qwen4-Exp's QSA attention (transformers' `Qwen4ExpTextQSAIndexer` and `Qwen4ExpTextAttention`): Qwen3.5's gated
attention, each query seeing only the key blocks its indexer scores highest.

The keys are cut into blocks of `indexer_block` tokens from position 0. A block's index key is the mean of its
tokens' raw index keys, RMS-normed and rotated at the block's first position; a query's index heads (normed and
rotated at its own position) score each complete block it sees as the sum over heads of relu(q . key) over
sqrt(dim). Each query attends to the tokens of its top `indexer_budget / indexer_block` blocks and to every token
after its last complete block (itself included). DeepSeek-V3.2's indexer (models/lightning_indexer) scores single
tokens instead, and weights its heads.

Each token's keys, values and raw index key are one row of the layer's K pages (models/token_rows), written first
and read back at the positions a query needs, so whole sequences and engine steps run alike. Each query scores
every block its sequence's pages can hold (masked past its own): the cost grows with max_seq_len, not its length.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.blocked_attention import NEG_INF
from jaxinfer.models.layers import linear
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, RopeTables, apply_rope
from jaxinfer.models.self_attention import output_gate, project_qkv
from jaxinfer.models.token_rows import layer_rows, read_back, write_rows


def block_keys(raw: jax.Array, norm: jax.Array, cfg: ModelConfig, eps: float) -> jax.Array:
    """Raw index keys of a sequence's positions [N, P, I] (P a multiple of the block) -> each block's key
    [N, P / block, I]: the mean, normed, rotated at the block's first position."""
    N, P, I = raw.shape
    block = cfg.qwen4_exp.indexer_block
    pooled = jnp.mean(raw.reshape(N, P // block, block, I).astype(jnp.float32), axis=2).astype(raw.dtype)
    pooled = rms_norm(pooled, norm, eps, 1.0)
    starts = jnp.arange(0, P, block, dtype=jnp.int32)[None]
    return apply_rope(pooled[:, :, None], *RopeTables(starts, cfg).for_layer(0))[:, :, 0]


def chosen_blocks(scores: jax.Array, complete: jax.Array, keep: int) -> tuple[jax.Array, jax.Array]:
    """scores [N, B] of each token's blocks, complete [N] the blocks it sees whole -> its `keep` best-scored
    blocks [N, keep] and which of them are complete ones [N, keep] (all of them where it has fewer)."""
    seen = jnp.arange(scores.shape[-1]) < complete[:, None]
    top = jax.lax.top_k(jnp.where(seen, scores, -jnp.inf), keep)[1]
    return top, top < complete[:, None]


def selected_positions(lw: Any, h: jax.Array, index_raw: jax.Array, positions: jax.Array, rope: CosSin,
                       cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """The positions each of the N flat tokens attends to [N, M] and which are real [N, M]: its kept blocks'
    tokens, then those after its last complete block up to itself. h [N, D] normed; index_raw [N, P, I] the raw
    index keys of its sequence's positions."""
    fields, eps = cfg.qwen4_exp, cfg.rms_norm_eps
    N, Hi, I, r = h.shape[0], fields.indexer_heads, fields.indexer_dim, fields.indexer_block
    keep = min(fields.indexer_budget // r, index_raw.shape[1] // r)
    q = rms_norm(linear(h, lw.index_qk)[:, :Hi * I].reshape(N, 1, Hi, I), lw.index_q_norm, eps, 1.0)
    q = apply_rope(q, *(t.reshape(N, 1, -1) for t in rope))[:, 0]
    keys = block_keys(index_raw, lw.index_k_norm, cfg, eps)
    dots = jnp.einsum("nhi,nbi->nhb", q.astype(jnp.float32), keys.astype(jnp.float32))
    complete = (positions + 1) // r  # blocks each token sees whole
    top, whole = chosen_blocks(jnp.sum(jax.nn.relu(dots), axis=1) / math.sqrt(I), complete, keep)
    in_blocks = (top[:, :, None] * r + jnp.arange(r)).reshape(N, -1)
    tail = (complete * r)[:, None] + jnp.arange(r - 1)
    chosen = jnp.concatenate([in_blocks, tail], axis=1)
    real = jnp.concatenate([jnp.repeat(whole, r, axis=1), tail <= positions[:, None]], axis=1)
    return chosen, real


def qsa_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                  rope: CosSin) -> tuple[jax.Array, Any]:
    """Gated attention of the normed h [B, T, D], each query over its selected positions; the layer's rows
    [keys | values | raw index key] written to the cache first, then read back (this step's and earlier)."""
    B, T, D = h.shape
    fields = cfg.qwen4_exp
    q, k, v = project_qkv(h, lw, cfg, rope, cache.layout)
    (H, K), KV, N = q.shape[2:], k.shape[2], B * T  # not cfg's: a one-layer view's are its row's (token_rows)
    index_raw = linear(h, lw.index_qk)[..., fields.indexer_heads * fields.indexer_dim:]
    cache = write_rows(cache, layer, jnp.concatenate([k.reshape(B, T, -1), v.reshape(B, T, -1), index_raw], -1),
                       positions)
    rows = layer_rows(cache, layer, B, T)
    flat = positions.reshape(N)
    span = rows.capacity // fields.indexer_block * fields.indexer_block
    every = jnp.broadcast_to(jnp.arange(span, dtype=jnp.int32), (N, span))
    chosen, real = selected_positions(lw, h.reshape(N, D), read_back(rows, every, 2 * KV * K, rows.pool.shape[-1]),
                                      flat, rope, cfg)
    keys = read_back(rows, chosen, 0, KV * K).reshape(N, -1, KV, K).astype(jnp.float32)
    values = read_back(rows, chosen, KV * K, 2 * KV * K).reshape(N, -1, KV, K).astype(jnp.float32)
    grouped = q.reshape(N, KV, H // KV, K).astype(jnp.float32)
    scores = jnp.einsum("nkgd,nmkd->nkgm", grouped, keys) * K**-0.5
    probs = jax.nn.softmax(jnp.where(real[:, None, None], scores, NEG_INF), axis=-1)
    attn = jnp.einsum("nkgm,nmkd->nkgd", probs, values).reshape(B, T, H, K).astype(h.dtype)
    attn = attn * output_gate(cfg, linear(h, lw.attn_gate))
    return linear(attn, lw.wo, contract=2), cache
