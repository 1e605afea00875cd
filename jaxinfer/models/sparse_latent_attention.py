"""DeepSeek Sparse Attention (DSA): latent attention over the `index_topk` cached rows the indexer picks per query.

The cache row of a DSA layer is MLA's widened by the token's index key: [c, k_pe, index key] (R + P + I values, the
one KV head's head_dim), so every cache (contiguous, paged, an engine step's ragged view) and everything that
moves pages (prefix caching, preemption, offload, page copies) carries the index keys with the rows unchanged.

Per query token, in blocks of up to `SPARSE_BLOCK` tokens (fewer where the context is long: `block_tokens` keeps a
block's float32 scores, J x S per token, within `SCORE_BUDGET`): the index keys of every position its row's page
table holds are gathered, scored (`lightning_indexer.index_scores`), positions past the query's own masked out, the
top `min(index_topk, S)` kept (`lax.top_k`: ties to the earlier position), and those rows gathered from the pages
(as vLLM's sparse FlashMLA reads them); the absorbed MLA query attends them, the chosen positions past the query's
own (a context shorter than index_topk) masked. Where a query sees at most index_topk tokens it attends them all:
dense MLA. It is XLA gathers and one top_k, lowering on every platform; a Pallas kernel for it is future work.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxinfer.cache.contiguous import KVCache
from jaxinfer.cache.ragged_view import RaggedPagedCache
from jaxinfer.config.model import ModelConfig
from jaxinfer.kernels.precision import matmul_precision
from jaxinfer.models.blocked_attention import NEG_INF
from jaxinfer.models.latent_attention import LatentAttentionLayer, latent_projections, latent_rows, per_head
from jaxinfer.models.layers import linear
from jaxinfer.models.lightning_indexer import IndexerWeights, index_key, index_query, index_scores
from jaxinfer.models.rope import CosSin
from jaxinfer.models.self_attention import KV_HEADS, Q_HEADS

SPARSE_BLOCK = 16  # query tokens scored and attended at once, at most
SCORE_BUDGET = 1 << 24  # float32 index scores a block may hold (64 MiB): DeepSeek-V3.2 at 128k positions, 2 tokens


@dataclasses.dataclass(frozen=True)
class CachedRows:
    """One layer's cached rows as pages, and the page table each query token reads."""

    pool: jax.Array  # [pages, page_size, K] as stored
    tables: jax.Array  # [rows, W] int32 pages of each row
    token_rows: jax.Array  # [N] int32 each query token's row
    from_storage: Callable[[jax.Array], jax.Array]  # stored values -> their float dtype

    @property
    def capacity(self) -> int:
        """Positions a row's table addresses (S)."""
        return self.tables.shape[1] * self.pool.shape[1]

    def gather(self, rows: jax.Array, positions: jax.Array, lo: int, hi: int) -> jax.Array:
        """Columns lo:hi of the rows at positions [n, s] of tokens' rows [n]: [n, s, hi - lo]."""
        page_size = self.pool.shape[1]
        positions = jnp.clip(positions, 0, self.capacity - 1)
        pages = jnp.take_along_axis(self.tables[rows], positions // page_size, axis=1)
        return self.from_storage(self.pool[pages, positions % page_size, lo:hi])


def cached_rows(cache: Any, layer: int, batch: int, steps: int) -> CachedRows:
    """`layer`'s rows of a contiguous cache (each sequence one page), a paged one or an engine step's view."""
    row_of_token = jnp.repeat(jnp.arange(batch, dtype=jnp.int32), steps)
    if isinstance(cache, KVCache):
        if cache.quantized:
            raise ValueError("kv_dtype 'fp8' is not supported with DeepSeek Sparse Attention (an fp8 index-key "
                             "cache is not implemented); use kv_dtype 'auto'")
        return CachedRows(cache.k[layer][:, 0], jnp.arange(batch, dtype=jnp.int32)[:, None], row_of_token,
                          lambda x: x)
    ragged = isinstance(cache, RaggedPagedCache)
    pages, token_rows = (cache.pages, cache.token_rows) if ragged else (cache, row_of_token)
    if pages.quantized:
        raise ValueError("kv_cache_dtype int8/fp8 is not supported with DeepSeek Sparse Attention (quantized index "
                         "keys are not implemented); use kv_cache_dtype 'auto'")
    return CachedRows(pages.k_pages[layer][0], pages.page_table, token_rows, pages.from_storage)


def block_tokens(tokens: int, capacity: int, index_heads: int) -> int:
    """Query tokens per block: SPARSE_BLOCK, fewer where their index scores (heads x capacity each) would pass
    SCORE_BUDGET, at least one."""
    return max(1, min(SPARSE_BLOCK, tokens, SCORE_BUDGET // (capacity * index_heads)))


def attend_selected(
    q: jax.Array, rows: jax.Array, valid: jax.Array, latent: int, scale: float, sinks: jax.Array | None = None,
) -> jax.Array:
    """Absorbed queries q [n, H, C] over their chosen rows [n, k, C] (valid [n, k]): the weighted latents [n, H, R];
    sinks [H] float32: a learned logit per head in each softmax, weighing no row (HY-V4's)."""
    q = q.astype(rows.dtype)
    precision = matmul_precision(q, rows)
    scores = jnp.einsum("nhc,nkc->nhk", q, rows, precision=precision, preferred_element_type=jnp.float32)
    scores = jnp.where(valid[:, None, :], scores * scale, NEG_INF)
    if sinks is None:
        probs = jax.nn.softmax(scores, axis=-1).astype(rows.dtype)
    else:
        sink = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :, None], (*scores.shape[:2], 1))
        probs = jax.nn.softmax(jnp.concatenate([scores, sink], -1), axis=-1)[..., :-1].astype(rows.dtype)
    values = jnp.swapaxes(rows[..., :latent], 1, 2)  # [n, R, k]: the contracted axis last (XLA:CPU's bf16 dot)
    out = jnp.einsum("nhk,nrk->nhr", probs, values, precision=precision, preferred_element_type=jnp.float32)
    return out.astype(q.dtype)


def _choose_block(
    index_q: jax.Array, index_w: jax.Array, positions: jax.Array, token_rows: jax.Array, rows: CachedRows,
    cfg: ModelConfig,
) -> jax.Array:
    """One block of query tokens (index heads [n, J, I] and weights [n, J], positions [n], -1 for padding): index
    scores over each token's row, the positions of the top k [n, k]."""
    mla = cfg.latent_attention
    width, capacity = mla.kv_lora_rank + mla.qk_rope_head_dim, rows.capacity
    every = jnp.broadcast_to(jnp.arange(capacity), (index_q.shape[0], capacity))
    keys = rows.gather(token_rows, every, width, width + mla.indexer.index_head_dim)  # [n, S, I]
    scores = jnp.where(every <= positions[:, None], index_scores(index_q, index_w, keys), -jnp.inf)
    return jax.lax.top_k(scores, min(mla.indexer.index_topk, capacity))[1]


def _attend_block(
    q: jax.Array, chosen: jax.Array, positions: jax.Array, token_rows: jax.Array, rows: CachedRows,
    cfg: ModelConfig, sinks: jax.Array | None,
) -> jax.Array:
    """One block of query tokens (q [n, H, C], chosen positions [n, k]) over those rows: [n, H, R]."""
    mla = cfg.latent_attention
    selected = rows.gather(token_rows, chosen, 0, mla.kv_lora_rank + mla.qk_rope_head_dim)  # [n, k, R + P]
    return attend_selected(q, selected, chosen <= positions[:, None], mla.kv_lora_rank, cfg.attn_scale, sinks)


def _blocked(
    fn: Callable[..., jax.Array], tensors: tuple[jax.Array, ...], cache: Any, layer: int, positions: jax.Array,
    cfg: ModelConfig,
) -> jax.Array:
    """fn(*per-token tensors, positions, token rows, rows) over blocks of query tokens: [B, T, ...]."""
    batch, steps = positions.shape
    rows = cached_rows(cache, layer, batch, steps)
    tokens = batch * steps
    block = block_tokens(tokens, rows.capacity, cfg.latent_attention.indexer.index_n_heads)
    num_blocks = -(-tokens // block)

    def blocks(x: jax.Array, fill: int = 0) -> jax.Array:
        x = x.reshape(tokens, *x.shape[2:])
        x = jnp.pad(x, [(0, num_blocks * block - tokens)] + [(0, 0)] * (x.ndim - 1), constant_values=fill)
        return x.reshape(num_blocks, block, *x.shape[1:])

    token_rows = rows.token_rows.reshape(batch, steps)
    parts = (*(blocks(x) for x in tensors), blocks(positions, -1), blocks(token_rows))
    out = jax.lax.map(lambda part: fn(*part, rows), parts)
    return out.reshape(num_blocks * block, *out.shape[2:])[:tokens].reshape(batch, steps, *out.shape[2:])


def sparse_choice(
    index_q: jax.Array, index_w: jax.Array, cache: Any, layer: int, positions: jax.Array, cfg: ModelConfig,
) -> jax.Array:
    """The cached positions [B, T, k] each query reads: the top k by index heads [B, T, J, I] and weights
    [B, T, J] over the layer's index keys (written this step too); positions past a query's own where k > its
    context (masked when attended)."""
    return _blocked(lambda *part: _choose_block(*part, cfg), (index_q, index_w), cache, layer, positions, cfg)


def attend_chosen(
    q: jax.Array, chosen: jax.Array, cache: Any, layer: int, positions: jax.Array, cfg: ModelConfig,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """q [B, T, H, C] (C = R + P) over the rows at the chosen positions [B, T, k] of the cache (this step's rows
    written): each head's weighted latents [B, T, H, R]."""
    return _blocked(lambda *part: _attend_block(*part, cfg, sinks), (q, chosen), cache, layer, positions, cfg)


def sparse_attend(
    q: jax.Array, index_q: jax.Array, index_w: jax.Array, cache: Any, layer: int, positions: jax.Array,
    cfg: ModelConfig,
) -> jax.Array:
    """q [B, T, H, C] (C = R + P), index heads [B, T, J, I] and weights [B, T, J] at positions [B, T] over the
    cache after this step's rows were written: each head's weighted latents [B, T, H, R]."""
    chosen = sparse_choice(index_q, index_w, cache, layer, positions, cfg)
    return attend_chosen(q, chosen, cache, layer, positions, cfg)


def sparse_latent_attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin,
) -> tuple[jax.Array, Any]:
    """`latent_attention` of a DSA layer (lw: `LatentAttentionLayer` and `IndexerWeights`): the row cached with
    its index key, the query attending its top-k rows only: [B, T, D]."""
    assert isinstance(lw, LatentAttentionLayer) and isinstance(lw, IndexerWeights)
    q_low, q, kv = latent_projections(h, lw, cfg)
    heads, written = sparse_latent_heads(cfg, h, cache, lw, layer, positions, rope, (q_low, q, kv))
    return linear(cache.layout.constrain(heads, Q_HEADS), lw.wo, contract=2), written


def sparse_latent_heads(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: CosSin,
    projected: tuple[jax.Array, jax.Array, jax.Array],
) -> tuple[jax.Array, Any]:
    """A DSA layer after its projections (q_low [B, T, Q], q [B, T, H, N + P], kv [B, T, R + P]): the row cached
    with its index key, the query attending its top-k rows: each head's values [B, T, H, V] before o_proj (A.X-K2
    gates them there), and the cache with this step's rows."""
    layout, indexer = cache.layout, cfg.latent_attention.indexer
    q_low, q, kv = projected
    q_nope, q_pe, row = latent_rows(q, kv, lw, cfg, rope)
    row = layout.constrain(jnp.concatenate([row, index_key(h, lw, indexer, rope).astype(row.dtype)], -1), KV_HEADS)
    cache = cache.write(layer, row, row, positions)
    q_latent = per_head(layout.constrain(q_nope, Q_HEADS), lw.w_uk, "bthn,hrn->bthr")
    index_q, index_w = index_query(h, q_low, lw, indexer, rope)
    weighted = sparse_attend(jnp.concatenate([q_latent, q_pe], -1), index_q, index_w, cache, layer, positions, cfg)
    return per_head(weighted, lw.w_uv, "bthr,hvr->bthv"), cache
