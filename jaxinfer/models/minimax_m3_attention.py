"""MiniMax-M3's sparse attention (transformers' `MiniMaxM3VLIndexer` and `MiniMaxM3VLAttention` on its
`minimax_m3_sparse` layers): each K/V head's queries attend only the key blocks its index head scores highest.

Each token's index key is RMS-normed (Gemma's 1 + w) and rotated at its own position like the attention's keys;
each query's `heads` index heads alike. Index head j scores every earlier key by q_j . k (float32, unscaled); the
scores are max-pooled over blocks of `block` keys from position 0; the query's own block and the `local_blocks` - 1
before it are always kept; of the rest the best, up to `top_blocks` blocks in all. Query heads of K/V group j
attend the tokens of index head j's blocks up to their own position (transformers' block mask, each of the
`heads` choices spread over heads / index heads query heads: one per K/V group, as this module requires).
Qwen4-Exp's QSA (models/qsa_attention) picks blocks alike but pools the keys, and shares one choice across heads.

Each token's keys, values and rotated index key are one row of the layer's K pages (models/token_rows), written
first and read back at the positions a query needs, so whole sequences and engine steps run one code path; each
query scores every position its sequence's pages can hold (masked past its own): the cost grows with max_seq_len.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxinfer.config.minimax_m3 import BlockIndexer
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.blocked_attention import NEG_INF
from jaxinfer.models.layers import linear
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import CosSin, apply_rope
from jaxinfer.models.self_attention import project_qkv
from jaxinfer.models.sparse_latent_attention import block_tokens
from jaxinfer.models.token_rows import TokenRows, layer_rows, write_rows


def index_projections(lw: Any, h: jax.Array, rope: CosSin, cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """The index queries [B, T, J, I] and keys [B, T, I] of the normed h [B, T, D]: normed, then rotated (the
    leading rotary dims, as the attention's heads)."""
    B, T, _ = h.shape
    idx = cfg.block_indexer
    q = rms_norm(linear(h, lw.index_wq).reshape(B, T, idx.heads, idx.dim), lw.index_q_norm, cfg.rms_norm_eps, 1.0)
    k = rms_norm(linear(h, lw.index_wk)[:, :, None], lw.index_k_norm, cfg.rms_norm_eps, 1.0)
    return apply_rope(q, *rope), apply_rope(k, *rope)[:, :, 0]


def chosen_blocks(scores: jax.Array, positions: jax.Array, idx: BlockIndexer) -> tuple[jax.Array, jax.Array]:
    """scores [n, J, S] of each token's keys (past its position -inf) -> each index head's chosen blocks [n, J, k]
    and which hold a seen key [n, J, k]: the local blocks first (boosted to +inf, as transformers does), then
    the best by their highest key's score."""
    n, J, S = scores.shape
    pooled = jnp.max(scores.reshape(n, J, S // idx.block, idx.block), axis=-1)
    index = jnp.arange(pooled.shape[-1])[None]
    own = (jnp.maximum(positions, 0) // idx.block)[:, None]
    local = (index <= own) & (index > own - idx.local_blocks)
    pooled = jnp.where(local[:, None], jnp.inf, pooled)
    best, top = jax.lax.top_k(pooled, min(idx.top_blocks, pooled.shape[-1]))
    return top, best > -jnp.inf


def selected_positions(index_q: jax.Array, rows: TokenRows, token_rows: jax.Array, positions: jax.Array,
                       idx: BlockIndexer) -> tuple[jax.Array, jax.Array]:
    """The positions each of n tokens' index heads (index_q [n, J, I]) choose [n, J, M] and which are seen [n, J, M]:
    their chosen blocks' tokens up to the token's own position."""
    n, r = index_q.shape[0], idx.block
    span = rows.capacity // r * r  # every block the sequence's pages can hold
    keys = rows.gather(token_rows, jnp.broadcast_to(jnp.arange(span, dtype=jnp.int32), (n, span)),
                       rows.width - idx.dim, rows.width)
    scores = jnp.einsum("nji,nsi->njs", index_q.astype(jnp.float32), keys.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)
    scores = jnp.where(jnp.arange(span)[None, None] > positions[:, None, None], -jnp.inf, scores)
    top, kept = chosen_blocks(scores, positions, idx)
    chosen = (top[..., None] * r + jnp.arange(r)).reshape(n, idx.heads, -1)
    seen = jnp.repeat(kept, r, axis=-1) & (chosen <= positions[:, None, None])
    return chosen, seen


def attend_block(q: jax.Array, index_q: jax.Array, positions: jax.Array, token_rows: jax.Array, rows: TokenRows,
                 idx: BlockIndexer) -> jax.Array:
    """n query tokens (q [n, KV, G, K], index heads [n, KV, I], positions [n], -1 padding, their rows [n]) over
    their K/V heads' chosen positions: [n, KV, G, K] float32."""
    n, KV, _, K = q.shape
    chosen, seen = selected_positions(index_q, rows, token_rows, positions, idx)
    keys = jnp.stack([rows.gather(token_rows, chosen[:, j], j * K, (j + 1) * K) for j in range(KV)], 1)
    values = jnp.stack([rows.gather(token_rows, chosen[:, j], (KV + j) * K, (KV + j + 1) * K) for j in range(KV)], 1)
    scores = jnp.einsum("nkgd,nkmd->nkgm", q.astype(jnp.float32), keys.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) * K**-0.5
    probs = jax.nn.softmax(jnp.where(seen[:, :, None], scores, NEG_INF), axis=-1)
    return jnp.einsum("nkgm,nkmd->nkgd", probs, values.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)


def block_sparse_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                           rope: CosSin) -> tuple[jax.Array, Any]:
    """Attention of the normed h [B, T, D], each K/V head's queries over its chosen blocks; the layer's rows
    [keys | values | index key] written to the cache first, then read back (this step's and earlier), the queries
    taken in blocks (DeepSeek-V3.2's `block_tokens`) so a block's gathered index keys stay bounded."""
    B, T, _ = h.shape
    q, k, v = project_qkv(h, lw, cfg, rope, cache.layout)
    (H, K), KV, N = q.shape[2:], k.shape[2], B * T  # not cfg's: a one-layer view's are its row's (token_rows)
    index_q, index_k = index_projections(lw, h, rope, cfg)
    row = jnp.concatenate([k.reshape(B, T, -1), v.reshape(B, T, -1), index_k.astype(k.dtype)], -1)
    cache = write_rows(cache, layer, row, positions)
    rows = layer_rows(cache, layer, B, T, row.shape[-1])
    block = block_tokens(N, rows.capacity, max(cfg.block_indexer.dim, cfg.block_indexer.heads))
    count = -(-N // block)

    def blocks(x: jax.Array, fill: int = 0) -> jax.Array:
        x = jnp.pad(x.reshape(N, *x.shape[2:]), [(0, count * block - N)] + [(0, 0)] * (x.ndim - 2),
                    constant_values=fill)
        return x.reshape(count, block, *x.shape[1:])

    parts = (blocks(q.reshape(B, T, KV, H // KV, K)), blocks(index_q), blocks(positions, -1),
             blocks(rows.token_rows.reshape(B, T)))
    out = jax.lax.map(lambda part: attend_block(*part, rows, cfg.block_indexer), parts)
    attn = out.reshape(count * block, H, K)[:N].reshape(B, T, H, K).astype(h.dtype)
    return linear(attn, lw.wo, contract=2), cache
