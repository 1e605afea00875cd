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
every block its sequence's pages can hold (masked past its own): the cost grows with max_seq_len, not its length;
queries go in blocks (`sparse_latent_attention.block_tokens`) so the index keys gathered at once stay bounded.
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
from jaxinfer.models.sparse_latent_attention import block_tokens
from jaxinfer.models.token_rows import TokenRows, layer_rows, write_rows


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


def index_queries(lw: Any, h: jax.Array, rope: CosSin, cfg: ModelConfig) -> jax.Array:
    """The index heads of the normed h [B, T, D]: [B, T, Hi, I], normed and rotated at each token's position."""
    B, T, _ = h.shape
    Hi, I = cfg.qwen4_exp.indexer_heads, cfg.qwen4_exp.indexer_dim
    q = rms_norm(linear(h, lw.index_qk)[..., :Hi * I].reshape(B, T, Hi, I), lw.index_q_norm, cfg.rms_norm_eps, 1.0)
    return apply_rope(q, *rope)


def selected_positions(lw: Any, index_q: jax.Array, rows: TokenRows, token_rows: jax.Array, positions: jax.Array,
                       cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """The positions each of n tokens (index heads [n, Hi, I], its sequence's row, its position) attends to [n, M]
    and which are real [n, M]: its kept blocks' tokens, then those after its last complete block up to itself."""
    fields = cfg.qwen4_exp
    n, I, r = index_q.shape[0], fields.indexer_dim, fields.indexer_block
    span = rows.capacity // r * r  # every block the sequence's pages can hold
    raw = rows.gather(token_rows, jnp.broadcast_to(jnp.arange(span, dtype=jnp.int32), (n, span)),
                      rows.width - I, rows.width)
    keys = block_keys(raw, lw.index_k_norm, cfg, cfg.rms_norm_eps)
    dots = jnp.einsum("nhi,nbi->nhb", index_q.astype(jnp.float32), keys.astype(jnp.float32))
    complete = (positions + 1) // r  # blocks each token sees whole
    keep = min(fields.indexer_budget // r, span // r)
    top, whole = chosen_blocks(jnp.sum(jax.nn.relu(dots), axis=1) / math.sqrt(I), complete, keep)
    in_blocks = (top[:, :, None] * r + jnp.arange(r)).reshape(n, -1)
    tail = (complete * r)[:, None] + jnp.arange(r - 1)
    chosen = jnp.concatenate([in_blocks, tail], axis=1)
    real = jnp.concatenate([jnp.repeat(whole, r, axis=1), tail <= positions[:, None]], axis=1)
    return chosen, real


def attend_block(lw: Any, q: jax.Array, index_q: jax.Array, positions: jax.Array, token_rows: jax.Array,
                 rows: TokenRows, cfg: ModelConfig) -> jax.Array:
    """n query tokens (q [n, KV, G, K], index heads [n, Hi, I], positions [n], -1 padding, their rows [n]) over
    their selected positions' keys and values: [n, KV, G, K] float32."""
    n, KV, _, K = q.shape
    chosen, real = selected_positions(lw, index_q, rows, token_rows, positions, cfg)
    keys = rows.gather(token_rows, chosen, 0, KV * K).reshape(n, -1, KV, K).astype(jnp.float32)
    values = rows.gather(token_rows, chosen, KV * K, 2 * KV * K).reshape(n, -1, KV, K).astype(jnp.float32)
    scores = jnp.einsum("nkgd,nmkd->nkgm", q.astype(jnp.float32), keys) * K**-0.5
    probs = jax.nn.softmax(jnp.where(real[:, None, None], scores, NEG_INF), axis=-1)
    return jnp.einsum("nkgm,nmkd->nkgd", probs, values)


def qsa_attention(cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                  rope: CosSin) -> tuple[jax.Array, Any]:
    """Gated attention of the normed h [B, T, D], each query over its selected positions; the layer's rows
    [keys | values | raw index key] written to the cache first, then read back (this step's and earlier), the
    queries taken in blocks (DeepSeek-V3.2's `block_tokens`) so a block's gathered index keys stay bounded."""
    B, T, _ = h.shape
    fields = cfg.qwen4_exp
    q, k, v = project_qkv(h, lw, cfg, rope, cache.layout)
    (H, K), KV, N = q.shape[2:], k.shape[2], B * T  # not cfg's: a one-layer view's are its row's (token_rows)
    index_raw = linear(h, lw.index_qk)[..., fields.indexer_heads * fields.indexer_dim:]
    row = jnp.concatenate([k.reshape(B, T, -1), v.reshape(B, T, -1), index_raw], -1)
    cache = write_rows(cache, layer, row, positions)
    rows = layer_rows(cache, layer, B, T, row.shape[-1])
    block = block_tokens(N, rows.capacity, fields.indexer_dim)  # a block's raw index keys: block x capacity x I
    count = -(-N // block)

    def blocks(x: jax.Array, fill: int = 0) -> jax.Array:
        x = jnp.pad(x.reshape(N, *x.shape[2:]), [(0, count * block - N)] + [(0, 0)] * (x.ndim - 2),
                    constant_values=fill)
        return x.reshape(count, block, *x.shape[1:])

    parts = (blocks(q.reshape(B, T, KV, H // KV, K)), blocks(index_queries(lw, h, rope, cfg)),
             blocks(positions, -1), blocks(rows.token_rows.reshape(B, T)))
    out = jax.lax.map(lambda part: attend_block(lw, *part, rows, cfg), parts)
    attn = out.reshape(count * block, H, K)[:N].reshape(B, T, H, K).astype(h.dtype)
    attn = attn * output_gate(cfg, linear(h, lw.attn_gate))
    return linear(attn, lw.wo, contract=2), cache
